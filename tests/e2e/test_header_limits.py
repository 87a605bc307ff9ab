"""Request heads are limited while they arrive: count, size and time."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from tests.conftest import GatewayProcess, start_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    gw = start_gateway(
        tmp_path_factory.mktemp("heads") / "home", extra_env={"SHIPYARD_HEAD_TIMEOUT_S": "1"}
    )
    try:
        yield gw
    finally:
        gw.stop()


def connect(gw: GatewayProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])), timeout=15)


def rss_kib(gw: GatewayProcess) -> int:
    for line in open(f"/proc/{gw.process.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_and_read(gw: GatewayProcess, data: bytes) -> bytes:
    with connect(gw) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # closed on us once refused: the answer is already there
        return s.recv(65536)


def test_twenty_thousand_headers_are_refused(gw: GatewayProcess) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 20_000 + b"\r\n"
    assert send_and_read(gw, head).startswith(b"HTTP/1.1 431")
    assert gw.get("/healthz")[0] == 200


def test_one_32_mb_header_is_refused_without_being_buffered(gw: GatewayProcess) -> None:
    before = rss_kib(gw)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (32 << 20) + b"\r\n\r\n"
    assert send_and_read(gw, head).startswith(b"HTTP/1.1 431")
    assert rss_kib(gw) - before < 16 * 1024  # far less than the 32 MB sent
    assert gw.get("/healthz")[0] == 200


@pytest.mark.parametrize("first", [True, False], ids=["first-request", "after-another"])
def test_a_head_over_the_limits_in_one_read_is_refused_431(gw: GatewayProcess, first: bool) -> None:
    """A whole head sent in one write, as most clients send a small one, is held to the
    same limits as one that spans many reads: on a connection's first request (which has
    no request of uvicorn's before it) as on a later one."""
    many = b"X-A: b\r\n" * 101
    wide = (b"X-Big: " + b"a" * 30_000 + b"\r\n") * 3  # each header under, together over
    heads = [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + wide + b"\r\n",
        b"GET /healthz?" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        + many
        + b"\r\n{}",
    ]
    for head in heads:
        with connect(gw) as s:
            if not first:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert _response(s).startswith(b"HTTP/1.1 200")
            s.sendall(head)
            answer = _response(s)
        assert answer.startswith(b"HTTP/1.1 431"), (head[:60], answer)
    under = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 99 + b"\r\n"
    with connect(gw) as s:  # at the limit: served
        s.sendall(under)
        assert _response(s).startswith(b"HTTP/1.1 200")


def test_a_head_that_trickles_is_cut_off_while_others_are_served(gw: GatewayProcess) -> None:
    with connect(gw) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        answer = b""
        for _ in range(100):  # one header byte every 50 ms, far beyond the 1 s allowed
            assert gw.get("/healthz")[0] == 200
            try:
                slow.sendall(b"X")
            except OSError:
                break
            time.sleep(0.05)
        answer = slow.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408")


def test_bytes_that_begin_no_head_and_a_head_begun_behind_a_request_are_cut_off_too(
    gw: GatewayProcess,
) -> None:
    with connect(gw) as blank:  # line ends before any request line, forever
        for _ in range(100):
            try:
                blank.sendall(b"\r\n")
            except OSError:
                break
            time.sleep(0.05)
        assert blank.recv(65536).startswith(b"HTTP/1.1 408")
    with connect(gw) as pipelined:  # a whole request, and the start of one that stalls
        pipelined.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n")
        assert _response(pipelined).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        rest = b""
        while True:  # the head timer of the second, not the 20 s idle timeout, ends it
            chunk = pipelined.recv(65536)
            if not chunk:
                break
            rest += chunk
        assert rest.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 10


def _response(s: socket.socket) -> bytes:
    """One whole response: head and body may arrive in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, data
        body += chunk
    return head


def test_ordinary_requests_and_keep_alive_still_work(gw: GatewayProcess) -> None:
    with connect(gw) as s:
        for _ in range(3):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _response(s).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # idle between requests longer than the head timeout: not cut
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(s).startswith(b"HTTP/1.1 200")
