"""The pooled gateway → instance client against small real servers on loopback."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from shipyard.errors import UpstreamError
from shipyard.http.client import ConnectionPool
from tests.conftest import wait_until_async

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


def test_keep_alive_connections_are_reused_and_chunked_answers_read() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: text/plain\r\n\r\n"
                + f"{len(body):x}\r\n".encode()
                + body
                + b"\r\n0\r\n\r\n"
            )
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, port = await _serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        for i in range(5):
            response = await pool.request(b"POST", b"/invocations", [], f"hello {i}".encode())
            assert response.status == 200 and response.body == f"hello {i}".encode()
            assert response.header(b"content-type") == b"text/plain"
        pool.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert connections == 1


def test_a_connection_the_instance_closed_while_idle_is_retried_once() -> None:
    closed = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal closed
        await _read_request(reader)
        # Answer, then close: the pooled connection is dead on its next use.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed += 1

    async def main() -> None:
        server, port = await _serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        for i in range(3):
            assert (await pool.request(b"POST", b"/invocations", [], b"x")).body == b"ok"
            count = i + 1  # the next request goes out on a connection already closed
            await wait_until_async(lambda: closed == count, "the instance closed")  # noqa: B023
        pool.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_an_instance_that_dies_mid_request_is_an_error_marked_sent() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.transport.abort()

    async def main() -> None:
        server, port = await _serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        with pytest.raises(UpstreamError) as err:
            await pool.request(b"POST", b"/invocations", [], b"x")
        assert err.value.sent
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError) as err:
            await pool.request(b"POST", b"/invocations", [], b"x")
        assert not err.value.sent  # nothing listens: it never reached an instance

    asyncio.run(main())


class Odd:
    """An instance that misbehaves as each request's body asks, keeping every body it was
    sent (an execution each) and counting its connections:

    - ``cut``: an answer's head and part of its body, then the connection closed;
    - ``early``: a 103 Early Hints, then the answer;
    - ``extra``: the answer and, in the same write, a second one no request asked for;
    - ``eof...``: an HTTP/1.0 answer with no length, the rest of the body, then a close;
    - ``torn``: part of an answer's head, then a close; ``reset``: a reset mid-body;
    - anything else: an echo."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.connections = 0

    async def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                body = await _read_request(reader)
                self.bodies.append(body)
                if body == b"cut":
                    writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"part')
                    await writer.drain()
                    break
                if body.startswith(b"eof"):  # HTTP/1.0's way: the body ends at the close
                    writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                    writer.write(body[3:])
                    await writer.drain()
                    break
                if body == b"torn":  # a head cut short
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/pl")
                    await writer.drain()
                    break
                if body == b"reset":  # a body with no length, then a reset (RST, no FIN)
                    writer.write(b"HTTP/1.0 200 OK\r\n\r\npart")
                    await writer.drain()
                    linger = struct.pack("ii", 1, 0)
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, linger
                    )
                    writer.transport.abort()
                    return
                if body == b"early":
                    writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)  # the answer in a read of its own
                answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                if body == b"extra":
                    answer += b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def _ask(pool: ConnectionPool, how: str, body: bytes) -> tuple[int, bytes]:
    """The status and whole body of ``body``'s answer, by ``request`` or ``stream``."""
    if how == "request":
        response = await pool.request(b"POST", b"/invocations", [], body)
        return response.status, response.body
    async with pool.stream(b"POST", b"/invocations", [], body) as streamed:
        return streamed.status, b"".join([chunk async for chunk in streamed.chunks()])


def test_an_answer_cut_short_is_an_error_and_never_sent_again() -> None:
    # Sent again, the model would run twice (the answer had begun: the request reached it).
    odd = Odd()

    async def main() -> None:
        server, port = await _serve(odd.handler)
        pool = ConnectionPool("127.0.0.1", port)
        assert (await pool.request(b"POST", b"/invocations", [], b"warm")).body == b"warm"
        with pytest.raises(UpstreamError) as err:
            await pool.request(b"POST", b"/invocations", [], b"cut")  # on the reused connection
        assert err.value.sent
        pool.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert odd.bodies == [b"warm", b"cut"]


@pytest.mark.parametrize("how", ["request", "stream"])
def test_an_interim_answer_is_passed_over_for_the_answer_after_it(how: str) -> None:
    odd = Odd()

    async def main() -> list[tuple[int, bytes]]:
        server, port = await _serve(odd.handler)
        pool = ConnectionPool("127.0.0.1", port)
        got = [await _ask(pool, how, b"early"), await _ask(pool, how, b"next")]
        pool.close()
        server.close()
        await server.wait_closed()
        return got

    assert asyncio.run(main()) == [(200, b"early"), (200, b"next")]
    assert odd.connections == 1


@pytest.mark.parametrize("how", ["request", "stream"])
def test_an_answer_that_ends_with_its_connection_is_whole_there(how: str) -> None:
    odd = Odd()

    async def main() -> list[Any]:
        server, port = await _serve(odd.handler)
        pool = ConnectionPool("127.0.0.1", port)
        got: list[Any] = [await _ask(pool, how, b"eof and the rest"), await _ask(pool, how, b"eof")]
        for broken in (b"torn", b"reset"):
            try:
                got.append(await _ask(pool, how, broken))
            except UpstreamError as exc:
                got.append(type(exc))
        pool.close()
        server.close()
        await server.wait_closed()
        return got

    assert asyncio.run(main()) == [
        (200, b" and the rest"), (200, b""), UpstreamError, UpstreamError
    ]  # fmt: skip


def test_an_answer_no_request_asked_for_ends_its_connection() -> None:
    odd = Odd()

    async def main() -> list[bytes]:
        server, port = await _serve(odd.handler)
        pool = ConnectionPool("127.0.0.1", port)
        got = [(await pool.request(b"POST", b"/invocations", [], body)).body
               for body in (b"extra", b"mine")]  # fmt: skip
        pool.close()
        server.close()
        await server.wait_closed()
        return got

    assert asyncio.run(main()) == [b"extra", b"mine"]
    assert odd.connections == 2


def test_an_answer_no_request_asked_for_leaves_the_answer_before_it_as_it_was() -> None:
    odd = Odd()

    async def main() -> list[tuple[bytes, bytes]]:
        server, port = await _serve(odd.handler)
        pool = ConnectionPool("127.0.0.1", port)
        response = await pool.request(b"POST", b"/invocations", [], b"extra")
        pool.close()
        server.close()
        await server.wait_closed()
        return response.headers

    assert asyncio.run(main()) == [(b"content-length", b"5")]


def test_streamed_request_bodies_carry_the_given_length() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        answer = str(len(body)).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()
        writer.close()

    async def chunks() -> object:
        for _ in range(4):
            yield b"y" * 100_000

    async def main() -> None:
        server, port = await _serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        response = await pool.request(
            b"POST",
            b"/invocations",
            [],
            chunks(),  # type: ignore[arg-type]
            content_length=400_000,
        )
        assert response.body == b"400000"
        pool.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_ping_goes_on_a_connection_of_its_own_even_with_idle_ones_pooled() -> None:
    """An instance whose loop is held answers pings only on new connections, so a ping
    never takes a kept-alive one (nor is kept alive itself)."""
    heads: list[bytes] = []
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            heads.append(head)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, port = await _serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        await pool.request(b"GET", b"/other", [])
        assert pool.idle_count() == 1
        for _ in range(2):
            response = await pool.ping()
            assert (response.status, response.body) == (200, b"ok")
        assert pool.idle_count() == 1  # no ping connection joined it
        pool.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert connections == 3
    assert [h.split(b"\r\n")[0] for h in heads] == [
        b"GET /other HTTP/1.1",
        b"GET /ping HTTP/1.1",
        b"GET /ping HTTP/1.1",
    ]
    assert all(b"Connection: close" in h for h in heads[1:])


@pytest.mark.parametrize("instance", ["reads", "hangs up", "is given up on"])
def test_written_returns_once_a_large_body_is_out(tmp_path: Any, instance: str) -> None:
    """``written`` waits while a body larger than the socket's buffer waits for the
    instance to read it, and no longer: once the instance has read it (before its
    answer), once the connection is gone, or once the gateway gives up on the request
    (a deadline) while the instance still reads nothing."""
    path = str(tmp_path / "instance.sock")
    body = b"x" * (4 << 20)

    async def main() -> None:
        accepted = asyncio.Event()
        go = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set()
            await go.wait()
            if instance == "hangs up":
                writer.transport.abort()
                return
            got = await _read_request(reader)
            if instance == "is given up on":
                return  # nobody waits for the answer
            await go_on.wait()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d" % (len(str(len(got))), len(got))
            )
            await writer.drain()
            writer.close()

        go_on = asyncio.Event()
        server = await asyncio.start_unix_server(handler, path)
        pool = ConnectionPool("127.0.0.1", 1, socket_path=path)
        await asyncio.wait_for(pool.written(), 1)  # nothing is going out
        request = asyncio.create_task(pool.request(b"POST", b"/invocations", [], body))
        await accepted.wait()
        await wait_until_async(lambda: pool._writing.paused == 1, "the write paused")
        written = asyncio.create_task(pool.written())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not written.done()  # the instance has read nothing yet
        if instance == "is given up on":
            request.cancel()  # the connection is closed with its bytes unsent
            await asyncio.wait_for(written, 10)
            with pytest.raises(asyncio.CancelledError):
                await request
        go.set()
        await asyncio.wait_for(written, 10)
        if instance == "reads":
            assert not request.done()  # out, and not answered yet
            go_on.set()
            response = await asyncio.wait_for(request, 10)
            assert response.status == 200 and response.body == str(len(body)).encode()
        elif instance == "hangs up":
            with pytest.raises(UpstreamError):
                await asyncio.wait_for(request, 10)
        assert pool._writing.paused == 0
        pool.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
