"""A pooled HTTP/1.1 client for gateway → instance traffic.

Written here rather than taken from httpx or aiohttp because it is the hot path of every
invocation: it does only what that hop needs (one request at a time per keep-alive
connection to a known loopback peer, bodies passed through as bytes) and parses with
httptools, the same parser uvicorn uses. bench/gateway_overhead.py measures the result.

Two ways to send a request share the pool's connections:

- ``ConnectionPool.start`` sends a request and tells its whole response to a callback
  (``request`` awaits the same): real-time invocations. A body in hand goes out at once
  on an idle connection, with no task; connecting, or a body read from an iterator, is
  done in a task of the exchange's own.
- ``ConnectionPool.stream`` hands the response body over as it arrives, holding at most
  about 1 MiB of it: asynchronous invocations, whose answers may be as large as their
  inputs (up to 1 GB), and response streaming. A chunked answer is handed over in the
  instance's own chunks (up to 256 KiB each; larger ones in parts). It swaps in a parser
  of its own for the one exchange, so the ``request`` path pays nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol

import httptools

from shipyard.errors import ResponseTooLarge, UpstreamError

log = logging.getLogger(__name__)

_STREAM_BUFFER_BYTES = 1 << 20
"""Response bytes a stream holds unread before it stops reading from the socket."""
_PART_BYTES = 256 * 1024
"""Most bytes of one HTTP chunk a stream gathers before handing them over unfinished."""


class Response:
    """An instance's answer: status, headers (lower-cased names) and body. A header is
    added by ``add_header``."""

    __slots__ = ("status", "headers", "body", "_first")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self._first: dict[bytes, bytes] | None = None
        """Each header's first value by name, made on the first lookup (an answer's
        headers are looked up several times, most of them absent)."""

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case), None when absent."""
        first = self._first
        if first is None:
            first = self._first = dict(reversed(self.headers))
        return first.get(name)

    def add_header(self, name: bytes, value: bytes) -> None:
        """Add a header (a lower-case name) after the instance's: the way to add one, so
        that ``header`` sees it."""
        self.headers.append((name, value))
        self._first = None

    def __repr__(self) -> str:
        return f"Response(status={self.status}, bytes={len(self.body)})"


class StreamedResponse:
    """An instance's answer whose body is read as it arrives; see ConnectionPool.stream.

    ``status`` and ``headers`` (lower-cased names) are known on entry; the body comes from
    ``chunks()``, once, and only inside the ``async with`` that produced the response.
    """

    __slots__ = ("status", "headers", "_reader")

    def __init__(self, reader: _StreamReader) -> None:
        assert reader.status is not None
        self.status: int = reader.status
        self.headers = reader.headers
        self._reader = reader

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield the body until it ends: chunk by chunk when the instance answers chunked
        (see _StreamReader.on_body), else in the pieces the socket delivers.

        Raises:
            UpstreamError: the connection failed or the answer was malformed before the
                body ended (``sent`` is True); the pieces received before are yielded.
            RuntimeError: read after its ``async with`` was left.
        """
        while (chunk := await self._reader.next_chunk()) is not None:
            yield chunk

    def __repr__(self) -> str:
        return f"StreamedResponse(status={self.status})"


class _Waiter(Protocol):
    """What waits for a connection's answer: the future ``ping`` awaits, or an _Exchange."""

    def done(self) -> bool: ...

    def set_result(self, response: Response, /) -> None: ...

    def set_exception(self, exc: BaseException, /) -> None: ...


OnAnswer = Callable[[Response | None, BaseException | None], None]
"""Told the outcome of a started request (ConnectionPool.start): the answer, or the error
``request`` raises (an UpstreamError, or what a streamed body raised)."""


def in_task(work: Coroutine[Any, Any, Response], on_answer: OnAnswer) -> Callable[[], None]:
    """Run ``work`` in a task and tell ``on_answer`` its outcome; returns what abandons
    it (the task cancelled, ``on_answer`` never called). For a sender whose request must
    await something first (connecting, loading a model): the caller does not fork."""
    task = asyncio.get_running_loop().create_task(work)
    told = [on_answer]

    def finished(task: asyncio.Task[Response]) -> None:
        tell = told.pop() if told else None
        if tell is None or task.cancelled():
            return
        error = task.exception()
        tell(None if error is not None else task.result(), error)

    def abandon() -> None:
        told.clear()
        task.cancel()

    task.add_done_callback(finished)
    return abandon


def _ends_at_close(status: int, headers: list[tuple[bytes, bytes]]) -> bool:
    """An answer whose body is all it sends until it closes the connection (RFC 9112,
    6.3): one with a body, and neither a Content-Length nor a Transfer-Encoding. A
    server speaking HTTP/1.0, as Python's http.server does by default, answers so;
    the parser has no end of input to be told, so the connection's clean end is it."""
    if status < 200 or status in (204, 304):
        return False
    return all(name not in (b"content-length", b"transfer-encoding") for name, _ in headers)


class _Writing:
    """How many connections of one pool wait for their instance to read before they can
    write the rest of a request (their transport's buffer past its high-water mark), and
    an event for when none does. Only large bodies ever pause, so small requests pay
    nothing for it."""

    __slots__ = ("paused", "_none")

    def __init__(self) -> None:
        self.paused = 0
        self._none: asyncio.Event | None = None

    def pause(self) -> None:
        self.paused += 1

    def resume(self) -> None:
        self.paused -= 1
        if not self.paused and self._none is not None:
            self._none.set()
            self._none = None

    async def wait(self) -> None:
        while self.paused:
            if self._none is None:
                self._none = asyncio.Event()
            await self._none.wait()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, writing: _Writing) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._waiter: _Waiter | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self.limit: int | None = None
        """Most body bytes the exchange in progress takes; None: no limit."""
        self._drained: asyncio.Event | None = None
        self.writing = writing
        """Its pool's count of paused connections, told when this one pauses and
        resumes (``ConnectionPool.written``)."""
        self._paused = False
        """Counted in ``writing``: paused, and neither resumed nor closed since."""
        self.received = False
        """Bytes of an answer arrived during the exchange in progress (then a failure may
        have been the request's doing, and it is not sent again)."""
        self._answered = False
        """An answer was complete in the read being parsed."""
        self._head_done = False
        """The answer's head was parsed (its body may run to the connection's end)."""
        self.stream: _StreamReader | None = None
        """The streamed exchange in progress, told when the connection fails."""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._answered = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad response from instance: {exc}", sent=True))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        stream = self.stream
        if exc is not None:  # reset, not ended: whatever came is not the whole answer
            pass
        elif stream is not None:
            if stream.ends_at_close():
                stream.on_message_complete()
        elif (
            self._head_done
            and waiter is not None
            and not waiter.done()
            and _ends_at_close(self.parser.get_status_code(), self._headers)
        ):
            waiter.set_result(
                Response(self.parser.get_status_code(), self._headers, b"".join(self._body))
            )
        self._fail(UpstreamError("instance closed the connection", sent=True))
        if self._drained is not None:
            self._drained.set()
        self._unpause()

    def pause_writing(self) -> None:
        self._drained = asyncio.Event()
        if not self._paused:
            self._paused = True
            self.writing.pause()

    def resume_writing(self) -> None:
        if self._drained is not None:
            self._drained.set()
            self._drained = None
        self._unpause()

    def _unpause(self) -> None:
        if self._paused:
            self._paused = False
            self.writing.resume()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._answered or self._waiter is None:
            # An answer no exchange asked for: after the answer in the same read (even
            # if a waiter told of that answer began another exchange at once), or with
            # none in progress. The connection's framing is lost: it carries no more,
            # and what is still parsed of this read goes to lists of its own, not to
            # the headers of the answer just given.
            self.close()
            self._headers = []
            self._body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        if self.limit is not None:
            self._size += len(body)
            if self._size > self.limit:
                if not self.closed:
                    self._fail(ResponseTooLarge(self.limit))
                    self.close()
                return
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the answer follows.
            self._headers = []
            self._body = []
            self._size = 0
            self._head_done = False
            return
        self._answered = True
        # Closed first when it cannot carry another exchange: a waiter told of the
        # answer may hand the connection back to the pool at once (_Started).
        if not self.parser.should_keep_alive():
            self.close()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            body = b"".join(self._body)
            waiter.set_result(Response(status, self._headers, body))

    # ours
    def _fail(self, exc: UpstreamError) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.stream is not None:
            self.stream.fail(exc)

    def close(self) -> None:
        self.closed = True
        # A transport closed with bytes unsent tells connection_lost only once they are
        # out, which an instance that no longer reads never lets happen.
        self._unpause()
        if self.transport is not None:
            self.transport.close()

    def begin(self, waiter: _Waiter, limit: int | None) -> None:
        """Start an exchange whose answer goes to ``waiter``: at most ``limit`` body bytes
        (None: no limit)."""
        assert self.transport is not None and self._waiter is None
        self._headers = []
        self._body = []
        self._size = 0
        self.limit = limit
        self.received = False
        self._head_done = False
        self._waiter = waiter

    async def send(self, request: bytes) -> Response:
        """Send a whole request and await its answer, outside any pool (``ping``)."""
        waiter: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.begin(waiter, None)
        assert self.transport is not None
        try:
            self.transport.write(request)
            return await waiter
        finally:
            self._waiter = None

    async def write_body(self, body: AsyncIterator[bytes]) -> None:
        """Write an iterated body as the instance reads it (the head went first)."""
        assert self.transport is not None
        async for chunk in body:
            self.transport.write(chunk)
            if self._drained is not None:
                await self._drained.wait()
                if self.closed:  # its waiter holds the error: stop reading the body
                    break


class _StreamReader:
    """Parser callbacks and a bounded body buffer for one streamed exchange on ``conn``.

    From construction until detach() its parser stands in for the connection's own, so
    the request path's callbacks stay free of any "am I streaming?" test.

    Holds at most about _STREAM_BUFFER_BYTES of unread body (plus one socket read): past
    that it pauses reading the socket, so TCP flow control slows the instance down, and
    it resumes once the consumer has taken half of it.
    """

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.parser = httptools.HttpResponseParser(self)
        # Takes over the connection's parsing until detach(); its own parser is kept.
        self._conn_parser = conn.parser
        conn.parser = self.parser
        conn.stream = self
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        """The whole response arrived (it may not all be consumed yet)."""
        self.keep_alive = False
        self.request_sent = False
        """The whole request went out, so the connection is between exchanges once the
        response is complete."""
        self.error: UpstreamError | None = None
        self.detached = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._chunked = False
        self._part: list[bytes] = []
        self._part_bytes = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer: the answer's head follows
            return
        self.status = status
        self._wake()

    def on_chunk_header(self) -> None:
        self._chunked = True

    def on_body(self, body: bytes) -> None:
        if self._chunked:
            # Held until its HTTP chunk is complete, so a chunk split over socket reads
            # still comes out whole: one chunk is one piece the model yielded, and the
            # streaming door frames one event per piece. A huge one goes on in parts.
            self._part.append(body)
            self._part_bytes += len(body)
            if self._part_bytes < _PART_BYTES:
                return
            body = self._take_part()
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _STREAM_BUFFER_BYTES and not self._paused:
            self._paused = True
            self._transport().pause_reading()
        self._wake()

    def on_chunk_complete(self) -> None:
        if self._part:
            self.on_body(self._take_part())

    def _take_part(self) -> bytes:
        part = self._part[0] if len(self._part) == 1 else b"".join(self._part)
        self._part = []
        self._part_bytes = 0
        self._chunked = False  # set again by the next chunk's header
        return part

    def on_message_complete(self) -> None:
        if self.status is None:  # an interim answer (100 Continue, 103 Early Hints) ended
            self.headers = []
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()
        if not self.request_sent:
            # Answered before reading the whole body: a sender waiting for the socket to
            # drain would wait for ever, so wake it to stop. (A failure needs no such
            # call: connection_lost sets the same event.)
            drained = self.conn._drained
            if drained is not None:
                drained.set()

    # ours
    def ends_at_close(self) -> bool:
        """The answer's head came and its body runs to the connection's end."""
        return (
            not self.complete
            and self.error is None
            and self.status is not None
            and _ends_at_close(self.status, self.headers)
        )

    def fail(self, exc: UpstreamError) -> None:
        if not self.complete and self.error is None:
            self.error = exc
            self._wake()

    def _transport(self) -> asyncio.Transport:
        assert self.conn.transport is not None
        return self.conn.transport

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def write(self, request: bytes) -> None:
        """Write a whole request at once."""
        self._transport().write(request)
        self.request_sent = True

    async def send(
        self, head: bytes, body: bytes | AsyncIterator[bytes], length: int | None
    ) -> None:
        """Write the request, waiting whenever the socket's write buffer is full.

        Without ``length`` an iterated body goes out chunked. Stops early, leaving the
        connection unfit for reuse, when the instance answers in full before reading all
        of it.
        """
        transport = self._transport()
        if isinstance(body, bytes):
            transport.write(head + body)
            self.request_sent = True
            return
        transport.write(head)
        sent = 0
        async for chunk in body:
            sent += len(chunk)
            if length is not None and sent > length:
                raise _length_mismatch(sent, length)
            if length is not None:
                transport.write(chunk)
            elif chunk:  # an empty chunk would end a chunked body
                transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            drained = self.conn._drained
            if drained is not None:
                await drained.wait()
            if self.error is not None:
                raise self.error
            if self.complete:
                return
        if length is None:
            transport.write(b"0\r\n\r\n")
        elif sent != length:
            raise _length_mismatch(sent, length)
        self.request_sent = True

    def sender_done(self, sender: asyncio.Task[None]) -> None:
        """A body that failed to go out fails the exchange, so a reader never waits for an
        answer the instance will not give."""
        if sender.cancelled():
            return
        exc = sender.exception()
        if exc is not None:
            self.fail(
                exc
                if isinstance(exc, UpstreamError)
                else UpstreamError(f"sending the request body failed: {exc}", sent=True)
            )

    async def wait_head(self) -> None:
        while self.status is None:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def next_chunk(self) -> bytes | None:
        """The next piece of body, or None at its end."""
        if self.detached:
            raise RuntimeError("a streamed response was read after its `async with` ended")
        while not self._chunks:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= _STREAM_BUFFER_BYTES // 2:
            self._paused = False
            self._transport().resume_reading()
        return chunk

    def detach(self) -> bool:
        """End the exchange; return whether the connection can carry another one.

        It can when the whole request went out and the whole response came in on a
        keep-alive connection: then the connection's own parser, which sits between
        messages, takes over again.
        """
        self.detached = True
        self._chunks.clear()
        conn = self.conn
        conn.stream = None
        if not (self.complete and self.request_sent and self.keep_alive) or conn.closed:
            return False
        conn.parser = self._conn_parser
        if self._paused:
            self._transport().resume_reading()
        return True


class ConnectionPool:
    """Keep-alive connections to one instance, reused LIFO so hot ones stay warm.

    With ``socket_path`` (an instance on this host that also listens on a Unix socket,
    backends/local.py) requests go there rather than to ``host:port``: an echo request
    costs the gateway 0.92x and the instance 0.89x the CPU it does over TCP on loopback
    (bench/results/instance_sockets.md). ``/ping`` always goes to the
    TCP port, which is what the container contract promises and what the instance's
    PingStandby answers on while a long call holds its loop. Should the socket be gone
    (no file, or no one listening), the pool goes on over TCP; any other failure to
    connect there (a full queue while a long call holds the instance's loop, no free
    descriptor) sends that one connection over TCP.
    """

    def __init__(
        self, host: str, port: int, *, socket_path: str | None = None, max_idle: int = 64
    ) -> None:
        self.host = host
        self.port = port
        self.socket_path = socket_path
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._host_header = f"{host}:{port}".encode()
        self._writing = _Writing()

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}"
        if self.socket_path is not None:
            where += f" via {self.socket_path}"
        return f"ConnectionPool({where}, idle={len(self._idle)})"

    def idle_count(self) -> int:
        """Connections kept open between requests, ready for the next one."""
        return len(self._idle)

    def _idle_connection(self) -> _Connection | None:
        """The connection used last that is still open (LIFO, so hot ones stay warm)."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _acquire(self) -> tuple[_Connection, bool]:
        conn = self._idle_connection()
        if conn is not None:
            return conn, True
        return await self._connect(), False

    async def _connect(self, *, tcp: bool = False) -> _Connection:
        loop = asyncio.get_running_loop()
        path = None if tcp else self.socket_path
        try:
            if path is not None:
                try:
                    _, conn = await loop.create_unix_connection(self._protocol, path)
                    return conn
                except (FileNotFoundError, ConnectionRefusedError) as exc:
                    log.warning("instance socket %s is gone (%s): going on over TCP", path, exc)
                    self.socket_path = None
                except OSError:
                    pass  # this connection over TCP
            _, conn = await loop.create_connection(self._protocol, self.host, self.port)
        except OSError as exc:
            raise UpstreamError(f"cannot connect to instance: {exc}", sent=False) from exc
        return conn

    def _protocol(self) -> _Connection:
        return _Connection(self._writing)

    async def written(self) -> None:
        """Returns once the requests this pool is sending are written to the instance
        but for what their transports' buffers hold below the low-water mark: at once
        unless a large body is still going out. For a sender with more work on this
        loop that would hold back the rest of the body (transform/runner.py)."""
        await self._writing.wait()

    def _release(self, conn: _Connection) -> None:
        if conn.closed or len(self._idle) >= self.max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    async def request(
        self,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes] = b"",
        *,
        content_length: int | None = None,
        max_body: int | None = None,
    ) -> Response:
        """Send one request and return the whole response: ``start``, awaited.

        Cancellation (a timeout above us) abandons the exchange, closing its connection,
        since its state is unknown.
        """
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        abandon = self.start(
            method,
            path,
            headers,
            body,
            max_body,
            partial(_settle, answer),
            content_length=content_length,
        )
        try:
            return await answer
        except asyncio.CancelledError:
            abandon()
            raise

    def start(
        self,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes],
        max_body: int | None,
        on_answer: OnAnswer,
        *,
        content_length: int | None = None,
    ) -> Callable[[], None]:
        """Send one request; its whole response (or the error) goes to ``on_answer`` from
        the loop's callbacks. Returns what abandons it (a deadline passed): its connection
        is closed, or its connecting cancelled, and ``on_answer`` is not called.

        A body in hand goes out at once on an idle connection, with no task; with none
        idle, or a body read from an iterator (sent with ``Content-Length:
        content_length``), the exchange connects and writes in a task of its own. A
        reused connection that the instance closed while idle fails before anything was
        read: that case is sent once more on another connection when ``body`` is bytes.
        An answer whose body passes ``max_body`` bytes is ResponseTooLarge: the gateway
        holds whole answers in memory, so one instance must not fill it.
        """
        if not isinstance(body, bytes):
            head = _request_head(
                method, path, self._host_header, headers, content_length, chunked=False
            )
            exchange = _Exchange(self, head, body, max_body, on_answer)
            exchange.go()
            return exchange.abandon
        # The common case, written out: a body in hand, sent now on an idle connection.
        parts = [method, b" ", path, b" HTTP/1.1\r\nHost: ", self._host_header, b"\r\n"]
        for name, value in headers:
            parts += [name, b": ", value, b"\r\n"]
        parts += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n"]
        head = b"".join(parts)
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                exchange = _Exchange(self, head, body, max_body, on_answer, conn)
                conn.begin(exchange, max_body)
                conn.transport.write(head + body)  # type: ignore[union-attr]
                return exchange.abandon
        exchange = _Exchange(self, head, body, max_body, on_answer)
        exchange.go()
        return exchange.abandon

    async def ping(self) -> Response:
        """``GET /ping`` on a connection of its own, closed after the answer.

        Never on a pooled connection: an instance whose loop is held by a long handler
        call answers pings only on new connections (runtime/workers.py PingStandby), and
        a health check must not wait behind anything a kept-alive connection carries.
        """
        conn = await self._connect(tcp=True)
        head = (
            b"GET /ping HTTP/1.1\r\nHost: " + self._host_header + b"\r\nConnection: close\r\n\r\n"
        )
        try:
            return await conn.send(head)
        finally:
            conn.close()

    @asynccontextmanager
    async def stream(
        self,
        method: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes] = b"",
        *,
        content_length: int | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """Send one request, streaming ``body``, and yield the response once its head is in.

        ``async with pool.stream(...) as response:`` then read ``response.chunks()``.
        Memory stays bounded both ways: ``body`` is pulled only as fast as the socket
        takes it, and at most about 1 MiB of unread response is held before reading
        pauses (see _StreamReader).

        An iterated ``body`` is sent with ``Content-Length: content_length`` when given
        (and must yield exactly that many bytes, else UpstreamError), and with chunked
        transfer-encoding otherwise. Nothing is retried, since an iterator cannot be
        replayed. The connection goes back to the pool only if the response arrived
        whole, on keep-alive; leaving early, an exception or cancellation closes it,
        because its state is unknown.

        Raises:
            UpstreamError: the connection failed or the answer was malformed; ``sent``
                says whether the request may have reached the instance. Errors from
                ``body`` itself propagate unchanged.
        """
        chunked = content_length is None and not isinstance(body, bytes)
        length = len(body) if isinstance(body, bytes) else content_length
        head = _request_head(method, path, self._host_header, headers, length, chunked=chunked)
        conn, _ = await self._acquire()
        reader = _StreamReader(conn)
        sender: asyncio.Task[None] | None = None
        if isinstance(body, bytes):
            # Handed to the transport at once, which sends it as the socket takes it:
            # no task to race against the head (response streaming's time to first byte).
            reader.write(head + body)
        else:
            # The body goes out while the answer comes in: an instance may stream its
            # answer before it has read the whole request (an echo does), and waiting for
            # the body to be sent first would then deadlock once both socket buffers are
            # full.
            sender = asyncio.create_task(reader.send(head, body, length))
            sender.add_done_callback(reader.sender_done)
        try:
            if sender is None:
                await reader.wait_head()
            else:
                await _head_or_send_failure(reader, sender)
            yield StreamedResponse(reader)
        finally:
            if sender is not None and not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await sender
            if reader.detach():
                self._release(conn)
            else:
                conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class _Exchange:
    """One request begun by ConnectionPool.start, from its connection to its answer.

    It is the waiter on its connection (set_result, set_exception), and does what follows:
    the connection back to the pool, or one more try on another connection after a
    failure on a reused one before any of the answer was read.
    """

    __slots__ = (
        "pool", "head", "body", "max_body", "on_answer", "conn", "reused", "tries", "task",
        "writing", "over",
    )  # fmt: skip

    def __init__(
        self,
        pool: ConnectionPool,
        head: bytes,
        body: bytes | AsyncIterator[bytes],
        max_body: int | None,
        on_answer: OnAnswer,
        conn: _Connection | None = None,
    ) -> None:
        self.pool = pool
        self.head = head
        self.body = body
        self.max_body = max_body
        self.on_answer = on_answer
        self.conn = conn
        """Its connection: an idle one it was sent on at once, or the one it made."""
        self.reused = conn is not None
        self.tries = 1
        self.task: asyncio.Task[None] | None = None
        self.writing: bool | Response = False
        """True while an iterated body is being written; the answer, should it come
        before the body is all written (told once it is)."""
        self.over = False

    def go(self) -> None:
        """A try not made at once (``start``): on an idle connection, else connecting
        in a task."""
        body = self.body
        if isinstance(body, bytes):
            conn = self.pool._idle_connection()
            if conn is not None:
                self.conn, self.reused = conn, True
                conn.begin(self, self.max_body)
                assert conn.transport is not None
                conn.transport.write(self.head + body)
                return
        self.task = asyncio.get_running_loop().create_task(self._connected())

    async def _connected(self) -> None:
        try:
            if isinstance(self.body, bytes):
                conn, reused = await self.pool._connect(), False
            else:
                conn, reused = await self.pool._acquire()
        except UpstreamError as exc:
            self._tell(None, exc)
            return
        self.conn, self.reused = conn, reused
        conn.begin(self, self.max_body)
        assert conn.transport is not None
        body = self.body
        if isinstance(body, bytes):
            conn.transport.write(self.head + body)
            return
        conn.transport.write(self.head)
        self.writing = True
        try:
            await conn.write_body(body)
        except BaseException as exc:
            self.writing = False
            if not self.over:
                self.over = True
                conn._waiter = None
                conn.close()
                if isinstance(exc, Exception):  # the body's own error, told unchanged
                    self._tell(None, exc)
                    return
            if not isinstance(exc, Exception):
                raise
            return
        answer, self.writing = self.writing, False
        if isinstance(answer, Response):  # answered before the body was all written
            self.pool._release(conn)
            self._tell(answer, None)

    def done(self) -> bool:
        return self.over

    def set_result(self, response: Response) -> None:
        self.over = True
        conn = self.conn
        assert conn is not None
        conn._waiter = None
        if self.writing:
            self.writing = response  # told once the body is written, as the socket allows
            return
        self.pool._release(conn)
        self._tell(response, None)

    def set_exception(self, exc: BaseException) -> None:
        self.over = True
        conn = self.conn
        assert conn is not None
        conn._waiter = None
        conn.close()
        if (
            self.reused
            and self.tries == 1
            and not conn.received
            and isinstance(self.body, bytes)
            and not isinstance(exc, ResponseTooLarge)
        ):
            self.over = False
            self.tries += 1
            self.go()
            return
        self._tell(None, exc)

    def _tell(self, response: Response | None, error: BaseException | None) -> None:
        # Once, and letting go of whoever waits: it holds ``abandon``, which holds this
        # (a reference cycle left to the garbage collector on every request otherwise).
        on_answer, self.on_answer = self.on_answer, _ignore
        # Called from the connection's parser: a fault above must not become the
        # connection's (the parser would report it as a malformed answer).
        try:
            on_answer(response, error)
        except Exception:
            log.exception("handling an instance's answer failed")

    def abandon(self) -> None:
        self.on_answer = _ignore
        if self.task is not None and not self.task.done():
            self.task.cancel()
        conn = self.conn
        if not self.over and conn is not None:
            self.over = True
            conn._waiter = None
            conn.close()


def _settle(
    answer: asyncio.Future[Response], response: Response | None, error: BaseException | None
) -> None:
    """The outcome of an exchange ``request`` awaits, into its future."""
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        assert response is not None
        answer.set_result(response)


def _ignore(response: Response | None, error: BaseException | None) -> None:
    pass


async def _head_or_send_failure(reader: _StreamReader, sender: asyncio.Task[None]) -> None:
    """Wait for the response head; raise the body's own error if sending it fails first."""
    head = asyncio.ensure_future(reader.wait_head())
    try:
        await asyncio.wait({head, sender}, return_when=asyncio.FIRST_COMPLETED)
        if sender.done() and not sender.cancelled() and sender.exception() is not None:
            raise sender.exception()  # type: ignore[misc]
        await head
    finally:
        if not head.done():
            head.cancel()
        with contextlib.suppress(asyncio.CancelledError, UpstreamError):
            await head  # also collects the error it may have ended with


def _request_head(
    method: bytes,
    path: bytes,
    host: bytes,
    headers: list[tuple[bytes, bytes]],
    length: int | None,
    *,
    chunked: bool,
) -> bytes:
    """The request line and headers of a streamed request.

    ConnectionPool.start builds the same bytes inline for a body in hand: it is the
    benchmarked hot path of every real-time invocation, which must not pay even a call
    for this path's sake; the price is these few duplicated lines.
    """
    parts = [method, b" ", path, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    if length is not None:
        parts += [b"Content-Length: ", str(length).encode(), b"\r\n"]
    elif chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def _length_mismatch(sent: int, length: int) -> UpstreamError:
    """A body that does not match its Content-Length: the instance would misread it."""
    if sent > length:
        return UpstreamError(f"the request body is longer than its {length} bytes", sent=True)
    return UpstreamError(f"the request body ended after {sent} of its {length} bytes", sent=True)
