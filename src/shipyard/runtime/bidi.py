"""Bidirectional streams in the built-in runtime: ``stream_fn(parts, model)`` over a
WebSocket, one per stream.

The gateway opens a WebSocket to the instance for each bidirectional stream and relays
the client's parts as messages (text: a ``str`` part, binary: ``bytes``); the runtime
runs the model's ``stream_fn`` on a thread of the stream's own, with ``parts`` an
iterator that yields each message as it comes, blocks for the next and ends when the
client's side does. Each item ``stream_fn`` yields goes back at once as one message
(``str`` as text, ``bytes`` as binary); ``send`` waits for the gateway to take it, so a
slow client holds the model back rather than its answers piling up here.

How a stream ends:

- the generator returns: the WebSocket is closed with 1000;
- it raises: a text message ``{"ModelStreamError": {"ErrorCode": <class name>,
  "Message": str(exc)}}``, then the close (the gateway sends it to the client as a
  ModelStreamError);
- the gateway closes the WebSocket (its client left, or a limit ended the stream):
  ``parts`` ends, and the generator is closed (``GeneratorExit`` at its ``yield``) when
  it next yields, so its ``finally`` runs at once rather than after its next answer.

The gateway asks for the subprotocol ``shipyard.bidi`` (SUBPROTOCOL): each of its
messages is then binary, tagged by its first byte (``T`` a text part, ``B`` a binary one,
``E`` the end of the client's side), so that the end of the input is not the WebSocket's
close, after which the model could send nothing more. A peer that does not ask for it
is served the plain contract: its close ends ``parts`` and the stream.

A model without ``stream_fn`` cannot stream: the handshake is refused with 400 and
``X-Shipyard-Cannot-Stream`` (the gateway answers its client InputValidationError). At
most ``max_streams`` streams at once (SHIPYARD_BIDI_MAX_STREAMS); one more is refused
with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CANNOT_STREAM = b"x-shipyard-cannot-stream"
"""The header of a handshake refused because the model has no ``stream_fn``."""

SUBPROTOCOL = "shipyard.bidi"
TEXT, BINARY, INPUT_END = b"T", b"B", b"E"

_END = object()
_INBOX_PARTS = 8
"""Parts read ahead of the model: past them the WebSocket is not read, and TCP holds
the gateway (and through it the client) back."""


class BidiStreams:
    """The WebSocket route of one built-in instance: ``stream_fn`` per stream."""

    def __init__(
        self, stream_fn: Callable[..., Any] | None, model: Any, *, max_streams: int
    ) -> None:
        self.stream_fn = stream_fn
        self.model = model
        self.max_streams = max_streams
        self.open = 0

    def __repr__(self) -> str:
        return f"BidiStreams(open={self.open}, max_streams={self.max_streams})"

    async def serve(self, scope: Message, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        if self.stream_fn is None:
            await _refuse(send, 400, "The model has no stream_fn: it cannot stream.", True)
            return
        if self.open >= self.max_streams:
            await _refuse(send, 503, f"{self.open} streams are open, the most this model takes.")
            return
        tagged = SUBPROTOCOL in scope.get("subprotocols", ())
        accept: Message = {"type": "websocket.accept"}
        if tagged:
            accept["subprotocol"] = SUBPROTOCOL
        await send(accept)
        self.open += 1
        try:
            await _Stream(self.stream_fn, self.model, tagged=tagged).run(receive, send)
        finally:
            self.open -= 1


class _Stream:
    """One stream: the model's thread, and the loop's side of its two queues."""

    def __init__(self, stream_fn: Callable[..., Any], model: Any, *, tagged: bool) -> None:
        self.stream_fn = stream_fn
        self.tagged = tagged
        self.model = model
        self.loop = asyncio.get_running_loop()
        self.inbox: queue.Queue[Any] = queue.Queue(maxsize=_INBOX_PARTS)
        self.outbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        self.closed = threading.Event()

    async def run(self, receive: Receive, send: Send) -> None:
        thread = threading.Thread(target=self._model, name="stream_fn", daemon=True)
        thread.start()
        reading = asyncio.ensure_future(self._read(receive))
        try:
            await self._write(send)
        finally:
            self.closed.set()
            self._end_input()
            reading.cancel()
            while not self.outbox.empty():  # a thread blocked on a full outbox goes on
                self.outbox.get_nowait()

    async def _read(self, receive: Receive) -> None:
        """The gateway's messages into ``parts``; its close ends them."""
        try:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    break
                text, data = message.get("text"), message.get("bytes") or b""
                part: Any
                if not self.tagged:
                    part = text if text is not None else data
                elif data[:1] == INPUT_END:
                    part = _END
                elif data[:1] == TEXT:
                    part = data[1:].decode(errors="replace")
                else:
                    part = data[1:]
                if self.inbox.full():  # the model is behind: wait for it off the loop
                    await asyncio.to_thread(self.inbox.put, part)
                else:
                    self.inbox.put_nowait(part)
        finally:
            if not self.closed.is_set():
                self.closed.set()
                if self.outbox.empty():
                    self.outbox.put_nowait(_END)
            self._end_input()

    async def _write(self, send: Send) -> None:
        """What the model yields, to the gateway, until the model's end or the close."""
        while True:
            item = await self.outbox.get()
            if item is _END:
                if not self.closed.is_set():
                    await send({"type": "websocket.close", "code": 1000})
                return
            if isinstance(item, _Failed):
                await send({"type": "websocket.send", "text": item.text})
                await send({"type": "websocket.close", "code": 1000})
                return
            if isinstance(item, str):
                await send({"type": "websocket.send", "text": item})
            else:
                await send({"type": "websocket.send", "bytes": bytes(item)})

    def _end_input(self) -> None:
        """``parts`` ends: after what is queued, or at once once the stream is closed."""
        while True:
            try:
                self.inbox.put_nowait(_END)
                return
            except queue.Full:
                if not self.closed.is_set():
                    return  # read to its end by the model, then ended by _read's _END
                with contextlib.suppress(queue.Empty):
                    self.inbox.get_nowait()

    def _parts(self) -> Iterator[str | bytes]:
        while True:
            part = self.inbox.get()
            if part is _END:
                with contextlib.suppress(queue.Full):
                    self.inbox.put_nowait(_END)  # asked again, it ends again
                return
            yield part

    def _model(self) -> None:
        try:
            answers = self.stream_fn(self._parts(), self.model)
            try:
                for item in answers:
                    if self.closed.is_set():
                        break
                    if not isinstance(item, str | bytes | bytearray | memoryview):
                        raise TypeError(
                            f"stream_fn yielded a {type(item).__name__}; yield str or bytes"
                        )
                    self._put(item)
            finally:
                close = getattr(answers, "close", None)
                if close is not None:
                    close()
        except Exception as exc:
            log.exception("stream_fn failed")
            error = {"ModelStreamError": {"ErrorCode": type(exc).__name__, "Message": str(exc)}}
            self._put(_Failed(json.dumps(error)))
            return
        self._put(_END)

    def _put(self, item: Any) -> None:
        """Hand ``item`` to the loop, waiting for room (one item at a time)."""
        if self.closed.is_set():
            return
        future = asyncio.run_coroutine_threadsafe(self.outbox.put(item), self.loop)
        while not self.closed.is_set():
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                continue
        future.cancel()


class _Failed:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


async def _refuse(send: Send, status: int, message: str, cannot_stream: bool = False) -> None:
    headers = [(b"content-type", b"text/plain")]
    if cannot_stream:
        headers.append((CANNOT_STREAM, b"true"))
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": message.encode()})
