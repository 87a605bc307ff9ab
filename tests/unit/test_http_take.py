"""The gateway's HTTP protocol offers a request whose body is whole to the app's
``serve_whole`` (http/server.py), and releases to uvicorn's request cycle whatever it
declines, as if never held: the real protocol class, fed bytes, over a transport that
records."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from shipyard.http.server import Respond, body_arrived, limited_protocol

Taker = Callable[[dict[str, Any], bytes, Respond], bool]


class Recording:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.data = b""
        self.closing = False
        self.buffered = 0
        """Bytes written and not yet sent, as the transport reports them."""

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, lines: list[bytes]) -> None:
        self.data += b"".join(lines)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.buffered


BODY = b'{"x": 1}'


def invocation(
    body: bytes = BODY, *, extra: bytes = b"", path: bytes = b"/endpoints/e/invocations"
) -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"Content-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


class Served:
    """The requests the ASGI app was given: path and whole body. It reads a body as the
    gateway's doors do: a disconnect before the body is whole is the client gone
    (``gone``), with no request served and no answer."""

    def __init__(self) -> None:
        self.asgi: list[tuple[str, bytes]] = []
        self.gone = 0

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone += 1
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.asgi.append((scope["path"], body))
        answer = b"asgi:" + body
        headers = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


class Offers:
    """A ``serve_whole`` that keeps what it is offered (each body, and the ``respond`` to answer
    it with) and answers ``result``, answering no request itself."""

    def __init__(self, result: bool) -> None:
        self.result = result
        self.bodies: list[bytes] = []
        self.responders: list[Respond] = []

    def __call__(self, scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        self.bodies.append(body)
        self.responders.append(respond)
        return self.result


def protocol(served: Served, take: Taker | None) -> tuple[Any, Recording]:
    config = Config(
        served.app, interface="asgi3", access_log=False, server_header=False, date_header=False
    )
    config.load()
    cls = limited_protocol(
        max_headers=100, max_head_bytes=65536, head_timeout_s=10, serve_whole=take
    )
    proto = cls(config=config, server_state=ServerState(), app_state={})
    transport = Recording()
    proto.connection_made(transport)
    return proto, transport


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def answers(data: bytes) -> list[bytes]:
    """The bodies of the HTTP/1.1 answers in ``data`` (content-length framed)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(b"content-length:")
        )  # fmt: skip
        out.append(rest[:length])
        data = rest[length:]
    return out


def test_a_request_whole_in_one_read_is_served_whole_and_answered_as_uvicorn_would() -> None:
    taken: list[tuple[str, bytes, dict[str, Any]]] = []

    def take(scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        taken.append((scope["path"], body, dict(scope)))
        respond(200, [(b"content-type", b"text/plain"), (b"content-length", b"5")], b"taken")
        return True

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        proto.data_received(invocation())
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    ((path, body, scope),) = taken
    assert path == "/endpoints/e/invocations" and body == BODY
    assert scope["method"] == "POST" and scope["raw_path"] == b"/endpoints/e/invocations"
    assert scope["query_string"] == b"" and scope["http_version"] == "1.1"
    assert served.asgi == []
    assert transport.data == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\ntaken"
    )
    assert not transport.closing


@pytest.mark.parametrize(
    "data",
    [
        invocation(extra=b"Expect: 100-continue\r\n"),
        invocation(path=b"/endpoints/e/invocations?x=1"),
        invocation(path=b"/endpoints/%65/invocations"),
        b"PUT /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n" + BODY,
    ],
    ids=["expect-continue", "query", "escaped", "not-post"],
)
def test_what_uvicorn_must_see_is_never_held(data: bytes) -> None:
    take = Offers(False)
    offered = take.bodies

    async def scenario() -> Served:
        served = Served()
        proto, _ = protocol(served, take)
        proto.data_received(data)
        await turns()
        return served

    served = asyncio.run(scenario())
    assert offered == []
    assert [body for _, body in served.asgi] == [BODY]


def test_a_body_not_whole_in_the_heads_read_goes_to_uvicorn_whole() -> None:
    take = Offers(True)
    offered = take.bodies

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        data = invocation()
        proto.data_received(data[:-3])
        await turns()
        proto.data_received(data[-3:])
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    assert offered == []
    assert served.asgi == [("/endpoints/e/invocations", BODY)]
    assert answers(transport.data) == [b"asgi:" + BODY]


def head_and_body(body: bytes = BODY) -> tuple[bytes, bytes]:
    """An invocation as http.client, urllib3, requests and httpx send it: its head in
    one write, its body in another."""
    data = invocation(body)
    return data[: -len(body)], data[-len(body) :]


def test_a_body_whole_in_the_read_after_its_head_is_served_whole() -> None:
    taken: list[bytes] = []

    def take(scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        taken.append(body)
        respond(200, [(b"content-length", b"5")], b"taken")
        return True

    async def scenario() -> tuple[Served, Recording, Any]:
        served = Served()
        proto, transport = protocol(served, take)
        head, body = head_and_body()
        proto.data_received(head)
        await turns()
        assert taken == [] and served.asgi == [] and transport.data == b""
        proto.data_received(body)
        await turns()
        return served, transport, proto

    served, transport, proto = asyncio.run(scenario())
    assert taken == [BODY] and served.asgi == []
    assert answers(transport.data) == [b"taken"]
    assert proto._hold_timer is None  # nothing left armed


@pytest.mark.parametrize("rest", ["in two reads", "late"])
def test_a_body_not_whole_in_the_read_after_its_head_goes_to_uvicorn_whole(rest: str) -> None:
    take = Offers(True)
    offered = take.bodies

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        proto.hold_body_s = 0.01
        head, body = head_and_body()
        proto.data_received(head)
        if rest == "late":
            await asyncio.sleep(0.05)  # past hold_body_s: the request is uvicorn's
            assert proto._held is None
            proto.data_received(body)
        else:
            proto.data_received(body[:3])
            await turns()
            proto.data_received(body[3:])
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    assert offered == []
    assert served.asgi == [("/endpoints/e/invocations", BODY)]
    assert answers(transport.data) == [b"asgi:" + BODY]


def test_a_shutdown_while_a_body_is_awaited_drains_the_request() -> None:
    """A request held for its body is in flight: a shutdown gives it to uvicorn, which
    answers it once its body is read and then ends the connection."""
    take = Offers(True)
    offered = take.bodies

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        head, body = head_and_body()
        proto.data_received(head)
        proto.shutdown()
        assert not transport.closing
        proto.data_received(body)
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    assert offered == [] and served.asgi == [("/endpoints/e/invocations", BODY)]
    assert answers(transport.data) == [b"asgi:" + BODY]
    assert b"connection: close\r\n" in transport.data and transport.closing


def test_a_connection_lost_while_a_body_is_awaited_leaves_nothing_armed() -> None:
    async def scenario() -> tuple[Served, Any]:
        served = Served()
        proto, _ = protocol(served, lambda scope, body, respond: True)
        proto.data_received(head_and_body()[0])
        assert proto._hold_timer is not None
        proto.connection_lost(None)
        await turns()
        return served, proto

    served, proto = asyncio.run(scenario())
    assert proto._hold_timer is None and proto._held is None and served.asgi == []


@pytest.mark.parametrize("refusal", ["declined", "raised"])
def test_a_request_declined_goes_to_uvicorn_as_if_never_held(
    refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    def take(scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        if refusal == "raised":
            raise RuntimeError("a fault in take")
        return False

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        proto.data_received(invocation() + invocation(b'{"x": 2}'))
        await turns(10)
        return served, transport

    with caplog.at_level(logging.ERROR):
        served, transport = asyncio.run(scenario())
    assert [body for _, body in served.asgi] == [BODY, b'{"x": 2}']
    assert answers(transport.data) == [b"asgi:" + BODY, b'asgi:{"x": 2}']
    assert ("a fault in take" in caplog.text) == (refusal == "raised")


def test_requests_pipelined_behind_one_served_whole_wait_for_its_answer() -> None:
    take = Offers(True)
    responders = take.responders

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        proto.data_received(invocation(b"first") + invocation(b"second"))
        await turns()
        assert transport.data == b""  # the second waits behind the first's answer
        assert len(responders) == 1 and served.asgi == []
        responders[0](200, [(b"content-length", b"6")], b"first!")
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    # The first answered by take, then the second by uvicorn's cycle, in order.
    assert served.asgi == [("/endpoints/e/invocations", b"second")]
    assert answers(transport.data) == [b"first!", b"asgi:second"]


def test_a_shutdown_while_answering_ends_the_connection_with_the_answer() -> None:
    take = Offers(True)
    responders = take.responders

    async def scenario() -> Recording:
        proto, transport = protocol(Served(), take)
        proto.data_received(invocation())
        proto.shutdown()
        assert not transport.closing  # its answer is still due
        responders[0](200, [(b"content-length", b"2")], b"ok")
        await turns()
        return transport

    transport = asyncio.run(scenario())
    assert b"connection: close\r\n" in transport.data and transport.data.endswith(b"ok")
    assert transport.closing


def test_an_answer_for_a_connection_lost_is_dropped() -> None:
    take = Offers(True)
    responders = take.responders

    async def scenario() -> Recording:
        proto, transport = protocol(Served(), take)
        proto.data_received(invocation())
        proto.connection_lost(None)
        responders[0](200, [(b"content-length", b"2")], b"ok")
        await turns()
        return transport

    assert asyncio.run(scenario()).data == b""


def test_a_client_not_reading_its_answers_is_left_to_uvicorn() -> None:
    """uvicorn's send waits for a full write buffer to drain, and what the client sends
    meanwhile waits behind it: nothing is taken to pile answers up in the buffer."""
    take = Offers(True)
    offered = take.bodies

    async def scenario() -> Served:
        served = Served()
        proto, transport = protocol(served, take)
        transport.buffered = 1 << 20
        proto.data_received(invocation())
        await turns()
        return served

    served = asyncio.run(scenario())
    assert offered == [] and [body for _, body in served.asgi] == [BODY]


def test_an_answer_with_a_header_value_uvicorn_refuses_ends_the_connection() -> None:
    def take(scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        headers = [(b"content-type", b"text/plain\r\nx-injected: 1"), (b"content-length", b"2")]
        respond(200, headers, b"ok")
        return True

    async def scenario() -> Recording:
        proto, transport = protocol(Served(), take)
        proto.data_received(invocation())
        await turns()
        return transport

    transport = asyncio.run(scenario())
    assert transport.data == b"" and transport.closing


CHUNKED_WITH_TRAILERS = (
    b"POST /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n8\r\n" + BODY + b"\r\n0\r\n"
    b"Content-Type: text/evil\r\nX-Amzn-SageMaker-Target-Variant: v2\r\n\r\n"
)


@pytest.mark.parametrize("taken", [True, False], ids=["taken", "asgi"])
def test_a_chunked_bodys_trailer_fields_never_become_request_headers(taken: bool) -> None:
    # Trailers come after the head, so after a signature was checked against it: as
    # headers they would let anyone on the wire change a signed one.
    seen: list[list[tuple[bytes, bytes]]] = []

    def take(scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        if taken:
            seen.append(list(scope["headers"]))
            respond(200, [(b"content-length", b"0")], b"")
        return taken

    class HeadersAfterBody(Served):
        async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            await super().app(scope, receive, send)  # the body read to its end
            seen.append(list(scope["headers"]))

    async def scenario() -> HeadersAfterBody:
        served = HeadersAfterBody()
        proto, _ = protocol(served, take)
        proto.data_received(CHUNKED_WITH_TRAILERS)
        await turns()
        return served

    served = asyncio.run(scenario())
    assert seen == [
        [(b"host", b"x"), (b"content-type", b"application/json"),
         (b"transfer-encoding", b"chunked")]
    ]  # fmt: skip
    assert served.asgi == ([] if taken else [("/endpoints/e/invocations", BODY)])


def test_a_serve_whole_that_fails_after_answering_is_not_answered_again() -> None:
    def take(scope: dict[str, Any], body: bytes, respond: Respond) -> bool:
        respond(200, [(b"content-length", b"5")], b"taken")
        raise RuntimeError("after the answer")

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, take)
        proto.data_received(invocation())
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    assert served.asgi == [] and answers(transport.data) == [b"taken"]


TOO_MANY_HEADERS = (
    b"POST /x HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n"
)


@pytest.mark.parametrize("taken", [True, False], ids=["taken", "asgi"])
@pytest.mark.parametrize(
    ("behind", "status"),
    [(TOO_MANY_HEADERS, b"431"), (b"NOT HTTP AT ALL\r\n\r\n", b"400")],
    ids=["431", "400"],
)
def test_a_refusal_of_a_pipelined_request_follows_the_answer_before_it(
    taken: bool, behind: bytes, status: bytes
) -> None:
    # Written at once, the refusal would be read as the first request's answer.
    take = Offers(taken)

    async def scenario() -> tuple[Served, Recording, bytes]:
        served = Served()
        proto, transport = protocol(served, take)
        proto.data_received(invocation(b"first") + behind)
        early = transport.data
        if taken:
            take.responders[0](200, [(b"content-length", b"6")], b"first!")
        await turns()
        return served, transport, early

    served, transport, early = asyncio.run(scenario())
    first = b"first!" if taken else b"asgi:first"
    assert early == b""
    head, _, rest = transport.data.partition(first)
    assert head.startswith(b"HTTP/1.1 200 ") and rest.startswith(b"HTTP/1.1 " + status)
    assert transport.closing


def _fed(reads: list[bytes]) -> tuple[Any, Recording, Served]:
    async def scenario() -> tuple[Any, Recording, Served]:
        served = Served()
        proto, transport = protocol(served, Offers(False))
        for data in reads:
            if transport.closing:
                break
            proto.data_received(data)
        await turns()
        return proto, transport, served

    return asyncio.run(scenario())


def test_a_head_of_many_headers_in_one_read_keeps_no_more_than_the_limit() -> None:
    # 65,530 four-byte fields in one read: refused, and never held as 65,530 headers.
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * 65_530 + b"\r\n"
    proto, transport, served = _fed([head])
    assert transport.data.startswith(b"HTTP/1.1 431") and transport.closing
    assert len(proto.headers) <= 100
    assert served.asgi == []


@pytest.mark.parametrize("split", [None, 30_000], ids=["one-read", "two-reads"])
def test_a_head_just_over_the_limit_is_refused_however_it_is_split(split: int | None) -> None:
    # 65,536 bytes on the wire, 100 fields of three bytes' framing each ("x:" and its
    # line's end): counted at four a field, over 64 KiB in one read as in two.
    fields = [b"x%02d:\r\n" % i for i in range(99)]
    filler = 65_536 - len(b"GET / HTTP/1.1\r\n") - sum(map(len, fields)) - len(b"big:\r\n\r\n")
    head = b"GET / HTTP/1.1\r\n" + b"".join(fields) + b"big:" + b"a" * filler + b"\r\n\r\n"
    assert len(head) == 65_536
    reads = [head] if split is None else [head[:split], head[split:]]
    _, transport, served = _fed(reads)
    assert transport.data.startswith(b"HTTP/1.1 431")
    assert served.asgi == []


def _chunked(trailers: int) -> tuple[bytes, bytes]:
    """A chunked request's head and body (58 fields in the head beside Host and
    Transfer-Encoding), with ``trailers`` trailer fields."""
    head_fields = b"".join(b"h%d: v\r\n" % i for i in range(58))
    trailer_fields = b"".join(b"t%d: v\r\n" % i for i in range(trailers))
    head = (
        b"POST /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\n" + head_fields
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )  # fmt: skip
    return head, b"2\r\n{}\r\n0\r\n" + trailer_fields + b"\r\n"


@pytest.mark.parametrize("trailers", [30, 50])
def test_a_chunked_bodys_trailer_fields_count_with_its_heads(trailers: int) -> None:
    # 60 fields in the head, and 30 or 50 trailer fields: 90 together is served, 110 is
    # over the limit of 100: refused with a 431, its only answer, and the connection ends.
    head, body = _chunked(trailers)
    _, transport, served = _fed([head + body])
    if trailers == 30:
        assert served.asgi == [("/endpoints/e/invocations", b"{}")]
        assert answers(transport.data) == [b"asgi:{}"] and not transport.closing
    else:
        assert served.asgi == []
        assert transport.data.startswith(b"HTTP/1.1 431") and transport.closing
        assert answers(transport.data) == [b"Request header fields too large."]


def test_trailers_over_the_limit_refuse_a_request_whose_app_reads_its_body() -> None:
    # The head came alone and its body later than the hold allows: the app was reading
    # the body when its trailers came. It gets a disconnect; the client, the 431 at once
    # (before, the refusal waited for that app's answer, which waited for the body).
    head, body = _chunked(50)

    async def scenario() -> tuple[Served, Recording]:
        served = Served()
        proto, transport = protocol(served, Offers(False))
        proto.hold_body_s = 0.0
        proto.data_received(head)
        await asyncio.sleep(0.01)
        await turns()
        proto.data_received(body[:6])  # the first chunk: the app has it
        await turns()
        proto.data_received(body[6:])
        await turns()
        return served, transport

    served, transport = asyncio.run(scenario())
    assert served.asgi == [] and served.gone == 1
    assert transport.closing
    assert answers(transport.data) == [b"Request header fields too large."]


def test_trailers_over_the_limit_refuse_a_pipelined_request_after_the_one_before() -> None:
    # A request, then one pipelined behind it whose trailers are over the limit: the first
    # is answered, then the refusal, in that order; the second's app never runs.
    head, body = _chunked(50)
    release = asyncio.Event()

    class Slow(Served):
        async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            await release.wait()
            await super().app(scope, receive, send)

    async def scenario() -> tuple[Slow, Recording]:
        served = Slow()
        proto, transport = protocol(served, Offers(False))
        proto.data_received(invocation() + head + body)
        await turns()
        assert transport.data == b""  # nothing before the first request's answer
        release.set()
        await turns(10)
        return served, transport

    served, transport = asyncio.run(scenario())
    assert served.asgi == [("/endpoints/e/invocations", BODY)] and served.gone == 0
    assert answers(transport.data) == [b"asgi:" + BODY, b"Request header fields too large."]
    assert transport.closing


class Delayed(Served):
    """Served, each path's answer after its delay."""

    def __init__(self, delays: dict[str, float]) -> None:
        super().__init__()
        self.delays = delays

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await asyncio.sleep(self.delays.get(scope["path"], 0))
        await super().app(scope, receive, send)


def test_a_refused_request_queued_two_behind_keeps_their_answers_past_the_drain_timer() -> None:
    # The drain timer, armed when an answer is complete while a body is still coming, must
    # not take the refused request for answered and end the connection before /b's.
    head, body = _chunked(50)

    async def scenario() -> Recording:
        proto, transport = protocol(Delayed({"/a": 0.01, "/b": 0.2}), Offers(False))
        proto.drain_timeout_s = 0.05
        proto.data_received(invocation(path=b"/a") + invocation(path=b"/b") + head + body)
        await asyncio.sleep(0.4)
        await turns()
        return transport

    transport = asyncio.run(scenario())
    assert answers(transport.data) == [b"asgi:" + BODY] * 2 + [b"Request header fields too large."]
    assert transport.closing


def test_a_shutdown_with_a_refused_request_queued_keeps_the_answer_in_flight() -> None:
    # uvicorn's shutdown closes a connection whose current cycle is answered at once: the
    # refused request queued behind /a must not look answered.
    head, body = _chunked(50)

    async def scenario() -> Recording:
        proto, transport = protocol(Delayed({"/a": 0.05}), Offers(False))
        proto.data_received(invocation(path=b"/a") + head + body)
        await turns()
        proto.shutdown()
        await asyncio.sleep(0.2)
        await turns()
        return transport

    transport = asyncio.run(scenario())
    assert answers(transport.data) == [b"asgi:" + BODY, b"Request header fields too large."]
    assert transport.closing


def test_a_held_request_refused_for_its_trailers_is_never_offered() -> None:
    offers = Offers(True)

    async def scenario() -> Recording:
        proto, transport = protocol(Served(), offers)
        proto.data_received(b"".join(_chunked(50)))
        await turns()
        return transport

    transport = asyncio.run(scenario())
    assert offers.bodies == []
    assert answers(transport.data) == [b"Request header fields too large."]


def test_trailers_over_the_limit_after_an_answer_end_the_connection_without_a_second() -> None:
    # The app answered before reading the body (as a door refusing a request does): that
    # answer stands, and the connection ends with no 431 after it.
    head, body = _chunked(50)

    class Early(Served):
        async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"nope"})

    async def scenario() -> Recording:
        proto, transport = protocol(Early(), Offers(False))
        proto.hold_body_s = 0.0
        proto.data_received(head)
        await asyncio.sleep(0.01)
        await turns()
        proto.data_received(body)
        await turns()
        return transport

    transport = asyncio.run(scenario())
    assert transport.data.startswith(b"HTTP/1.1 404") and b"431" not in transport.data
    assert transport.closing


UPGRADE = b"Connection: Upgrade\r\nUpgrade: h2c\r\n"


def test_a_request_asking_to_upgrade_is_parsed_again_with_its_body() -> None:
    # httptools ends a request asking to upgrade at its head and hands back its body as
    # the other protocol's bytes: the edge parses it again without the upgrade. Taken
    # (one read) or through uvicorn, the body is whole, and the requests after it (and
    # their bodies' arrival) are as on any connection.
    seen: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(body_arrived(scope))
        await served.app(scope, receive, send)

    async def scenario() -> Recording:
        proto, transport = protocol(served, None)
        proto.app = app
        proto.data_received(invocation(b"one", extra=UPGRADE) + invocation(b"two"))
        await turns()
        proto.data_received(invocation(b"three", extra=UPGRADE))
        await turns()
        return transport

    served = Served()
    transport = asyncio.run(scenario())
    assert [body for _, body in served.asgi] == [b"one", b"two", b"three"]
    assert answers(transport.data) == [b"asgi:one", b"asgi:two", b"asgi:three"]
    assert seen == [True, True, True] and not transport.closing


def test_a_held_request_asking_to_upgrade_is_offered_with_its_body() -> None:
    offers = Offers(True)

    async def scenario() -> None:
        proto, _ = protocol(Served(), offers)
        proto.data_received(invocation(b"whole", extra=UPGRADE))
        await turns()

    asyncio.run(scenario())
    assert offers.bodies == [b"whole"]


def test_an_upgrade_asked_for_gives_its_trailer_fields_no_more_room() -> None:
    # The head's fields as they came, Upgrade included, count with a chunked body's
    # trailer fields: 40,000 bytes of Upgrade and 40,000 of trailer pass 64 KiB.
    head = (
        b"POST /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n"
        b"Upgrade: " + b"u" * 40_000 + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = b"2\r\n{}\r\n0\r\nT: " + b"z" * 40_000 + b"\r\n\r\n"
    _, transport, served = _fed([head + body])
    assert served.asgi == []
    assert transport.data.startswith(b"HTTP/1.1 431") and transport.closing


def test_a_connect_is_answered_and_the_connection_closed() -> None:
    async def scenario() -> Recording:
        proto, transport = protocol(served, None)
        proto.data_received(b"CONNECT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        await turns()
        return transport

    served = Served()
    transport = asyncio.run(scenario())
    assert answers(transport.data) == [b"asgi:"] and transport.closing


@pytest.mark.parametrize(
    "codings",
    [b"gzip, chunked", b"identity, chunked", b"gzip\r\nTransfer-Encoding: chunked"],
)
def test_a_transfer_coding_other_than_chunked_is_refused_501(codings: bytes) -> None:
    # llhttp de-chunks the body and leaves the coding before chunked applied: refused
    # after the answer owed to the request before it, and never offered to the app.
    refused = (
        b"POST /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
        + codings + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )  # fmt: skip
    _, transport, served = _fed([invocation(b"first") + refused])
    assert served.asgi == [("/endpoints/e/invocations", b"first")]
    first, rest = transport.data.split(b"HTTP/1.1 501 ", 1)
    assert answers(first) == [b"asgi:first"]
    assert rest.startswith(b"Not Implemented") and transport.closing
    assert rest.endswith(b"Transfer codings other than chunked are not implemented.")


@pytest.mark.parametrize("coding", [b"chunked", b" Chunked ", b",chunked"])
def test_chunked_alone_however_written_is_served(coding: bytes) -> None:
    data = (
        b"POST /endpoints/e/invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
        + coding + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )  # fmt: skip
    _, transport, served = _fed([data])
    assert served.asgi == [("/endpoints/e/invocations", b"{}")]
    assert answers(transport.data) == [b"asgi:{}"] and not transport.closing
