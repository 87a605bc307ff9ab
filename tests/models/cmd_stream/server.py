"""A user's own container-contract server (a `cmd:` image) that streams by answering
/invocations chunked (the gateway relays each chunk as a response-stream part): the
request (JSON) names "chunks", "gap_s" between them, and "break_after" to drop the
connection after that many chunks."""

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ping" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Amzn-SageMaker-Custom-Attributes", "from=cmd")
        self.end_headers()
        for n in range(int(request.get("chunks", 3))):
            if n:
                time.sleep(float(request.get("gap_s", 0)))
            if n == request.get("break_after"):
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            data = f"part {n};".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler
).serve_forever()
