"""HTTP/2 served on h2's state machine, for streams that flow both ways at once.

Bidirectional streaming needs what HTTP/1.1 cannot give: the request still arriving
while its answer goes out, over one stream of many on one connection. h2 (the
python-hyper project's sans-I/O HTTP/2) does the protocol; this module does the I/O on
an asyncio protocol, one task per stream, with:

- **Flow control honoured both ways.** Data received is acknowledged (a WINDOW_UPDATE)
  only once the handler has taken it (``H2Stream.receive``), so a handler that reads
  slowly holds its client back, and at most a window per stream and one per connection
  is ever buffered. ``H2Stream.send`` waits for the client's window and for the socket's
  buffer to drain, so a client that reads slowly holds the handler back.
- **A client gone** (RST_STREAM, a lost connection, GOAWAY before the stream began)
  cancels the stream's task at once, wherever it waits; ``H2Stream.gone`` says why.
- **Limits**: at most ``max_connections`` connections (one more is closed at once),
  ``max_streams`` streams open on each (SETTINGS), heads of at most
  ``max_header_bytes``, and a connection with no stream open closed after
  ``idle_timeout_s`` (a connection with a stream open is never idle).

Served over TLS (ALPN ``h2``, as AWS's clients require) or cleartext with prior
knowledge (h2c). Nothing of shipyard: the handler gets an ``H2Stream`` and answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
Handler = Callable[["H2Stream"], Awaitable[None]]

_WINDOW_BYTES = 1024 * 1024
"""Each stream's receive window: what a client may send ahead of the handler."""
_CONNECTION_WINDOW_BYTES = 16 * 1024 * 1024
"""The connection's receive window, over all its streams."""


class StreamGone(Exception):
    """The client reset the stream or its connection was lost."""


class H2Stream:
    """One request stream: its head, its body as the handler takes it, its answer.

    ``receive`` returns the next data (b"" once the client ended its side); ``respond``
    sends the head, ``send`` data within the client's window, ``end`` ends the answer.
    Each raises StreamGone once the client is gone.
    """

    def __init__(self, connection: H2Connection, stream_id: int, headers: Headers) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.headers = headers
        self.pseudo = {k: v for k, v in headers if k.startswith(b":")}
        self.gone: str | None = None
        """Why the client is gone (``reset``, ``connection lost``), or None."""
        self.ended = False
        """Whether the client ended its side (END_STREAM)."""
        self.answered = False
        self.closed = False
        self.task: asyncio.Task[None] | None = None
        self._data: asyncio.Queue[bytes] = asyncio.Queue()
        self._window = asyncio.Event()

    def __repr__(self) -> str:
        return f"H2Stream(id={self.stream_id}, path={self.path!r}, gone={self.gone!r})"

    @property
    def method(self) -> str:
        return self.pseudo.get(b":method", b"").decode(errors="replace")

    @property
    def path(self) -> str:
        return self.pseudo.get(b":path", b"").decode(errors="replace")

    @property
    def authority(self) -> str:
        return self.pseudo.get(b":authority", b"").decode(errors="replace")

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def receive(self) -> bytes:
        """The next data the client sent, acknowledged now that it is taken; b"" at the
        end of its side."""
        if self.gone is not None:
            raise StreamGone(self.gone)
        data = await self._data.get()
        if data is _GONE:
            raise StreamGone(self.gone or "reset")
        if data:
            self.connection.acknowledge(self, len(data))
        return data

    async def respond(self, status: int, headers: Headers, *, end: bool = False) -> None:
        """Send the answer's head (``end``: and no body)."""
        self._check()
        self.answered = True
        self.connection.send_headers(self, [(b":status", str(status).encode()), *headers], end)
        if end:
            self.closed = True
        await self.connection.drained()

    async def send(self, data: bytes, *, end: bool = False) -> None:
        """Send ``data`` as the client's windows allow; ``end`` ends the answer."""
        conn = self.connection
        view = memoryview(data)
        while view:
            self._check()
            size = conn.window(self)
            if size <= 0:
                self._window.clear()
                await self._window.wait()
                continue
            chunk, view = view[:size], view[size:]
            conn.send_data(self, bytes(chunk), end=end and not view)
            await conn.drained()
        if end and not data:
            self._check()
            conn.send_data(self, b"", end=True)
        if end:
            self.closed = True

    async def end(self, data: bytes = b"") -> None:
        await self.send(data, end=True)

    def reset(self, code: int = h2.errors.ErrorCodes.NO_ERROR) -> None:
        """Reset the stream (after an answer ended, to stop the client's side)."""
        self.closed = True
        self.connection.reset(self, code)

    def _check(self) -> None:
        if self.gone is not None:
            raise StreamGone(self.gone)

    # called by the connection

    def _took(self, data: bytes) -> None:
        self._data.put_nowait(data)

    def _went(self, why: str) -> None:
        if self.gone is None:
            self.gone = why
            self._data.put_nowait(_GONE)
            self._window.set()
            if self.task is not None and not self.task.done():
                self.task.cancel()


_GONE = b"\0gone"  # a sentinel object, compared by identity


class H2Connection(asyncio.Protocol):
    """One client connection: h2's state machine, its streams and their tasks."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_streams: int,
        max_header_bytes: int,
        idle_timeout_s: float,
        connections: set[H2Connection],
        max_connections: int = 1000,
    ) -> None:
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=True
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.handler = handler
        self.max_streams = max_streams
        self.max_header_bytes = max_header_bytes
        self.idle_timeout_s = idle_timeout_s
        self.connections = connections
        self.max_connections = max_connections
        self.streams: dict[int, H2Stream] = {}
        self.transport: asyncio.Transport | None = None
        self.closing = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"H2Connection(streams={len(self.streams)})"

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        if len(self.connections) >= self.max_connections:
            transport.close()
            return
        self.connections.add(self)
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.max_streams,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW_BYTES,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.max_header_bytes,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(_CONNECTION_WINDOW_BYTES - 65535)
        self._flush()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("HTTP/2 protocol error from a client: %s", exc)
            self._flush()
            self._abort()
            return
        for event in events:
            self._on(event)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        for stream in list(self.streams.values()):
            stream._went("connection lost")
        self.streams.clear()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # events

    def _on(self, event: h2.events.Event) -> None:
        handle = _HANDLERS.get(type(event))
        if handle is not None:
            handle(self, event)

    def _ended(self, event: h2.events.StreamEnded) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is not None and not stream.ended:
            stream.ended = True
            stream._took(b"")

    def _reset(self, event: h2.events.StreamReset) -> None:
        stream = self.streams.pop(event.stream_id, None)
        if stream is not None:
            stream._went("reset")
        self._arm_idle()

    def _window_updated(self, event: h2.events.WindowUpdated) -> None:
        if event.stream_id:
            found = self.streams.get(event.stream_id)
            if found is not None:
                found._window.set()
            return
        self._settings_changed(event)

    def _settings_changed(self, event: h2.events.Event) -> None:
        for stream in self.streams.values():
            stream._window.set()

    def _terminated(self, event: h2.events.ConnectionTerminated) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None:
            # Data for a stream already done: give its window back all the same.
            with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        stream._took(event.data or b"")
        padding = event.flow_controlled_length - len(event.data or b"")
        if padding:
            self.conn.acknowledge_received_data(padding, event.stream_id)
        if event.stream_ended is not None:
            stream.ended = True
            stream._took(b"")

    def _start(self, event: h2.events.RequestReceived) -> None:
        headers = list(event.headers or [])
        stream = H2Stream(self, event.stream_id, headers)
        if event.stream_ended is not None:
            stream.ended = True
            stream._took(b"")
        self.streams[event.stream_id] = stream
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        stream.task = asyncio.ensure_future(self._serve(stream))

    async def _serve(self, stream: H2Stream) -> None:
        try:
            await self.handler(stream)
        except (StreamGone, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("HTTP/2 stream %s failed", stream.stream_id)
            if stream.gone is None and not stream.closed:
                self.reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
        finally:
            if stream.gone is None and not stream.closed:
                self.reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
            self._done(stream)

    def _done(self, stream: H2Stream) -> None:
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
            # What the client sent that nobody will read: its window back.
            unread = 0
            while not stream._data.empty():
                data = stream._data.get_nowait()
                if data is not _GONE:
                    unread += len(data)
            if unread and self.transport is not None and not self.transport.is_closing():
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.conn.acknowledge_received_data(unread, stream.stream_id)
                self._flush()
        self._arm_idle()

    # for streams

    def acknowledge(self, stream: H2Stream, size: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
            self.conn.acknowledge_received_data(size, stream.stream_id)
        self._flush()

    def window(self, stream: H2Stream) -> int:
        try:
            size = self.conn.local_flow_control_window(stream.stream_id)
        except (h2.exceptions.StreamClosedError, KeyError):
            stream._went("reset")
            raise StreamGone("reset") from None
        return min(size, self.conn.max_outbound_frame_size)

    def send_headers(self, stream: H2Stream, headers: Headers, end: bool) -> None:
        self._call(stream, self.conn.send_headers, stream.stream_id, headers, end_stream=end)

    def send_data(self, stream: H2Stream, data: bytes, *, end: bool) -> None:
        self._call(stream, self.conn.send_data, stream.stream_id, data, end_stream=end)

    def reset(self, stream: H2Stream, code: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
            self.conn.reset_stream(stream.stream_id, error_code=code)
        self._flush()

    def _call(self, stream: H2Stream, method: Callable[..., Any], *args: Any, **kw: Any) -> None:
        try:
            method(*args, **kw)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            stream._went("reset")
            raise StreamGone("reset") from None
        self._flush()

    async def drained(self) -> None:
        """Returns once the socket's buffer is below its high mark."""
        if not self._writable.is_set():
            await self._writable.wait()

    def close(self) -> None:
        """GOAWAY: no new stream; those open go on to their end."""
        if self.transport is None or self.transport.is_closing():
            return
        self.closing = True
        self.conn.close_connection()
        self._flush()
        if not self.streams:
            self.transport.close()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _arm_idle(self) -> None:
        if self.streams or self.transport is None:
            return
        if self.closing:
            self.transport.close()
            return
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self.idle_timeout_s, self._idle_out)

    def _idle_out(self) -> None:
        if not self.streams:
            self.close()
            if self.transport is not None:
                self.transport.close()


_HANDLERS: dict[type[h2.events.Event], Callable[[H2Connection, Any], None]] = {
    h2.events.RequestReceived: H2Connection._start,
    h2.events.DataReceived: H2Connection._data,
    h2.events.StreamEnded: H2Connection._ended,
    h2.events.StreamReset: H2Connection._reset,
    h2.events.WindowUpdated: H2Connection._window_updated,
    h2.events.RemoteSettingsChanged: H2Connection._settings_changed,
    h2.events.ConnectionTerminated: H2Connection._terminated,
}


class H2Server:
    """Serves ``handler`` over HTTP/2 on ``host:port``: TLS with ALPN ``h2`` when given a
    certificate, else cleartext with prior knowledge (h2c)."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_streams: int = 128,
        max_header_bytes: int = 64 * 1024,
        idle_timeout_s: float = 75.0,
        max_connections: int = 1000,
    ) -> None:
        self.handler = handler
        self.max_connections = max_connections
        self.max_streams = max_streams
        self.max_header_bytes = max_header_bytes
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[H2Connection] = set()
        self._server: asyncio.Server | None = None

    def __repr__(self) -> str:
        return f"H2Server(connections={len(self.connections)})"

    async def start(
        self, host: str, port: int, *, tls: tuple[str, str] | None = None
    ) -> asyncio.Server:
        context = None
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls[0], tls[1], password=lambda: b"")
            context.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host, port, ssl=context)
        return self._server

    def _protocol(self) -> H2Connection:
        return H2Connection(
            self.handler,
            max_streams=self.max_streams,
            max_header_bytes=self.max_header_bytes,
            idle_timeout_s=self.idle_timeout_s,
            connections=self.connections,
            max_connections=self.max_connections,
        )

    @property
    def open_streams(self) -> int:
        return sum(len(c.streams) for c in self.connections)

    async def stop(self, drain_timeout_s: float) -> None:
        """Take no more connections or streams; give those open ``drain_timeout_s`` to
        end, then close every connection (their streams' tasks are cancelled)."""
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout_s
        while self.open_streams and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
