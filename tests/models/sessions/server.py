"""A stateful model for sessions (a `cmd:` server): counts the turns of each session it
is told of (X-Amzn-SageMaker-Session-Id), and closes one when asked to."""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TURNS: dict[str, int] = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: bytes, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._reply(200 if self.path == "/ping" else 404, b"", {})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        session = self.headers.get("X-Amzn-SageMaker-Session-Id")
        extra: dict[str, str] = {}
        if session:
            TURNS[session] = TURNS.get(session, 0) + 1
            if body == b"close":
                extra["X-Amzn-SageMaker-Closed-Session-Id"] = session
        answer = {"session": session, "turn": TURNS.get(session or "", 0), "pid": os.getpid()}
        self._reply(200, json.dumps(answer).encode(), extra)

    def log_message(self, format: str, *args: object) -> None:
        pass


ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler
).serve_forever()
