"""Reading a request's body: the one reader every door uses.

A door reads a body whole before it acts: the data path never holds an instance for a
body still arriving, the control plane parses JSON, a signature covers the body. Each
wants the same three things. A size cap, refused as soon as it is known to be passed
(the declared length first). A deadline for the whole body, and none for a body the
edge saw arrive whole (``http_limits.body_arrived``), the common case. And for a body
refused while more of it is coming, ``drain``: read and drop a bounded amount for a
bounded time, so that the client reads the answer rather than a reset connection.

A door that takes bodies sent with a ``Content-Encoding`` (the Open Inference Protocol's
REST door: ``tritonclient.http`` compresses requests with gzip or deflate when asked)
decodes them with :func:`decoded`, under the same size cap: a few kilobytes of gzip can
hold gigabytes, so the decoded size is bounded as it is inflated, never after.

The errors raised here say what happened; each door words them in its own error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from shipyard.errors import BodyEncodingError, BodyTimedOut, BodyTooLarge, ClientLeft
from shipyard.http.server import body_arrived

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

DRAIN_BYTES = 64 * 1024 * 1024
"""The most of a refused body ``drain`` reads by default."""
DRAIN_S = 5.0
"""How long ``drain`` waits for the rest of a refused body by default."""


async def read_body(
    scope: Mapping[str, Any],
    receive: Receive,
    *,
    max_bytes: int,
    timeout_s: float,
    declared: int | None = None,
) -> bytes:
    """The whole body, at most ``max_bytes``, within ``timeout_s``; ``declared`` is its
    Content-Length when the door has read it (a body declared too large is refused
    before a byte of it is read)."""
    if declared is not None and declared > max_bytes:
        raise BodyTooLarge(max_bytes, body_left=True)
    if body_arrived(scope):
        # The common case, a body parsed whole with its head, comes in one message.
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body: bytes = message.get("body", b"")
            if len(body) > max_bytes:
                raise BodyTooLarge(max_bytes, body_left=False)
            return body
        return await _read(receive, max_bytes, message)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(receive, max_bytes)
    except TimeoutError:
        raise BodyTimedOut(timeout_s) from None


async def _read(
    receive: Receive, max_bytes: int, first: MutableMapping[str, Any] | None = None
) -> bytes:
    """The body from ``receive``'s messages, ``first`` being the first of them when it
    was already received."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive() if first is None else first
        first = None
        if message["type"] != "http.request":
            raise ClientLeft("the client disconnected before its body was whole")
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(max_bytes, body_left=more)
        if not more:
            break
        chunks.append(chunk)
    if not chunks:
        return chunk
    chunks.append(chunk)
    return b"".join(chunks)


_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
"""zlib's framing of each content coding it decodes: gzip's header and trailer, and
deflate as RFC 9110 defines it (zlib's format, which ``zlib.compress`` writes)."""
_GZIP_MAGIC = b"\x1f\x8b"


def decoded(body: bytes, content_encoding: bytes | None, *, max_bytes: int) -> bytes:
    """``body`` as it was before its ``Content-Encoding`` (gzip, deflate or identity), at
    most ``max_bytes`` once decoded: BodyTooLarge past that, BodyEncodingError for a
    coding not among these (``unsupported``) or data that are not of it. A gzip body may
    be several members one after the other."""
    if content_encoding is None:
        return body
    codings = [c.strip() for c in content_encoding.lower().split(b",")]
    codings = [c for c in codings if c and c != b"identity"]
    if not codings:
        return body
    if len(codings) > 1 or codings[0] not in _WBITS:
        name = content_encoding.decode("latin-1")
        shown = repr(name) if len(name) <= 64 else f"{name[:64]!r}..."
        raise BodyEncodingError(
            f"Content-Encoding {shown} is not supported; use gzip, deflate or identity.",
            unsupported=True,
        )
    coding = codings[0]
    parts: list[bytes] = []
    room = max_bytes + 1
    data = body
    while True:
        inflater = zlib.decompressobj(_WBITS[coding])
        try:
            part = inflater.decompress(data, room)
        except zlib.error as exc:
            raise BodyEncodingError(
                f"The request body is not valid {coding.decode()} data: {exc}."
            ) from None
        parts.append(part)
        room -= len(part)
        if room <= 0:
            raise BodyTooLarge(max_bytes, body_left=False)
        if not inflater.eof:
            raise BodyEncodingError(
                f"The request body's {coding.decode()} stream ends before its end."
            )
        data = inflater.unused_data
        if not data:
            break
        # gzip (RFC 1952 2.2) is a series of members, each with its own header, as
        # `cat a.gz b.gz` or a parallel compressor (pigz, bgzip) writes: one stream.
        if coding == b"deflate" or not data.startswith(_GZIP_MAGIC):
            raise BodyEncodingError(
                f"The request body's {coding.decode()} stream has data after its end."
            )
    return b"".join(parts)  # one member's bytes as they are, not copied


async def drain(
    receive: Receive, *, max_bytes: int = DRAIN_BYTES, timeout_s: float = DRAIN_S
) -> None:
    """Read and drop the rest of a refused body: stop after ``max_bytes`` or
    ``timeout_s``, whichever comes first.

    Call it only while more of the body is to come (``BodyTooLarge.body_left``): once the
    body is complete, ``receive`` waits for the client to disconnect.
    """
    seen = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while seen < max_bytes:
                message = await receive()
                if message["type"] != "http.request":
                    return
                seen += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
