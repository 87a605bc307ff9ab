"""Invocations on the callback path (http/server.py ``serve_whole``): a request whose
head and body arrive in one read, for an endpoint with an instance free and a connection
to it idle, is served with no ASGI cycle or task. What its client sees must be what the
ASGI path gives it: the same answer, the same errors, keep-alive, pipelining and
``Connection: close`` as uvicorn's, and the same counts. Real gateway, real instances,
plain sockets (one write per request: one read at the gateway)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import (
    MODELS,
    GatewayProcess,
    deploy,
    in_flight,
    start_gateway,
    wait_until,
)
from tests.e2e.test_shadow import metric


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("taken") / "home",
        extra_env={"SHIPYARD_INVOCATION_TIMEOUT_S": "1"},
    )
    try:
        deploy(gateway.sm, "echo", (MODELS / "echo").as_uri())
        deploy(gateway.sm, "slow", (MODELS / "sleepy").as_uri())
        deploy(gateway.sm, "flaky", (MODELS / "flaky").as_uri())
        yield gateway
    finally:
        gateway.stop()


def connect(gw: GatewayProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])), timeout=15)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def request(name: str, body: bytes, *, version: bytes = b"1.1", extra: bytes = b"") -> bytes:
    return (
        b"POST /endpoints/" + name.encode() + b"/invocations HTTP/" + version + b"\r\n"
        b"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Reader:
    """Reads HTTP/1.1 answers off a socket, one at a time."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.buffer = b""

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"{name} twice in {lines}"
            headers[name.lower()] = value.strip()
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed(self) -> bool:
        """Whether the gateway closed the connection (nothing more to read)."""
        try:
            return self.s.recv(1) == b""
        except ConnectionResetError:
            return True

    def _more(self) -> None:
        data = self.s.recv(65536)
        assert data, f"the connection closed; read so far: {self.buffer!r}"
        self.buffer += data


def whole(gw: GatewayProcess, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request sent in one write on a new connection; its answer."""
    with connect(gw) as s:
        s.sendall(data)
        return Reader(s).answer()


def in_pieces(
    gw: GatewayProcess, data: bytes, pause_s: float = 0.2
) -> tuple[int, dict[str, str], bytes]:
    """The same request with its body written ``pause_s`` after its head, which has had
    time to be read alone. Past the edge's hold for the body (50 ms), as by default:
    uvicorn's request cycle and the ASGI app serve it."""
    head, _, body = data.partition(b"\r\n\r\n")
    with connect(gw) as s:
        s.sendall(head + b"\r\n\r\n")
        time.sleep(pause_s)
        s.sendall(body)
        return Reader(s).answer()


def without_date(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != "date"}


def warm(gw: GatewayProcess, name: str, body: bytes = b"{}") -> None:
    """One answered request, so that a connection to the instance is open and idle."""
    status, _, _ = whole(gw, request(name, body))
    assert status in (200, 424)


def test_an_answer_on_the_callback_path_is_the_answer_of_the_asgi_path(gw: GatewayProcess) -> None:
    warm(gw, "echo")
    data = request("echo", b'{"x": [1, 2, 3]}')
    taken, asgi = whole(gw, data), in_pieces(gw, data)
    assert taken[0] == asgi[0] == 200
    assert without_date(taken[1]) == without_date(asgi[1])
    assert taken[1]["x-amzn-invoked-production-variant"] == "v1"
    assert "date" in taken[1] and "server" not in taken[1]
    assert json.loads(taken[2]) == json.loads(asgi[2]) == {"x": [1, 2, 3]}


def test_a_body_written_apart_from_its_head_gets_the_same_answer(gw: GatewayProcess) -> None:
    """http.client (under urllib3 and requests too) writes a request's head and its body
    apart: held for the read after its head, the body is taken there; the answers are
    those of one write, request after request on one connection."""
    warm(gw, "echo")
    host, port = gw.url.rsplit("//", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        for i in range(20):
            body = json.dumps({"i": i, "pad": "x" * (i * 50)})
            conn.request(
                "POST", "/endpoints/echo/invocations", body=body,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            answer = conn.getresponse()
            assert answer.status == 200 and json.loads(answer.read()) == json.loads(body)
            assert answer.getheader("x-amzn-invoked-production-variant") == "v1"
    finally:
        conn.close()
    data = request("echo", b'{"x": [1, 2, 3]}')
    apart = in_pieces(gw, data, pause_s=0.01)  # within the hold: the body's read is next
    one = whole(gw, data)
    assert apart[0] == one[0] == 200
    assert without_date(apart[1]) == without_date(one[1])
    assert json.loads(apart[2]) == {"x": [1, 2, 3]}


def test_a_model_error_on_the_callback_path_is_that_of_the_asgi_path(gw: GatewayProcess) -> None:
    warm(gw, "flaky")
    data = request("flaky", b'{"fail": true}')
    taken, asgi = whole(gw, data), in_pieces(gw, data)
    assert taken[0] == asgi[0] == 424
    assert without_date(taken[1]) == without_date(asgi[1])
    assert taken[1]["x-amzn-errortype"] == "ModelError"
    error, other = json.loads(taken[2]), json.loads(asgi[2])
    assert error["OriginalStatusCode"] == other["OriginalStatusCode"] == 500
    assert error["ErrorCode"] == "ModelError" and "failed request" in error["OriginalMessage"]


def test_a_call_past_the_invocation_timeout_is_a_model_error(gw: GatewayProcess) -> None:
    warm(gw, "slow", b'{"sleep": 0}')
    started = time.monotonic()
    status, headers, body = whole(gw, request("slow", b'{"sleep": 3}'))
    assert status == 424 and headers["x-amzn-errortype"] == "ModelError"
    error = json.loads(body)
    assert error["OriginalStatusCode"] == 504 and "timed out" in error["Message"]
    assert error["LogStreamArn"].endswith(":log-group:/aws/sagemaker/Endpoints/slow")
    assert time.monotonic() - started < 2.5  # the 1 s timeout, not the model's 3 s
    wait_until(lambda: in_flight(gw, "slow") == 0, "the instance given back")
    # The instance finishes the abandoned call, then serves again.
    wait_until(lambda: whole(gw, request("slow", b'{"sleep": 0}'))[0] == 200, "serving again", 10)


def test_pipelined_requests_are_answered_in_order(gw: GatewayProcess) -> None:
    warm(gw, "echo")
    with connect(gw) as s:
        s.sendall(b"".join(request("echo", b'{"n": %d}' % n) for n in range(5)))
        reader = Reader(s)
        answers = [reader.answer() for _ in range(5)]
        assert [json.loads(body)["n"] for _, _, body in answers] == list(range(5))
        assert all(status == 200 for status, _, _ in answers)
        # Still open, and still served.
        s.sendall(request("echo", b'{"n": 5}'))
        assert json.loads(reader.answer()[2]) == {"n": 5}


def test_keep_alive_carries_many_requests(gw: GatewayProcess) -> None:
    warm(gw, "echo")
    with connect(gw) as s:
        reader = Reader(s)
        for n in range(20):
            s.sendall(request("echo", b'{"n": %d}' % n))
            status, headers, body = reader.answer()
            assert status == 200 and "connection" not in headers
            assert json.loads(body) == {"n": n}


@pytest.mark.parametrize(
    ("version", "extra"),
    [(b"1.1", b"Connection: close\r\n"), (b"1.0", b"")],
    ids=["connection-close", "http-1.0"],
)
def test_a_last_request_is_answered_then_the_connection_closed(
    gw: GatewayProcess, version: bytes, extra: bytes
) -> None:
    warm(gw, "echo")
    with connect(gw) as s:
        s.sendall(request("echo", b'{"last": true}', version=version, extra=extra))
        reader = Reader(s)
        status, headers, body = reader.answer()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body) == {"last": True}
        assert reader.closed()


def test_a_client_gone_before_its_answer_leaves_nothing_behind(gw: GatewayProcess) -> None:
    warm(gw, "slow", b'{"sleep": 0}')
    with connect(gw) as s:
        s.sendall(request("slow", b'{"sleep": 0.5}'))
        wait_until(lambda: in_flight(gw, "slow") == 1, "the call under way")
    wait_until(lambda: in_flight(gw, "slow") == 0, "the instance given back")
    assert whole(gw, request("slow", b'{"sleep": 0}'))[0] == 200


def test_calls_on_the_callback_path_are_counted(gw: GatewayProcess) -> None:
    warm(gw, "flaky")
    before = {
        name: metric(gw, name, "flaky", "v1")
        for name in (
            "shipyard_invocations_total",
            "shipyard_invocation_5xx_errors_total",
            "shipyard_model_latency_seconds_count",
        )
    }
    with connect(gw) as s:
        reader = Reader(s)
        for fail in (False, False, True):
            s.sendall(request("flaky", json.dumps({"fail": fail}).encode()))
            reader.answer()
    after: dict[str, Any] = {name: metric(gw, name, "flaky", "v1") for name in before}
    assert after["shipyard_invocations_total"] - before["shipyard_invocations_total"] == 3
    assert (
        after["shipyard_invocation_5xx_errors_total"]
        - before["shipyard_invocation_5xx_errors_total"]
        == 1
    )
    # The model's latency is observed for the answers it gave successfully.
    assert (
        after["shipyard_model_latency_seconds_count"]
        - before["shipyard_model_latency_seconds_count"]
        == 2
    )


def test_an_unknown_endpoint_is_refused_in_the_runtime_shape(gw: GatewayProcess) -> None:
    status, headers, body = whole(gw, request("nowhere", b"{}"))
    assert status == 400 and headers["x-amzn-errortype"] == "ValidationError"
    assert "nowhere" in json.loads(body)["message"]
