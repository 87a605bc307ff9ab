"""``POST /inference`` against hostile bodies: never a 500, never a huge answer."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from tests.conftest import GatewayProcess, start_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    gw = start_gateway(tmp_path_factory.mktemp("facade") / "home")
    try:
        yield gw
    finally:
        gw.stop()


def post(gw: GatewayProcess, body: bytes, *, chunked: bool = False) -> tuple[int, bytes]:
    port = int(gw.url.rsplit(":", 1)[1])
    head = b"POST /inference HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    if chunked:
        request = head + b"Transfer-Encoding: chunked\r\n\r\n"
        request += f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    else:
        request = head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(request)
        except OSError:
            pass  # refused before the whole body went out: read the answer anyway
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head_end = data.index(b"\r\n\r\n")
    return int(data.split(b" ", 2)[1]), data[head_end + 4 :]


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_deeply_nested_json_is_a_501_not_a_500(gw: GatewayProcess) -> None:
    status, body = post(gw, b"[" * 5000 + b"]" * 5000)
    assert status == 501
    assert json.loads(body)["status"] == 501
    status, body = post(gw, b'{"type": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert status == 501


def test_a_big_body_is_refused_unread(gw: GatewayProcess) -> None:
    big = b'{"type": "' + b"x" * (2 << 20) + b'"}'
    status, body = post(gw, big)
    assert status == 413
    assert json.loads(body)["status"] == 413
    status, _ = post(gw, big, chunked=True)
    assert status == 413


def test_a_long_type_is_not_echoed_back_whole(gw: GatewayProcess) -> None:
    status, body = post(gw, json.dumps({"type": "t" * 60_000}).encode())
    assert status == 510
    answer = json.loads(body)
    assert answer["status"] == 510
    assert len(answer["errMsg"]) < 300
    assert "Traceback" not in gw.log()
