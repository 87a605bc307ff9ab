"""A user's own container-contract server for batch transform: it asks for its batch
settings at GET /execution-parameters, and answers each line of a request with what it
knows: the request's line count and the SAGEMAKER_* batch variables it was started with.
With BATCH_SERVER_IGNORES_SIGTERM set it ignores SIGTERM: only SIGKILL stops it."""

import json
import os
import signal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PARAMETERS = {"MaxConcurrentTransforms": 2, "BatchStrategy": "MultiRecord", "MaxPayloadInMB": 1}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ping":
            self._reply(200, b"")
        elif self.path == "/execution-parameters":
            self._reply(200, json.dumps(PARAMETERS).encode())
        else:
            self._reply(404, b"")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        lines = body.decode().splitlines()
        seen = {k: v for k, v in os.environ.items() if k.startswith("SAGEMAKER_")}
        answer = json.dumps({"lines": len(lines), "env": seen})
        self._reply(200, "\n".join([answer] * len(lines)).encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


if os.environ.get("BATCH_SERVER_IGNORES_SIGTERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler
).serve_forever()
