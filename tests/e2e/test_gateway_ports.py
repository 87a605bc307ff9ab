"""The test harness's gateways: one whose free port was taken meanwhile is never confused
with the process that took it (tests/conftest.py ``start_gateway``)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

import tests.conftest as harness


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    """A squatter that answers 200 to any GET, /healthz included."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_gateway_whose_port_was_taken_starts_again_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    ports = [taken]
    free = harness.free_port
    monkeypatch.setattr(harness, "free_port", lambda: ports.pop() if ports else free())
    try:
        gw = harness.start_gateway(tmp_path / "home")
        try:
            assert gw.url != f"http://127.0.0.1:{taken}"
            assert gw.process.poll() is None
            # The gateway answers, not the squatter: a SageMaker call reaches its store.
            assert gw.sm.list_endpoints()["Endpoints"] == []
            lost = (tmp_path / "home" / f"gateway-{taken}.log").read_text()
            assert "address already in use" in lost.lower()
        finally:
            gw.stop()
    finally:
        squatter.shutdown()
        squatter.server_close()
