"""A `cmd:` server written for SageMaker's stateful sessions, as a container on AWS would
be: on ``X-Amzn-SageMaker-Session-Id: NEW_SESSION`` it creates the session itself (its own
id, ``sess-<uuid>``, and expiry: the body's ``{"ttl": seconds}``, else ten minutes, may be
negative; a hostile model's are the body's ``{"id": ..., "expires": ...}``) and answers
``X-Amzn-SageMaker-New-Session-Id: <id>; Expires=<time>``; it keeps each session's turns;
a body ``close`` ends the request's session (``X-Amzn-SageMaker-Closed-Session-Id``). An
id it does not hold is its 400."""

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TURNS: dict[str, list[bytes]] = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, answer: object, extra: dict[str, str]) -> None:
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._reply(200 if self.path == "/ping" else 404, {}, {})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        session = self.headers.get("X-Amzn-SageMaker-Session-Id")
        pid = os.getpid()
        if session is None:
            self._reply(200, {"pid": pid}, {})
        elif session == "NEW_SESSION":
            asked = json.loads(body) if body.startswith(b"{") else {}
            new = asked.get("id", f"sess-{uuid.uuid4()}")
            TURNS[new] = []
            at = datetime.now(UTC) + timedelta(seconds=asked.get("ttl", 600))
            expires = asked.get("expires", at.strftime("%Y-%m-%dT%H:%M:%SZ"))
            header = f"{new}; Expires={expires}"
            self._reply(
                200, {"pid": pid, "opened": new}, {"X-Amzn-SageMaker-New-Session-Id": header}
            )
        elif session not in TURNS:
            self._reply(400, {"error": f"no session {session}"}, {})
        else:
            TURNS[session].append(body)
            answer = {"pid": pid, "session": session, "turns": len(TURNS[session])}
            extra = {}
            if body == b"close":
                del TURNS[session]
                extra["X-Amzn-SageMaker-Closed-Session-Id"] = session
            self._reply(200, answer, extra)

    def log_message(self, format: str, *args: object) -> None:
        pass


ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler
).serve_forever()
