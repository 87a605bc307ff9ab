"""A user's own container-contract server (for `cmd:` images): answers with the request
headers it received, so tests can see what the gateway passes through."""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._reply(200 if self.path == "/ping" else 404, b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        answer = {
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body_bytes": len(body),
            "model_dir": os.environ.get("SM_MODEL_DIR"),
        }
        attrs = self.headers.get("X-Amzn-SageMaker-Custom-Attributes")
        extra = {"X-Amzn-SageMaker-Custom-Attributes": f"seen={attrs}"} if attrs else None
        self._reply(200, json.dumps(answer).encode(), extra)

    def log_message(self, format: str, *args: object) -> None:
        pass


ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler
).serve_forever()
