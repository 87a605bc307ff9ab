"""A container-contract server (for `cmd:` images) that handles requests concurrently and
reports how many it ever had in flight at once, so tests can see the gateway's cap.

The body is JSON: ``{"sleep": seconds, "fail": bool}``; the answer echoes the body's size
and ``max_in_flight`` so far. ``GET /stats`` answers ``{"max_in_flight": n, "served": n}``.
"""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
state = {"in_flight": 0, "max_in_flight": 0, "served": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/stats":
            with lock:
                self._reply(200, json.dumps(state).encode())
            return
        self._reply(200 if self.path == "/ping" else 404, b"")

    def do_POST(self) -> None:
        remaining = int(self.headers.get("Content-Length", 0))
        size = 0
        first = b""
        while remaining:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                break
            if not first:
                first = chunk[:4096]
            size += len(chunk)
            remaining -= len(chunk)
        try:
            request = json.loads(first) if size <= 4096 else {}
        except ValueError:
            request = {}
        with lock:
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            time.sleep(float(request.get("sleep", 0)))
        finally:
            with lock:
                state["in_flight"] -= 1
                state["served"] += 1
                seen = state["max_in_flight"]
        if request.get("fail"):
            self._reply(500, b"the model refused this input")
            return
        answer = {"bytes": size, "max_in_flight": seen, "pid": os.getpid()}
        self._reply(200, json.dumps(answer).encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler)
server.daemon_threads = True
server.serve_forever()
