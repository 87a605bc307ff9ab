"""The bidirectional-streaming door: ``POST /endpoints/{name}/invocations-bidirectional-stream``
over HTTP/2 (InvokeEndpointWithBidirectionalStream).

Served on the HTTP/2 port of its own (http/h2server.py), one task per stream. Before the
stream, the door reaches and routes like every door (the key's reach, the endpoint's
route, the variant by TargetVariant or weight), holds one instance for the stream's life
(``Invocations.hold``) and opens a WebSocket to it (http/wsclient.py); any of those
refused is answered at once, whole, in the service's error shape (``x-amzn-ErrorType``,
``{"Message", ...}``), without waiting for the client's side to end:

- ``InputValidationError`` 400: an unknown endpoint or variant, a bad header, a model
  that cannot stream (a built-in model without ``stream_fn``);
- ``ModelError`` 424: the instance refused the WebSocket (``OriginalStatusCode``);
- ``ServiceUnavailableError`` 503: no instance ready, the instance's streams all taken,
  or the instance unreachable; ``AccessDeniedException`` 403 under ``auth:``.

Then the answer's head (200, ``x-amzn-Invoked-Production-Variant``) goes out at once, and
two relays run until either side ends: the client's ``PayloadPart`` events to the
instance, one WebSocket frame per part (``_Inbound``), and the instance's frames to the
client, one ``PayloadPart`` per frame (``_Relay``). Each waits for the other end to take
what it has before reading more, so a slow client holds the model back and a slow model
holds the client back (HTTP/2's and TCP's flow control), with at most one event held.

A stream ends as the model ends it (its Close 1000: END_STREAM; another code or a
``{"ModelStreamError": ...}`` frame: a ``ModelStreamError`` event, then END_STREAM), as
the client goes (RST_STREAM, a lost connection: the WebSocket closed with 1001, which
ends the model's input), or as the gateway ends it (``InternalStreamFailure``, then
END_STREAM, and Close 1001): no part either way for ``idle_timeout_s``, a stream older
than ``max_duration_s``, a part over ``max_part_bytes``, a malformed event, an instance
lost or silent to five pings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shipyard.errors import (
    AuthFailure,
    InvalidSignature,
    ModelError,
    ModelNotReady,
    RuntimeFailure,
    RuntimeValidationError,
    ServiceUnavailable,
    ShipyardError,
    Throttling,
)
from shipyard.gateway.doors.endpoint import EndpointAccess
from shipyard.gateway.edge.auth import ADMITTED, EventSignatures
from shipyard.gateway.edge.streams import StreamEdge
from shipyard.http import eventstream
from shipyard.http.h2server import H2Stream, StreamGone
from shipyard.http.wsclient import Closed, Part, Refused, Unreachable, WebSocket
from shipyard.routing.call import Call
from shipyard.routing.invocation import Invocations

log = logging.getLogger(__name__)

ACTION = "invocations-bidirectional-stream"
_PATH = re.compile(r"^/endpoints/([^/?]+)/invocations-bidirectional-stream(?:\?.*)?$")
_TARGET_VARIANT = b"x-amzn-sagemaker-target-variant"
_INVOCATION_PATH = b"x-amzn-sagemaker-model-invocation-path"
_QUERY_STRING = b"x-amzn-sagemaker-model-query-string"
_VARIANT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_INVOCATION_PATH_VALUE = re.compile(
    r"^(?!\.\.?(?:/|$))[A-Za-z0-9\-._]+(?:/(?!\.\.?(?:/|$))[A-Za-z0-9\-._]+)*$"
)  # no "." or ".." segment: the path stays below the instance's root
_QUERY_VALUE = re.compile(r"^[A-Za-z0-9\-._~=&%+]*$")
_DEFAULT_PATH = "invocations-bidirectional-stream"
_SUBPROTOCOL = "shipyard.bidi"  # runtime/bidi.py's tagged messages
_CANNOT_STREAM = "x-shipyard-cannot-stream"
_MAX_PINGS_MISSED = 5
_CANCEL = 0x8  # HTTP/2's CANCEL error code


@dataclass(frozen=True, slots=True)
class BidiLimits:
    """How long and how large a stream may be."""

    idle_timeout_s: float = 300.0
    """No part either way for this long ends the stream."""
    max_duration_s: float = 1800.0
    """A stream is ended this long after it began."""
    max_part_bytes: int = 6 * 1024 * 1024
    """The largest part a client may send."""
    ping_interval_s: float = 60.0
    """How often the instance is pinged; five unanswered end the stream."""
    connect_timeout_s: float = 10.0
    """How long the instance has to accept the WebSocket."""


@dataclass(frozen=True, slots=True)
class _Request:
    name: str
    target: str | None
    path: str
    tagged_ok: bool = True


class BidiDoor:
    """Translates InvokeEndpointWithBidirectionalStream to a held instance's WebSocket."""

    def __init__(
        self,
        *,
        access: EndpointAccess,
        edge: StreamEdge,
        limits: BidiLimits,
        metrics: Any = None,
    ) -> None:
        self.access = access
        self.edge = edge
        self.invocations = access.invocations
        self.limits = limits
        self.metrics = metrics
        """BidiMetrics (metrics.py): open streams, parts each way; None: not counted."""

    def __repr__(self) -> str:
        return f"BidiDoor({self.limits!r})"

    async def __call__(self, stream: H2Stream) -> None:
        started = time.perf_counter()
        call: Call | None = None
        status, error = 200, None
        try:
            admitted, signatures = self.edge.admit(
                stream.method, stream.path, stream.authority, stream.headers
            )
            request = _request(stream)
            self.access.reach({ADMITTED: admitted}, request.name)
            route = self.invocations.route(request.name)
            call = Call([], b"", target=request.target, started=started)
            async with self.invocations.hold(route, call) as instance:
                socket = await self._open(instance, request, route.name)
                variant = call.variant.name if call.variant is not None else ""
                tagged = socket.protocol.subprotocol == _SUBPROTOCOL
                relay = _Relay(stream, socket, self.limits, tagged=tagged, signatures=signatures)
                self._count_parts(route.name, variant, relay)
                try:
                    await stream.respond(
                        200,
                        [
                            (b"content-type", eventstream.MEDIA_TYPE),
                            (b"x-amzn-invoked-production-variant", variant.encode()),
                        ],
                    )
                    await relay.run()
                finally:
                    socket.abort()  # closed already, unless the head could not go out
        except (RuntimeFailure, AuthFailure) as exc:
            status, error = exc.status_code, exc
            with contextlib.suppress(StreamGone):
                await _refuse(stream, exc)
        finally:
            Invocations.count(call, status, error)

    async def _open(self, instance: Any, request: _Request, name: str) -> WebSocket:
        if instance.streams_both_ways is False:  # known before any connection to it
            raise RuntimeValidationError(
                f"Endpoint {name} cannot stream both ways: its image is not labelled "
                "com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true."
            )
        pool = instance.pool
        try:
            return await WebSocket.connect(
                pool.host,
                pool.port,
                request.path,
                socket_path=pool.socket_path,
                timeout_s=self.limits.connect_timeout_s,
                subprotocols=[_SUBPROTOCOL] if instance.takes_copies else None,
            )
        except Refused as exc:
            message = exc.body.decode(errors="replace")
            if exc.header(_CANNOT_STREAM) is not None:
                raise RuntimeValidationError(
                    f"Endpoint {name} cannot stream both ways: {message}"
                ) from None
            if exc.status == 503:
                raise ServiceUnavailable(
                    f"The instance of endpoint {name} takes no more streams: {message}"
                ) from None
            raise ModelError(
                f"Received client error ({exc.status}) from primary with message "
                f'"{message}". See the instance log for more information.',
                original_status_code=exc.status,
                original_message=message,
            ) from None
        except Unreachable as exc:
            raise ServiceUnavailable(
                f"The instance of endpoint {name} is unreachable: {exc}."
            ) from None

    def _count_parts(self, endpoint: str, variant: str, relay: _Relay) -> None:
        if self.metrics is not None:
            relay.on_part = self.metrics.counting(endpoint, variant)

    def open_streams(self) -> Iterator[tuple[str, str, int]]:
        """(endpoint, variant, bidirectional streams open) for every published variant,
        read from the routing tables (``Instance.bidi_streams``): the metrics' gauge."""
        for route in list(self.access.router.routes.values()):
            for variant in route.variants:
                if not variant.shadow and not variant.dispatch.names_model:
                    yield route.name, variant.name, sum(i.bidi_streams for i in variant.instances)


def _request(stream: H2Stream) -> _Request:
    """The endpoint and the routing headers, refused unless well formed."""
    match = _PATH.match(stream.path)
    if stream.method != "POST" or match is None:
        raise RuntimeValidationError(
            f"{stream.method} {stream.path.split('?')[0]} is not an operation of this "
            "service: POST /endpoints/{EndpointName}/invocations-bidirectional-stream."
        )
    name = match.group(1)
    target = _header(stream, _TARGET_VARIANT)
    if target is not None and not _VARIANT_NAME.match(target):
        raise RuntimeValidationError(
            f"Endpoint {name}: X-Amzn-SageMaker-Target-Variant {target!r} is not a variant name."
        )
    path = _header(stream, _INVOCATION_PATH)
    if path is not None and (len(path) > 100 or not _INVOCATION_PATH_VALUE.match(path)):
        raise RuntimeValidationError(
            f"Endpoint {name}: X-Amzn-SageMaker-Model-Invocation-Path {path!r} must be up "
            "to 100 characters of letters, digits, '-', '.', '_', in '/'-separated segments."
        )
    query = _header(stream, _QUERY_STRING)
    if query is not None and (len(query) > 2048 or not _QUERY_VALUE.match(query)):
        raise RuntimeValidationError(
            f"Endpoint {name}: X-Amzn-SageMaker-Model-Query-String must be up to 2048 "
            "characters of a URL's query."
        )
    where = "/" + (path or _DEFAULT_PATH)
    if query:
        where += "?" + query
    return _Request(name, target, where)


def _header(stream: H2Stream, name: bytes) -> str | None:
    value = stream.header(name)
    return None if value is None else value.decode(errors="replace")


_ERROR_TYPES: list[tuple[type[ShipyardError], int, str]] = [
    (RuntimeValidationError, 400, "InputValidationError"),
    (ModelError, 424, "ModelError"),
    (ModelNotReady, 503, "ServiceUnavailableError"),
    (Throttling, 503, "ServiceUnavailableError"),
    (ServiceUnavailable, 503, "ServiceUnavailableError"),
]


async def _refuse(stream: H2Stream, exc: ShipyardError) -> None:
    """A refusal before the stream: a whole answer, then RST_STREAM (NO_ERROR) when the
    client's side is still open, so it stops sending."""
    status, kind = 500, "InternalServerError"
    if isinstance(exc, AuthFailure):  # as every door words them (SECURITY.md)
        status, kind = exc.status_code, exc.wire_type
    for cls, code, name in _ERROR_TYPES:
        if isinstance(exc, cls):
            status, kind = code, name
            break
    body: dict[str, Any] = {"Message": exc.message}
    if isinstance(exc, ModelError):
        body["OriginalStatusCode"] = exc.original_status_code
        body["OriginalMessage"] = exc.original_message
        if exc.log_stream_arn:
            body["LogStreamArn"] = exc.log_stream_arn
    elif kind == "InputValidationError":
        body["ErrorCode"] = "ValidationError"
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"x-amzn-errortype", kind.encode()),
        (b"content-length", str(len(payload)).encode()),
    ]
    await stream.respond(status, headers)
    await stream.end(payload)
    if not stream.ended:
        stream.reset()


class _Relay:
    """One stream's two directions, and how it ends.

    The model's side is read in the stream's own task (``run``); the client's in a task
    of its own (``_inbound``). Whoever ends the stream sets ``_end`` (the last event for
    the client, b"" for none) and the WebSocket's close.
    """

    def __init__(
        self,
        stream: H2Stream,
        socket: WebSocket,
        limits: BidiLimits,
        *,
        tagged: bool,
        signatures: EventSignatures | None = None,
    ) -> None:
        self.stream = stream
        self.signatures = signatures
        """Under ``auth:``, the events' chained signatures: each checked before its part
        goes on."""
        self.socket = socket
        self.limits = limits
        self.tagged = tagged
        self.loop = asyncio.get_running_loop()
        self.began = self.loop.time()
        self.last_part = self.began
        self.parts_in = 0
        self.parts_out = 0
        self.on_part: Any = None
        """Called with "in" or "out" for each part relayed (the metrics')."""
        self._failure: bytes | None = None
        self._task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        self._task = asyncio.current_task()
        inbound = asyncio.ensure_future(self._inbound())
        watchdog = asyncio.ensure_future(self._watch())
        close_code = 1000
        try:
            end = await self._outbound()
        except asyncio.CancelledError:
            if self._failure is None or self.stream.gone is not None:
                await self.socket.close(1001, "the client went away")
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            end, close_code = self._failure, 1001
        except StreamGone:
            await self.socket.close(1001, "the client went away")
            raise
        finally:
            inbound.cancel()
            watchdog.cancel()
        if self._failure is not None and end == b"":
            end, close_code = self._failure, 1001
        await self.socket.close(close_code)
        try:  # a client that reads no more has the idle time to take the last event
            async with asyncio.timeout(self.limits.idle_timeout_s):
                await self.stream.end(end)
        except TimeoutError:
            self.stream.reset(_CANCEL)
            return
        if not self.stream.ended:
            self.stream.reset()

    def _fail(self, message: str) -> None:
        """End the stream from the gateway's side: InternalStreamFailure."""
        if self._failure is None:
            self._failure = eventstream.stream_error("InternalStreamFailure", message)
            if self._task is not None:
                self._task.cancel()

    # the model's side, to the client

    async def _outbound(self) -> bytes:
        """Relay the instance's frames until it closes; the client's last event."""
        socket, stream = self.socket, self.stream
        first = True  # the next frame begins a message
        while True:
            item = await socket.receive()
            if isinstance(item, Closed):
                if item.code == 1000:
                    return b""
                if item.code == 1006:
                    return eventstream.stream_error(
                        "InternalStreamFailure", "The instance was lost mid-stream."
                    )
                return eventstream.stream_error("ModelStreamError", item.reason, str(item.code))
            if first and item.fin and item.text and item.data.startswith(b'{"ModelStreamError"'):
                error = _model_stream_error(item.data)
                if error is not None:
                    return error
            kind = "UTF8" if item.text else "BINARY"
            state = "COMPLETE" if item.fin else "PARTIAL"
            await stream.send(eventstream.bidi_part(item.data, kind, state))
            first = item.fin
            self._parted("out")

    def _parted(self, direction: str) -> None:
        self.last_part = self.loop.time()
        if self.on_part is not None:
            self.on_part(direction)

    # the client's side, to the model

    async def _inbound(self) -> None:
        try:
            await self._relay_client()
        except StreamGone:
            return
        except eventstream.MalformedEvent as exc:
            self._fail(f"A malformed event: {exc}.")
        except _PartTooLarge as exc:
            self._fail(str(exc))
        except InvalidSignature as exc:
            self._fail(f"{exc.message} The stream was ended; nothing after it was sent on.")

    async def _relay_client(self) -> None:
        socket = self.socket
        decoder = eventstream.Decoder(max_message_bytes=self.limits.max_part_bytes + 128 * 1024)
        open_message: Part | None = None  # a message of PARTIAL parts not yet COMPLETE
        while True:
            data = await self.stream.receive()
            if not data:
                break
            for message in decoder.feed(data):
                part = self._part(message)
                if part is None:
                    continue
                await self._send_part(part, open_message)
                open_message = None if part.fin else (open_message or part)
                self._parted("in")
        if decoder.pending:
            raise eventstream.MalformedEvent("the input ended inside a message")
        if open_message is not None:  # the client ended mid-message: end the message
            await socket.send(b"", text=open_message.text, fin=True, continuation=True)
        if self.tagged:
            await socket.send(b"E", text=False, fin=True, continuation=False)
        else:
            await socket.close_input()

    def _part(self, message: eventstream.Message) -> Part | None:
        """The part an event carries, unwrapped from its signed envelope; None for an
        envelope with no payload (the SDKs' last signed frame) or another event."""
        headers = message.headers
        if self.signatures is not None:
            _check_signature(self.signatures, message)
        if ":chunk-signature" in headers or ":date" in headers:
            if not message.payload:
                return None
            inner = list(
                eventstream.Decoder(max_message_bytes=len(message.payload)).feed(message.payload)
            )
            if len(inner) != 1:
                raise eventstream.MalformedEvent("an envelope holds one whole event")
            headers, payload = inner[0].headers, inner[0].payload
        else:
            payload = message.payload
        if headers.get(":event-type") != "PayloadPart":
            return None
        if len(payload) > self.limits.max_part_bytes:
            raise _PartTooLarge(
                f"A part of {len(payload)} bytes is over the limit of "
                f"{self.limits.max_part_bytes} bytes."
            )
        text = headers.get("DataType", "BINARY") == "UTF8"
        fin = headers.get("CompletionState", "COMPLETE") != "PARTIAL"
        return Part(text, payload, fin)

    async def _send_part(self, part: Part, open_message: Part | None) -> None:
        socket = self.socket
        if open_message is not None:  # a continuation keeps its message's type
            await socket.send(part.data, text=open_message.text, fin=part.fin, continuation=True)
        elif self.tagged:
            tag = b"T" if part.text else b"B"
            await socket.send(tag + part.data, text=False, fin=part.fin, continuation=False)
        else:
            await socket.send(part.data, text=part.text, fin=part.fin, continuation=False)

    # limits

    async def _watch(self) -> None:
        limits = self.limits
        step = min(limits.idle_timeout_s, limits.ping_interval_s, limits.max_duration_s, 1.0)
        next_ping = self.began + limits.ping_interval_s
        while True:
            await asyncio.sleep(step)
            now = self.loop.time()
            if now - self.began >= limits.max_duration_s:
                self._fail(f"The stream reached its limit of {limits.max_duration_s:g} seconds.")
                return
            if now - self.last_part >= limits.idle_timeout_s:
                self._fail(f"No part either way for {limits.idle_timeout_s:g} seconds.")
                return
            if now >= next_ping:
                if self.socket.pings_unanswered >= _MAX_PINGS_MISSED:
                    self._fail("The instance answered none of five pings.")
                    return
                next_ping = now + limits.ping_interval_s
                await self.socket.ping()


class _PartTooLarge(Exception):
    pass


def _check_signature(signatures: EventSignatures, message: eventstream.Message) -> None:
    """InvalidSignature unless ``message`` is an envelope whose ``:chunk-signature``
    follows from the one before it."""
    when = message.headers.get(":date")
    signature = message.headers.get(":chunk-signature")
    if not isinstance(when, datetime) or not isinstance(signature, bytes):
        raise InvalidSignature("An event is not signed: :date and :chunk-signature are required.")
    date_header = b"\x05:date\x08" + struct.pack(">q", round(when.timestamp() * 1000))
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    signatures.check(stamp, date_header, message.payload, signature)


def _model_stream_error(data: bytes) -> bytes | None:
    """The ModelStreamError event a ``{"ModelStreamError": {...}}`` frame asks for."""
    try:
        body = json.loads(data)["ModelStreamError"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(body, dict):
        return None
    code = body.get("ErrorCode")
    return eventstream.stream_error(
        "ModelStreamError",
        str(body.get("Message", "")),
        None if code is None else str(code),
    )
