"""What every data-plane door does to reach an endpoint, in one place: the key's reach,
the request body read whole within the payload limit and its time, a body's
``Content-Encoding`` undone under the same limit, and the session headers of an answer.

The doors share it rather than each other: no door imports another (an import-linter
contract in ``pyproject.toml``), so a door can be read, changed or removed alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shipyard.errors import (
    BodyEncodingError,
    BodyTimedOut,
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    ClientLeft,
    MalformedEncoding,
    PayloadTooLarge,
    UnsupportedEncoding,
)
from shipyard.gateway.edge.auth import admitted, resource_arn
from shipyard.http import bodies
from shipyard.routing import priorities, sessions
from shipyard.routing.call import Call
from shipyard.routing.invocation import Invocations

Scope = dict[str, Any]
Receive = Any


class EndpointAccess:
    """An endpoint's invocations as the doors reach them: ``invocations`` (the routing
    every door joins), and the body limits every door holds a request to."""

    def __init__(
        self,
        *,
        invocations: Invocations,
        max_payload_bytes: int,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.invocations = invocations
        self.router = invocations.router
        self.max_payload_bytes = max_payload_bytes
        self.account_id = invocations.account_id
        self.region = invocations.region
        self.body_timeout_s = body_timeout_s

    def __repr__(self) -> str:
        return f"EndpointAccess({self.router!r})"

    def reach(self, scope: Scope, name: str) -> None:
        """AccessDenied unless the caller's key reaches endpoint ``name`` (its
        ``resources``); every door asks before it acts on an endpoint."""
        edge = admitted(scope)
        if edge.caller is not None:
            edge.reach(resource_arn(self.region, self.account_id, "endpoint", name))

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, at most ``max_payload_bytes``, within ``body_timeout_s``, in
        the runtime doors' errors (http/bodies.py reads it)."""
        try:
            return await bodies.read_body(
                scope, receive, max_bytes=self.max_payload_bytes, timeout_s=self.body_timeout_s
            )
        except BodyTooLarge as exc:
            raise self.too_large(body_left=exc.body_left) from None
        except BodyTimedOut as exc:
            raise BodyTimeout(
                f"The request body did not arrive within {exc.timeout_s:g} seconds."
            ) from None
        except ClientLeft:
            raise ClientGone() from None

    async def decoded(self, body: bytes, content_encoding: bytes) -> bytes:
        """``body`` without its ``Content-Encoding`` (gzip, deflate, identity), under the
        same ``max_payload_bytes`` once decoded, in the runtime doors' errors.

        Decoded on a worker thread (zlib lets go of the GIL while it inflates): a body
        of a few megabytes made to inflate slowly (empty deflate blocks, say) would
        otherwise hold the event loop, and every request on it, for most of a second."""
        try:
            return await asyncio.to_thread(
                bodies.decoded, body, content_encoding, max_bytes=self.max_payload_bytes
            )
        except BodyTooLarge:
            raise PayloadTooLarge(
                f"Request body is larger than the maximum of {self.max_payload_bytes} bytes "
                "once decoded."
            ) from None
        except BodyEncodingError as exc:
            error = UnsupportedEncoding if exc.unsupported else MalformedEncoding
            raise error(str(exc)) from None

    def too_large(self, *, body_left: bool) -> PayloadTooLarge:
        """The refusal of a body over ``max_payload_bytes``; ``body_left`` when some of
        it is still unread (the door drains it before answering)."""
        exc = PayloadTooLarge(
            f"Request body is larger than the maximum of {self.max_payload_bytes} bytes."
        )
        exc.body_left = body_left
        return exc


CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"
"""The CustomAttributes header as a request carries it."""


def ask_by_attributes(call: Call, value: bytes) -> None:
    """The priority and deadline a request's CustomAttributes ask for
    (routing/priorities.py), onto ``call``; the header still goes to the model unchanged.
    Read only when an item may be ours.

    Raises:
        RuntimeValidationError: a ``shipyard-`` item that is not well formed.
    """
    if b"shipyard-" in value.lower():
        call.priority, call.deadline_s = priorities.from_custom_attributes(value.decode("latin-1"))


def session_headers(call: Call, closed: bytes | None) -> list[tuple[bytes, bytes]]:
    """The session headers of an answer: the session the call opened, the one the model
    closed (routing/sessions.py)."""
    out = []
    if call.opened is not None:
        out.append((sessions.NEW_HEADER, call.opened))
    if closed:
        out.append((sessions.CLOSED_HEADER, closed))
    return out
