"""Streamed answers: handlers that return an iterator or a generator.

When ``predict_fn`` returns an iterator (and ``output_fn`` is the default), each item is
encoded on its own: bytes and str as they are, anything else as the default
``output_fn`` encodes a whole prediction. When ``output_fn`` or ``transform_fn`` returns
an iterator (alone, or as ``(iterator, content_type)``), its items must be bytes or str.
Either way, one item is one chunk:

- asked for a stream (the gateway's InvokeEndpointWithResponseStream sets
  ``X-Shipyard-Response-Stream``), the answer goes out chunked, each item flushed as
  soon as the handlers yield it: :func:`send_stream`;
- otherwise (InvokeEndpoint, batch transform, async) the items are joined and the
  answer is sent whole, so a handler that raises part-way gives an ordinary ModelError.

Status and headers leave before the first item is produced, so custom attributes must be
set on the ``context`` before the iterator is returned. Each item is pulled by the
instance's runner (:mod:`workers`), one at a time; once the gateway has gone (its client
disconnected) no more are pulled and the generator is closed, so its ``finally`` blocks
run.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from shipyard.contract import STREAM_ERROR
from shipyard.runtime import codecs
from shipyard.runtime.workers import Runner

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

Chunks = Iterator[bytes]
"""A streamed answer: its chunks, produced as the handlers yield them."""

_END: Any = object()
_NOT_A_STREAM = (bytes, bytearray, memoryview, str, dict, list, tuple)


def is_stream(value: object) -> bool:
    """Whether a handler's result is an iterator (a generator among them) to stream."""
    return isinstance(value, Iterator) and not isinstance(value, _NOT_A_STREAM)


def chunks(items: Iterator[Any], handler: str) -> Chunks:
    """The items of ``output_fn``'s or ``transform_fn``'s iterator as bytes."""
    with _closing(items):
        for item in items:
            if isinstance(item, bytes):
                yield item
            elif isinstance(item, str):
                yield item.encode()
            elif isinstance(item, bytearray | memoryview):
                yield bytes(item)
            else:
                raise TypeError(
                    f"{handler} yielded {type(item).__name__}; a streamed answer's items "
                    "must be bytes or str."
                )


def encoded(predictions: Iterator[Any], accept: str) -> Chunks:
    """The items of ``predict_fn``'s iterator, each encoded as the default ``output_fn``
    would encode a whole prediction (bytes and str pass as they are)."""
    with _closing(predictions):
        for item in predictions:
            if isinstance(item, bytes):
                yield item
            elif isinstance(item, str):
                yield item.encode()
            else:
                yield codecs.encode(item, accept)[0]


@contextlib.contextmanager
def _closing(items: Iterator[Any]) -> Iterator[None]:
    """Close the user's generator when ours is closed (the client left), so its own
    ``finally`` blocks run then, on the runner, not whenever it is collected."""
    try:
        yield
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def join(items: Chunks) -> bytes:
    """The whole answer of a stream nobody asked to stream."""
    return b"".join(items)


async def collect(threads: Runner, items: Chunks, receive: Receive) -> bytes | None:
    """The whole answer of a stream nobody asked to stream, pulled by ``threads`` one
    item at a time; None once the gateway has gone (its client left), the iterator
    closed so that whatever it was making for nobody stops."""
    gone = asyncio.ensure_future(receive())  # answers once the gateway disconnects
    pieces: list[bytes] = []
    try:
        while not gone.done():
            chunk = await threads.run(next, items, _END)
            if chunk is _END:
                return b"".join(pieces)
            pieces.append(chunk)
            await asyncio.sleep(0)  # Inline.run never gives the loop a turn: give it one
    finally:
        gone.cancel()
    await _close(threads, items)
    return None


async def first_chunk(threads: Runner, items: Chunks) -> bytes | None:
    """The first item, or None when there is none. Pulled before the answer's head is
    sent, so that handlers failing at once (a generator's body runs only now) get an
    ordinary error status, and whatever they set on ``context`` makes the head."""
    chunk = await threads.run(next, items, _END)
    return None if chunk is _END else chunk


async def send_stream(
    send: Send,
    receive: Receive,
    threads: Runner,
    items: Chunks,
    first: bytes | None,
    headers: list[tuple[bytes, bytes]],
    describe: Callable[[Exception], str],
) -> None:
    """Answer chunked with ``first`` then the rest of ``items``, pulled by ``threads`` one
    at a time.

    An exception from the handlers ends the answer with a last chunk holding the
    STREAM_ERROR token and ``describe(exc)`` (see contract.py); the answer itself ends
    well-formed, so the connection stays fit for the next request.
    """
    marker = secrets.token_hex(16).encode()
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [*headers, (STREAM_ERROR, marker)],
    }
    await send(start)
    gone = asyncio.ensure_future(receive())  # answers once the gateway disconnects
    chunk: Any = _END if first is None else first
    try:
        while chunk is not _END and not gone.done():
            if chunk:  # an empty chunk would end a chunked answer
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            # Inline.run never gives the loop a turn: give it one per chunk, or it would
            # never see the gateway leave (nor serve anyone else) while a stream lasts.
            await asyncio.sleep(0)
            try:
                chunk = await threads.run(next, items, _END)
            except Exception as exc:
                text = describe(exc).encode(errors="replace")
                await send({"type": "http.response.body", "body": marker + text, "more_body": True})
                break
    finally:
        gone.cancel()
        await _close(threads, items)
    await send({"type": "http.response.body", "body": b""})


async def _close(threads: Runner, items: Chunks) -> None:
    """Close the handlers' generator on their runner, so its ``finally`` blocks run there."""
    close = getattr(items, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await threads.run(close)
