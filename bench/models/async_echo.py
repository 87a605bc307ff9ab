"""A container-contract server (a `cmd:` image) that streams each request body back.

Threads serve requests concurrently; bodies are copied 1 MB at a time, so a 200 MB
request costs the server little memory either.
"""

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ping" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        remaining = int(self.headers.get("Content-Length", 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(remaining))
        self.end_headers()
        while remaining:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                break
            self.wfile.write(chunk)
            remaining -= len(chunk)

    def log_message(self, format: str, *args: object) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler)
server.daemon_threads = True
server.serve_forever()
