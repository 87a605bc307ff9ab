"""The runtime's invocations on the wire: answered from the HTTP protocol without an ASGI
task (http/direct.py), they leave the connection as uvicorn's own cycle does.

Driven over raw sockets against a real runtime process, so that the bytes on the wire,
pipelined requests and the connection's end are what is checked.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from tests.runtime.test_runtime_contract import Runtime, start_runtime  # noqa: F401

CODE = """
def transform_fn(model, body, content_type, accept):
    if body == b"bad-type":
        return b"x", "text/plain\\r\\nx-injected: 1"
    if body == b"pieces":
        return iter([b"a", b"b", b"c"]), "text/plain"
    if body == b"fail":
        raise ValueError("asked to fail")
    return b"echo:" + body, content_type
"""


@pytest.fixture(scope="module")
def wire(
    tmp_path_factory: pytest.TempPathFactory,
    start_runtime: Callable[..., Runtime],  # noqa: F811  # the contract tests' fixture
) -> Runtime:
    model_dir = tmp_path_factory.mktemp("wire")
    (model_dir / "code").mkdir()
    (model_dir / "code" / "inference.py").write_text(CODE)
    return start_runtime(model_dir)


def invocation(body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [
        f"POST /invocations HTTP/{version}",
        "Host: test",
        "Content-Type: text/plain",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Answer:
    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


def read_answers(sock: socket.socket, count: int) -> tuple[list[Answer], bytes]:
    """``count`` answers (each with a Content-Length) and whatever followed them."""
    data = b""
    answers: list[Answer] = []
    sock.settimeout(10)
    while len(answers) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            headers = [tuple(line.split(": ", 1)) for line in lines[1:]]
            length = int(next(v for k, v in headers if k.lower() == "content-length"))
            if len(data) >= end + 4 + length:
                answers.append(
                    Answer(
                        int(lines[0].split()[1]),
                        [(k.lower(), v) for k, v in headers],
                        data[end + 4 : end + 4 + length],
                    )
                )
                data = data[end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return answers, data


def connect(runtime: Runtime) -> socket.socket:
    return socket.create_connection(("127.0.0.1", runtime.port), timeout=10)


def send_in_pieces(sock: socket.socket, message: bytes) -> None:
    """``message`` in writes of 4,000 bytes, apart, so that the runtime reads it in pieces."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for start in range(0, len(message), 4000):
        sock.sendall(message[start : start + 4000])
        time.sleep(0.01)  # shapes the input into separate reads; nothing waits on it


def test_pipelined_requests_are_answered_in_order(wire: Runtime) -> None:
    with connect(wire) as sock:
        sock.sendall(
            invocation(b"one")
            + b"GET /ping HTTP/1.1\r\nHost: test\r\n\r\n"
            + invocation(b"pieces")
            + invocation(b"two")
        )
        answers, rest = read_answers(sock, 4)
    assert [(a.status, a.body) for a in answers] == [
        (200, b"echo:one"),
        (200, b""),
        (200, b"abc"),
        (200, b"echo:two"),
    ]
    assert rest == b""
    assert answers[0].header("content-type") == "text/plain"


def test_a_body_that_arrives_in_pieces_is_answered_once_whole(wire: Runtime) -> None:
    message = invocation(b"0123456789" * 1000)
    with connect(wire) as sock:
        send_in_pieces(sock, message)
        answers, _ = read_answers(sock, 1)
        assert answers[0].body == b"echo:" + b"0123456789" * 1000
        sock.sendall(invocation(b"again"))  # the connection is kept
        assert read_answers(sock, 1)[0][0].body == b"echo:again"


def test_connection_close_is_answered_and_the_connection_closed(wire: Runtime) -> None:
    with connect(wire) as sock:
        sock.sendall(invocation(b"last", "Connection: close"))
        answers, rest = read_answers(sock, 2)
    assert [a.body for a in answers] == [b"echo:last"]
    assert answers[0].header("connection") == "close"
    assert rest == b""


def test_an_http_1_0_request_is_answered_and_the_connection_closed(wire: Runtime) -> None:
    with connect(wire) as sock:
        sock.sendall(invocation(b"old", version="1.0"))
        answers, rest = read_answers(sock, 2)
    assert [a.body for a in answers] == [b"echo:old"]
    assert answers[0].header("connection") == "close"


def test_a_media_type_that_is_no_header_value_is_a_500_not_a_header(wire: Runtime) -> None:
    with connect(wire) as sock:
        sock.sendall(invocation(b"bad-type") + invocation(b"after"))
        answers, _ = read_answers(sock, 2)
    assert answers[0].status == 500
    assert answers[0].header("x-injected") is None
    assert answers[0].body.startswith(b"ValueError: not a valid header value")
    assert answers[1].body == b"echo:after"


def test_a_handler_error_is_answered_with_its_message(wire: Runtime) -> None:
    with connect(wire) as sock:
        sock.sendall(invocation(b"fail") + invocation(b"after"))
        answers, _ = read_answers(sock, 2)
    assert (answers[0].status, answers[0].body) == (500, b"ValueError: asked to fail")
    assert answers[0].header("content-type") == "text/plain; charset=utf-8"
    assert answers[1].body == b"echo:after"


def test_every_answer_carries_the_date_as_uvicorn_s_do(wire: Runtime) -> None:
    with connect(wire) as sock:
        sock.sendall(invocation(b"x") + b"GET /ping HTTP/1.1\r\nHost: test\r\n\r\n")
        answers, _ = read_answers(sock, 2)
    assert all(a.header("date") for a in answers)
    assert all(a.header("server") is None for a in answers)


def test_a_body_in_pieces_that_the_app_takes_reaches_it_whole(wire: Runtime) -> None:
    """A request asking for a stream is the ASGI app's, not the protocol's: the body the
    protocol gathered while it arrived is what the app receives."""
    body = b"0123456789" * 1000
    message = invocation(body, "X-Shipyard-Response-Stream: true")
    with connect(wire) as sock:
        send_in_pieces(sock, message)
        answers, _ = read_answers(sock, 1)
    assert (answers[0].status, answers[0].body) == (200, b"echo:" + body)
