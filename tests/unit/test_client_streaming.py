"""ConnectionPool.stream against small real servers on loopback: bounded memory both ways.

The servers are raw asyncio servers in the test's own loop, so each test controls exactly
when the instance reads, answers, stalls or dies.
"""

from __future__ import annotations

import asyncio
import os
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from shipyard.errors import UpstreamError
from shipyard.http.client import ConnectionPool, StreamedResponse
from tests.conftest import wait_until_async

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

MiB = 1 << 20


class Server:
    """A loopback server running ``handler`` per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed_by_client = 0
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.CancelledError, ConnectionError):
            pass  # the test is over or the client left; Python 3.11 would log it as an error
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Server]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> dict[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    fields = [line.split(b":", 1) for line in head.split(b"\r\n")[1:] if line]
    return {name.strip().lower(): value.strip() for name, value in fields}


async def body_pieces(
    reader: asyncio.StreamReader, headers: dict[bytes, bytes]
) -> AsyncIterator[bytes]:
    """The request body as it arrives, decoding Content-Length or chunked framing."""
    if headers.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            yield await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
        return
    left = int(headers.get(b"content-length", b"0"))
    while left:
        data = await reader.read(min(left, MiB))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        yield data


async def read_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes:
    return b"".join([piece async for piece in body_pieces(reader, headers)])


async def serve_requests(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bytes = b"ok"
) -> None:
    """Answer every request on the connection with ``answer``, keep-alive."""
    while True:
        try:
            await read_body(reader, await read_head(reader))
        except asyncio.IncompleteReadError:
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()


def reading(response: StreamedResponse) -> bool:
    """Whether the client still reads the socket the answer arrives on."""
    transport = response._reader.conn.transport
    assert transport is not None
    return transport.is_reading()


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pattern(i: int) -> bytes:
    return bytes([i % 251]) * MiB


async def collect(pool: ConnectionPool, body: bytes = b"x") -> tuple[int, bytes]:
    async with pool.stream(b"POST", b"/invocations", [], body) as response:
        return response.status, b"".join([chunk async for chunk in response.chunks()])


def test_a_large_upload_and_download_hold_little_memory() -> None:
    """200 MB go up to a slow reader and 200 MB come back to a slow consumer.

    Without flow control either way, the whole payload would pile up in this process.
    """
    total = 200
    received: list[int] = []  # server side: bytes, crc

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        crc = count = 0
        async for piece in body_pieces(reader, await read_head(reader)):
            crc, count = zlib.crc32(piece, crc), count + len(piece)
            await asyncio.sleep(0.001)  # a slow reader
        received.extend([count, crc])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (total * MiB))
        for i in range(total):
            writer.write(pattern(i))
            await writer.drain()

    async def main() -> None:
        baseline, peak = rss_bytes(), 0
        sent_crc = 0

        async def upload() -> AsyncIterator[bytes]:
            nonlocal peak, sent_crc
            for i in range(total):
                chunk = pattern(i)
                sent_crc = zlib.crc32(chunk, sent_crc)
                yield chunk
                peak = max(peak, rss_bytes())

        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(
                b"POST", b"/invocations", [], upload(), content_length=total * MiB
            ) as response:
                crc = count = 0
                async for chunk in response.chunks():
                    crc, count = zlib.crc32(chunk, crc), count + len(chunk)
                    if count % MiB < len(chunk):
                        await asyncio.sleep(0.003)  # a slow consumer
                    peak = max(peak, rss_bytes())
            pool.close()
        assert received == [total * MiB, sent_crc]
        assert count == total * MiB
        expected = 0
        for i in range(total):
            expected = zlib.crc32(pattern(i), expected)
        assert crc == expected
        assert peak - baseline < 64 * MiB, f"RSS grew by {(peak - baseline) / MiB:.0f} MiB"

    asyncio.run(main())


@pytest.mark.parametrize("how", ["request", "stream"])
def test_a_streamed_request_body_waits_for_a_slow_reader(how: str) -> None:
    """The body is pulled only as fast as the instance reads it, on both pool paths."""
    total = 256
    produced = 0
    go = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        headers = await read_head(reader)
        await go.wait()  # read nothing until the test has looked
        count = sum([len(piece) async for piece in body_pieces(reader, headers)])
        answer = str(count).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()

    async def body() -> AsyncIterator[bytes]:
        nonlocal produced
        chunk = b"b" * MiB
        for _ in range(total):
            produced += len(chunk)
            yield chunk

    async def send(pool: ConnectionPool) -> bytes:
        if how == "request":
            response = await pool.request(b"POST", b"/", [], body(), content_length=total * MiB)
            return response.body
        async with pool.stream(b"POST", b"/", [], body(), content_length=total * MiB) as streamed:
            return b"".join([chunk async for chunk in streamed.chunks()])

    async def main() -> None:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            task = asyncio.create_task(send(pool))
            await asyncio.sleep(0.3)
            # The kernel's socket buffers hold a few MB; the rest must wait in the iterator.
            assert produced < 32 * MiB
            go.set()
            assert await task == str(total * MiB).encode()
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["request", "stream"])
def test_an_instance_that_dies_while_the_body_waits_stops_the_upload(how: str) -> None:
    """The rest of a 1 GB body is not pulled (read from storage) once the instance is gone."""
    produced = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        await asyncio.sleep(0.2)  # the client fills the socket and waits for it to drain
        writer.transport.abort()

    async def body() -> AsyncIterator[bytes]:
        nonlocal produced
        chunk = b"d" * MiB
        for _ in range(1024):
            produced += len(chunk)
            yield chunk

    async def main() -> None:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            with pytest.raises(UpstreamError) as err:
                if how == "request":
                    await pool.request(b"POST", b"/", [], body(), content_length=1024 * MiB)
                else:
                    async with pool.stream(b"POST", b"/", [], body(), content_length=1024 * MiB):
                        pass
            assert err.value.sent
            assert produced < 64 * MiB
            pool.close()

    asyncio.run(main())


def test_a_slow_consumer_pauses_reading_the_response() -> None:
    total = 128
    accepted = 0  # bytes the server's socket took

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        await read_body(reader, await read_head(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (total * MiB))
        for _ in range(total):
            writer.write(b"r" * MiB)
            await writer.drain()
            accepted += MiB

    async def main() -> None:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(b"POST", b"/", [], b"x") as response:
                chunks = response.chunks()
                count = len(await anext(chunks))
                await wait_until_async(lambda: not reading(response), "reading paused")
                # From here the server can only fill the kernel's buffers.
                assert accepted < 32 * MiB  # ~1 MiB held here, the rest in kernel buffers
                async for chunk in chunks:
                    count += len(chunk)
            assert count == total * MiB
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_answer_is_handed_over_before_it_has_all_arrived(framing: str) -> None:
    pieces = [b"first piece,", b"second piece,", b"last piece"]
    first_seen = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(reader, await read_head(reader))
        if framing == "chunked":
            writer.write(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n")
            frames = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
        else:
            length = sum(map(len, pieces))
            writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n" % length)
            frames = [*pieces, b""]
        writer.write(b"Content-Type: text/plain\r\nX-Custom: Yes\r\n\r\n" + frames[0])
        await writer.drain()
        await first_seen.wait()  # the rest only once the client has the first piece
        writer.write(b"".join(frames[1:]))
        await writer.drain()

    async def main() -> None:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(b"POST", b"/invocations", [], b"in") as response:
                assert response.status == 201
                assert response.header(b"content-type") == b"text/plain"
                assert (b"x-custom", b"Yes") in response.headers
                assert response.header(b"absent") is None
                received = []
                async for chunk in response.chunks():
                    received.append(chunk)
                    first_seen.set()
            assert received[0] == pieces[0]
            assert b"".join(received) == b"".join(pieces)
            pool.close()

    asyncio.run(main())


def test_leaving_early_closes_the_connection_and_the_pool_stays_usable() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(reader, await read_head(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (64 * MiB))
        try:
            for _ in range(64):
                writer.write(b"e" * MiB)
                await writer.drain()
        except ConnectionError:
            closed.set()
            return
        await reader.read()  # would wait for ever if the client kept the connection
        closed.set()

    async def main() -> None:
        server = Server(handler)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(b"POST", b"/", [], b"x") as response:
                async for _ in response.chunks():
                    break
            await asyncio.wait_for(closed.wait(), 10)
            server.handler = serve_requests
            assert (await pool.request(b"POST", b"/", [], b"x")).body == b"ok"
            assert server.connections == 2
            pool.close()

    asyncio.run(main())


def test_a_fully_read_stream_returns_its_connection_to_the_pool() -> None:
    async def main() -> None:
        server = Server(serve_requests)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            assert await collect(pool) == (200, b"ok")
            assert (await pool.request(b"POST", b"/", [], b"x")).body == b"ok"
            assert await collect(pool) == (200, b"ok")
            assert server.connections == 1
            pool.close()

    asyncio.run(main())


def test_a_stream_left_with_its_whole_answer_unread_keeps_the_connection() -> None:
    """The answer arrived whole, so the connection is between exchanges: it is reused."""

    async def main() -> None:
        server = Server(serve_requests)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(b"POST", b"/", [], b"x") as response:
                # "ok" arrives; nobody reads it
                await wait_until_async(lambda: response._reader.complete, "the whole answer")
            assert (await pool.request(b"POST", b"/", [], b"x")).body == b"ok"
            assert server.connections == 1
            with pytest.raises(RuntimeError):
                async for _ in response.chunks():
                    pass
            pool.close()

    asyncio.run(main())


def test_cancelling_a_stream_closes_its_connection() -> None:
    answering, closed = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(reader, await read_head(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nstart")
        await writer.drain()
        answering.set()
        await reader.read()  # the rest never comes; returns when the client closes
        closed.set()

    async def main() -> None:
        server = Server(handler)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            task = asyncio.create_task(collect(pool))
            await asyncio.wait_for(answering.wait(), 10)  # the stream is under way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(closed.wait(), 10)
            server.handler = serve_requests
            assert await collect(pool) == (200, b"ok")
            assert server.connections == 2
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_instance_that_dies_mid_body_is_an_upstream_error(framing: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(reader, await read_head(reader))
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nhello")
        await writer.drain()
        writer.transport.abort()

    async def main() -> None:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            received = []
            with pytest.raises(UpstreamError) as err:
                async with pool.stream(b"POST", b"/", [], b"x") as response:
                    async for chunk in response.chunks():
                        received.append(chunk)
            assert err.value.sent
            assert b"".join(received) == b"hello"
            pool.close()

    asyncio.run(main())


def test_a_malformed_answer_is_an_upstream_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(reader, await read_head(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nnot hex\r\n")
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            with pytest.raises(UpstreamError, match="bad response") as err:
                await collect(pool)
            assert err.value.sent
            pool.close()

    asyncio.run(main())


def test_nothing_listening_is_an_upstream_error_not_sent() -> None:
    async def main() -> None:
        async with Server(serve_requests).running() as server:
            port = server.port
        pool = ConnectionPool("127.0.0.1", port)
        with pytest.raises(UpstreamError) as err:
            await collect(pool)
        assert not err.value.sent

    asyncio.run(main())


def test_an_iterated_body_without_a_length_goes_out_chunked() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                headers = await read_head(reader)
            except asyncio.IncompleteReadError:
                return
            seen.append((headers.get(b"transfer-encoding", b""), await read_body(reader, headers)))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
            await writer.drain()

    async def body() -> AsyncIterator[bytes]:
        for piece in (b"abc", b"", b"defgh", b"i" * 100_000):
            yield piece

    async def main() -> None:
        server = Server(handler)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            for _ in range(2):  # the second on the same connection: the first ended cleanly
                async with pool.stream(b"POST", b"/", [], body()) as response:
                    assert b"".join([c async for c in response.chunks()]) == b"done"
            assert seen == [(b"chunked", b"abcdefgh" + b"i" * 100_000)] * 2
            assert server.connections == 1
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("declared", [5, 20])
def test_a_body_that_does_not_match_its_content_length_is_refused(declared: int) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"0123456789"

    async def main() -> None:
        server = Server(serve_requests)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            with pytest.raises(UpstreamError, match="longer than its|ended after") as err:
                async with pool.stream(b"POST", b"/", [], body(), content_length=declared):
                    pass
            assert err.value.sent
            assert await collect(pool) == (200, b"ok")
            assert server.connections == 2  # the half-sent connection was not reused
            pool.close()

    asyncio.run(main())


def test_an_error_from_the_body_propagates_and_closes_the_connection() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"part"
        raise OSError("the input went away")

    async def main() -> None:
        server = Server(serve_requests)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            with pytest.raises(OSError, match="the input went away"):
                async with pool.stream(b"POST", b"/", [], body(), content_length=100):
                    pass
            assert await collect(pool) == (200, b"ok")
            assert server.connections == 2
            pool.close()

    asyncio.run(main())


def test_an_answer_that_comes_before_the_body_is_read_stops_the_upload() -> None:
    """An instance may refuse a request whole (413) without reading its body."""
    produced = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 7\r\n\r\ntoo big")
        await writer.drain()
        await asyncio.sleep(30)  # never reads the body, never closes

    async def body() -> AsyncIterator[bytes]:
        nonlocal produced
        for _ in range(1024):
            produced += MiB
            yield b"z" * MiB

    async def main() -> None:
        server = Server(handler)
        async with server.running():
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(b"POST", b"/", [], body(), content_length=1024 * MiB) as r:
                assert r.status == 413
                assert b"".join([c async for c in r.chunks()]) == b"too big"
            assert produced < 64 * MiB
            assert repr(pool).endswith("idle=0)")  # half a request went out: not reused
            pool.close()

    asyncio.run(main())


def test_a_chunked_answer_is_handed_over_in_the_instance_s_chunks() -> None:
    """Chunks written a few bytes at a time still come out whole, one piece per chunk (the
    streaming door makes one event of each); one larger than 256 KiB comes in parts."""
    big = os.urandom(600 * 1024)
    chunks = [b"first chunk", b"second, a little longer", big, b"last"]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(reader, await read_head(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for chunk in chunks:
            wire = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            step = 5 if len(chunk) < 100 else 64 * 1024
            for start in range(0, len(wire), step):
                writer.write(wire[start : start + step])
                await writer.drain()
                await asyncio.sleep(0.002)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main() -> list[bytes]:
        async with Server(handler).running() as server:
            pool = ConnectionPool("127.0.0.1", server.port)
            async with pool.stream(b"POST", b"/invocations", [], b"x") as response:
                pieces = [chunk async for chunk in response.chunks()]
            pool.close()
            return pieces

    pieces = asyncio.run(main())
    assert pieces[:2] == chunks[:2] and pieces[-1] == chunks[-1]
    middle = pieces[2:-1]
    assert b"".join(middle) == big and len(middle) > 1
    assert max(len(p) for p in middle) <= 256 * 1024 + 64 * 1024
