"""A pooled HTTP/1.1 client for gateway → instance traffic.

Written here rather than taken from httpx or aiohttp because it is the hot path of every
invocation: it does only what that hop needs (one request at a time per keep-alive
connection to a known loopback peer, bodies passed through as bytes) and parses with
httptools, the same parser uvicorn uses. bench/gateway_overhead.py measures the result.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httptools


class UpstreamError(Exception):
    """The connection failed before a whole response arrived."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
        """Whether the request may have reached the instance (then it is not retried)."""


class Response:
    """An instance's answer: status, headers (lower-cased names) and body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def __repr__(self) -> str:
        return f"Response(status={self.status}, bytes={len(self.body)})"


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._waiter: asyncio.Future[Response] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._drained: asyncio.Event | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad response from instance: {exc}", sent=True))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(UpstreamError("instance closed the connection", sent=True))
        if self._drained is not None:
            self._drained.set()

    def pause_writing(self) -> None:
        self._drained = asyncio.Event()

    def resume_writing(self) -> None:
        if self._drained is not None:
            self._drained.set()
            self._drained = None

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            status = self.parser.get_status_code()
            body = b"".join(self._body)
            waiter.set_result(Response(status, self._headers, body))
        if not self.parser.should_keep_alive():
            self.close()

    # ours
    def _fail(self, exc: UpstreamError) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def send(self, head: bytes, body: bytes | AsyncIterator[bytes]) -> Response:
        assert self.transport is not None and self._waiter is None
        self._headers = []
        self._body = []
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            if isinstance(body, bytes):
                self.transport.write(head + body)
            else:
                self.transport.write(head)
                async for chunk in body:
                    self.transport.write(chunk)
                    if self._drained is not None:
                        await self._drained.wait()
            return await self._waiter
        finally:
            self._waiter = None


class ConnectionPool:
    """Keep-alive connections to one instance, reused LIFO so hot ones stay warm."""

    def __init__(self, host: str, port: int, *, max_idle: int = 64) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._host_header = f"{host}:{port}".encode()

    def __repr__(self) -> str:
        return f"ConnectionPool({self.host}:{self.port}, idle={len(self._idle)})"

    async def _acquire(self) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as exc:
            raise UpstreamError(f"cannot connect to instance: {exc}", sent=False) from exc
        return conn, False

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
    ) -> Response:
        """Send one request and return the whole response.

        A reused connection that the instance closed while idle fails before anything
        was read; that case is retried once on a fresh connection when ``body`` is bytes.
        Cancellation (a timeout above us) closes the connection, since its state is
        unknown.
        """
        length = len(body) if isinstance(body, bytes) else content_length
        parts = [method, b" ", path, b" HTTP/1.1\r\nHost: ", self._host_header, b"\r\n"]
        for name, value in headers:
            parts += [name, b": ", value, b"\r\n"]
        if length is not None:
            parts += [b"Content-Length: ", str(length).encode(), b"\r\n"]
        parts.append(b"\r\n")
        head = b"".join(parts)
        for attempt in (1, 2):
            conn, reused = await self._acquire()
            try:
                response = await conn.send(head, body)
            except UpstreamError:
                conn.close()
                if reused and attempt == 1 and isinstance(body, bytes):
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            self._release(conn)
            return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
