"""Requests that ask to switch protocols (``Connection: upgrade`` with ``Upgrade``), and
bodies framed under other transfer codings.

The gateway switches to none: such a request is served as plain HTTP/1.1, body and all,
and the connection stays HTTP/1.1 (RFC 9110 7.8 lets a server ignore ``Upgrade``).
``curl --http2`` against an ``http://`` URL asks for h2c this way on every request, and
its POST body once reached the model empty. A CONNECT is answered and the connection
closed, and so is a body under a transfer coding besides chunked (501: it once reached
the model de-chunked and still compressed). Real gateway, a real echo instance, plain
sockets and the curl client; and a seeded differential test: pipelined requests with
random fields asking to upgrade get the answers the same requests without them get."""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, start_gateway
from tests.e2e.test_taken_invocations import Reader, connect, request

H2C = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
)
WEBSOCKET = (
    b"Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = start_gateway(tmp_path_factory.mktemp("upgrade") / "home")
    try:
        deploy(gateway.sm, "echo", (MODELS / "echo").as_uri())
        yield gateway
    finally:
        gateway.stop()


@pytest.mark.parametrize(
    "upgrade",
    [H2C, WEBSOCKET, b"Connection: upgrade\r\nUpgrade: x/1\r\n"],
    ids=["h2c", "websocket", "other"],
)
def test_a_request_asking_to_upgrade_is_served_as_http_1_1(
    gw: GatewayProcess, upgrade: bytes
) -> None:
    with connect(gw) as s:
        reader = Reader(s)
        s.sendall(request("echo", b'{"n": 1}', extra=upgrade))
        status, headers, body = reader.answer()
        assert status == 200 and json.loads(body) == {"n": 1}
        assert "upgrade" not in headers and "connection" not in headers
        # Still HTTP/1.1, kept alive.
        s.sendall(request("echo", b'{"n": 2}'))
        assert json.loads(reader.answer()[2]) == {"n": 2}


def test_requests_asking_to_upgrade_are_answered_in_order_when_pipelined(
    gw: GatewayProcess,
) -> None:
    with connect(gw) as s:
        s.sendall(
            request("echo", b'{"n": 0}', extra=H2C)
            + request("echo", b'{"n": 1}')
            + request("echo", b'{"n": 2}', extra=WEBSOCKET)
            + request("echo", b'{"n": 3}', extra=H2C)
        )
        reader = Reader(s)
        answers = [reader.answer() for _ in range(4)]
    assert [status for status, _, _ in answers] == [200] * 4
    assert [json.loads(body)["n"] for _, _, body in answers] == [0, 1, 2, 3]


def test_a_chunked_body_written_apart_from_its_head_reaches_the_model(
    gw: GatewayProcess,
) -> None:
    body = b'{"chunked": true}'
    with connect(gw) as s:
        s.sendall(
            b"POST /endpoints/echo/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n" + H2C + b"\r\n"
        )
        time.sleep(0.2)  # read alone, past the edge's hold for a body
        s.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        status, _, answer = Reader(s).answer()
    assert status == 200 and json.loads(answer) == {"chunked": True}


def test_too_many_headers_asking_to_upgrade_are_still_refused(gw: GatewayProcess) -> None:
    many = b"".join(b"X-Filler-%d: y\r\n" % n for n in range(150))
    with connect(gw) as s:
        s.sendall(request("echo", b"{}", extra=H2C + many))
        reader = Reader(s)
        status, headers, _ = reader.answer()
        assert status == 431 and headers["connection"] == "close"
        assert reader.closed()


def test_a_connect_is_answered_and_the_connection_closed(gw: GatewayProcess) -> None:
    with connect(gw) as s:
        s.sendall(
            b"CONNECT /endpoints/echo/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 0\r\n\r\n" + request("echo", b'{"tunnelled": true}')
        )
        reader = Reader(s)
        status, headers, body = reader.answer()
        assert status == 404 and headers["x-amzn-errortype"] == "UnknownOperationException"
        assert "CONNECT" in json.loads(body)["message"]
        assert reader.closed()


def test_a_body_in_a_transfer_coding_other_than_chunked_is_refused_501(
    gw: GatewayProcess,
) -> None:
    compressed = gzip.compress(b'{"n": 1}')
    chunked = b"%x\r\n" % len(compressed) + compressed + b"\r\n0\r\n\r\n"
    for coding in (b"gzip, chunked", b"gzip\r\nTransfer-Encoding: chunked"):
        with connect(gw) as s:
            s.sendall(request("echo", b'{"n": 0}'))  # an answer owed before the refusal
            s.sendall(
                b"POST /endpoints/echo/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: " + coding
                + b"\r\n\r\n" + chunked
            )  # fmt: skip
            reader = Reader(s)
            assert json.loads(reader.answer()[2]) == {"n": 0}
            status, headers, body = reader.answer()
            assert status == 501 and headers["connection"] == "close"
            assert b"chunked" in body
            assert reader.closed()
    # Chunked alone, however its field is written, is served.
    for coding in (b"chunked", b" Chunked ", b", chunked"):
        with connect(gw) as s:
            s.sendall(
                b"POST /endpoints/echo/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: " + coding
                + b"\r\n\r\n8\r\n{\"n\": 2}\r\n0\r\n\r\n"
            )  # fmt: skip
            assert json.loads(Reader(s).answer()[2]) == {"n": 2}


@pytest.mark.skipif(shutil.which("curl") is None, reason="the curl client is not installed")
def test_curl_http2_posts_its_body(gw: GatewayProcess) -> None:
    out = subprocess.run(
        [
            "curl", "-s", "--http2", "-m", "20", "-X", "POST",
            f"{gw.url}/endpoints/echo/invocations",
            "-H", "Content-Type: application/json",
            "-d", '{"from": "curl"}',
            "-w", "\n%{http_version} %{http_code}",
        ],
        capture_output=True, check=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    body, _, versions = out.rpartition("\n")
    assert versions == "1.1 200"
    assert json.loads(body) == {"from": "curl"}


_ASKING = [
    b"Connection: Upgrade",
    b"Upgrade: h2c",
    b"Upgrade: websocket",
    b"Connection: keep-alive, upgrade",
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
    b"Connection: ,upgrade,",
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
]
_LAST = b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def _pair(rnd: random.Random, n: int) -> tuple[bytes, bytes]:
    """A request with some of the fields that ask to upgrade, and the same without them:
    framed by length, chunked (a trailer field at times) or not at all, to the echo
    endpoint or elsewhere."""
    body = json.dumps({"n": n}).encode() if rnd.random() < 0.85 else b""
    framing = rnd.choice(["length", "chunked", "none"])
    if framing == "length":
        fields, payload = [b"Content-Length: %d" % len(body)], body
    elif framing == "chunked":
        fields = [b"Transfer-Encoding: chunked"]
        payload = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n"
        payload += (b"T: v\r\n" if rnd.random() < 0.3 else b"") + b"\r\n"
    else:
        fields, payload = [], b""
    fields += [b"Host: 127.0.0.1", b"Content-Type: application/json"]
    if rnd.random() < 0.15:
        fields.append(b"Expect: 100-continue")
    asking = rnd.sample(_ASKING, k=rnd.randint(0, 4))
    fields += asking
    rnd.shuffle(fields)
    target = rnd.choice([b"/endpoints/echo/invocations"] * 6 + [b"/ping", b"/v2/health/live"])
    method = b"POST" if rnd.random() < 0.9 else b"GET"

    def made(kept: list[bytes]) -> bytes:
        return method + b" " + target + b" HTTP/1.1\r\n" + b"\r\n".join(kept) + b"\r\n\r\n"

    return made(fields) + payload, made([f for f in fields if f not in asking]) + payload


def _answers(gw: GatewayProcess, data: bytes, cut: int | None) -> list[tuple[int, bytes]]:
    """Status and body of each answer (100 Continue left out) until the gateway closes."""
    received = b""
    with connect(gw) as s:
        for piece in (data,) if cut is None else (data[:cut], data[cut:]):
            s.sendall(piece)
            if cut is not None:
                time.sleep(0.07)  # the first piece read alone
        while chunk := s.recv(65536):
            received += chunk
    answers = []
    while received:
        head, _, received = received.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        size = int(length.group(1)) if length else 0
        body, received = received[:size], received[size:]
        if status != 100:
            answers.append((status, body))
    return answers


def test_asking_to_upgrade_changes_no_answer(gw: GatewayProcess) -> None:
    # Differential: pipelined requests with random fields asking to upgrade get the
    # answers, status and body, that the same requests without those fields get.
    rnd = random.Random(20261128)
    for round_ in range(40):
        pairs = [_pair(rnd, round_ * 10 + k) for k in range(rnd.randint(1, 4))]
        asking = b"".join(p[0] for p in pairs) + _LAST
        plain = b"".join(p[1] for p in pairs) + _LAST
        split = rnd.random() < 0.3
        cut = rnd.randint(1, len(plain) - len(_LAST)) if split else None
        assert _answers(gw, asking, cut) == _answers(gw, plain, cut), asking
