"""The response-streaming door: ``POST /endpoints/{name}/invocations-response-stream``.

InvokeEndpointWithResponseStream as a raw ASGI handler, for the reasons the runtime door
gives (gateway/doors/runtime.py), with which it shares the routing table, the body limits and
the error shapes. What differs is the answer: the instance is asked for a streamed one
(contract.RESPONSE_STREAM) and each chunk it sends becomes one ``PayloadPart`` event
(http/eventstream.py), written as soon as it arrives. Nothing is held beyond the
chunk in hand and the client reader's bounded buffer (http/client.py): a slow client
slows the instance through TCP flow control, and a client that disconnects cancels the
exchange, which gives the instance back and closes its connection.

Errors before the first chunk (unknown endpoint, bad headers, no instance, the model's
own error status, a model failing before it yields) are the runtime's usual ones
(ValidationError, ModelError, ...). Once events flow, a failure is the stream's last
event, a ``ModelStreamError`` (or ``InternalStreamFailure``, for a fault of ours):

- ``StreamBroken``: the model raised mid-stream (its message comes through the runtime's
  STREAM_ERROR chunk), or the instance's answer broke off;
- ``ModelInvocationTimeExceeded``: no chunk came within the invocation timeout.

The invocation timeout bounds the wait for the answer's head and every gap between two
chunks, never the whole stream, which may run as long as the model keeps producing.

The streamed exchange itself is gateway/doors/relay.py's ``StreamRelay``, which the
OpenAI-compatible door uses too with its own framing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from shipyard.contract import FORWARDED
from shipyard.gateway.doors.endpoint import (
    CUSTOM_ATTRIBUTES,
    EndpointAccess,
    ask_by_attributes,
    session_headers,
)
from shipyard.gateway.doors.relay import ASK_STREAM, StreamClient, StreamRelay
from shipyard.gateway.wire.errors import runtime_error_response
from shipyard.gateway.wire.runtime_headers import INVOKE_ENDPOINT_STREAM, check_header
from shipyard.http import eventstream
from shipyard.routing import sessions
from shipyard.routing.call import Call, Exchange
from shipyard.routing.table import EndpointRoute

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

_TARGET_VARIANT = b"x-amzn-sagemaker-target-variant"
_COMPONENT = b"x-amzn-sagemaker-inference-component"
_ACCEPT = b"x-amzn-sagemaker-accept"  # the model's Accept; the client's own is for events
_NOT_FORWARDED = (b"accept", b"x-amzn-sagemaker-target-model")


class ResponseStreamDoor:
    """Translates InvokeEndpointWithResponseStream to a streamed router call and back."""

    def __init__(self, *, access: EndpointAccess) -> None:
        self.access = access
        self.invocations = access.invocations
        self.router = access.router
        self.relay = StreamRelay(access.invocations, runtime_error_response)

    def __repr__(self) -> str:
        return f"ResponseStreamDoor({self.router!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        started = time.perf_counter()

        async def prepare(client: StreamClient) -> tuple[EndpointRoute, Call]:
            access = self.access
            access.reach(scope, name)
            route = self.invocations.route(name)
            forward, target, component, content_length, attributes = _request_headers(scope)
            if content_length is not None and content_length > access.max_payload_bytes:
                raise access.too_large(body_left=True)
            body = await access.read_body(scope, client.receive)
            call = Call(forward, body, target=target, started=started, component=component)
            if attributes is not None:
                ask_by_attributes(call, attributes)  # its priority and deadline
            return route, call

        await self.relay.serve(receive, send, prepare, _EVENT_STREAM, name)


class EventStreamFraming:
    """InvokeEndpointWithResponseStream's framing: one ``PayloadPart`` event per chunk
    (http/eventstream.py), a ``ModelStreamError`` or ``InternalStreamFailure`` event
    for a failure."""

    def head(self, exchange: Exchange, call: Call) -> dict[str, Any]:
        return _head(exchange, call)

    def parts(self, chunk: bytes) -> Iterable[bytes]:
        step = eventstream.MAX_PAYLOAD_BYTES
        return [eventstream.payload_part(chunk[n : n + step]) for n in range(0, len(chunk), step)]

    def failure(self, code: str, message: str) -> bytes:
        return eventstream.stream_error("ModelStreamError", message, code)

    def internal_failure(self) -> bytes:
        return eventstream.stream_error("InternalStreamFailure", "Internal failure.")

    def end(self) -> bytes:
        return b""


_EVENT_STREAM = EventStreamFraming()


def _request_headers(
    scope: Scope,
) -> tuple[list[tuple[bytes, bytes]], str | None, str | None, int | None, bytes | None]:
    """The headers for the instance, the target variant, the inference component, the
    declared body length and the CustomAttributes (forwarded too)."""
    forward: list[tuple[bytes, bytes]] = [ASK_STREAM]
    attributes: bytes | None = None
    target: str | None = None
    component: str | None = None
    content_length: int | None = None
    for key, value in scope["headers"]:
        check_header(INVOKE_ENDPOINT_STREAM, key, value)
        if key == _ACCEPT:
            forward.append((b"Accept", value))
        elif key in _NOT_FORWARDED:
            continue
        elif (wire := FORWARDED.get(key)) is not None:
            forward.append((wire, value))
            if key == CUSTOM_ATTRIBUTES:
                attributes = value
        elif key == b"content-length":
            content_length = int(value)
        elif key == _TARGET_VARIANT:
            target = value.decode()
        elif key == _COMPONENT:
            component = value.decode(errors="replace")
    return forward, target, component, content_length, attributes


def _head(exchange: Exchange, call: Call) -> dict[str, Any]:
    response = exchange.response
    headers = [
        (b"content-type", eventstream.MEDIA_TYPE),
        (
            b"x-amzn-sagemaker-content-type",
            response.header(b"content-type") or b"application/octet-stream",
        ),
        (b"x-amzn-invoked-production-variant", exchange.variant.name.encode()),
    ]
    attributes = response.header(CUSTOM_ATTRIBUTES)
    if attributes is not None:
        headers.append((b"x-amzn-sagemaker-custom-attributes", attributes))
    headers += session_headers(call, response.header(sessions.CLOSED_HEADER))
    return {"type": "http.response.start", "status": 200, "headers": headers}
