"""The ASGI layer that lets only signed, allowed requests through (DESIGN 2.9).

It sits in front of every door when the stack file has an ``auth:`` section, and is not
there at all without one, so local use pays nothing. A SigV4 signature covers the body,
so the body is read here (up to the largest body any door takes, and within a time
limit) and handed on to the door as one message: the door reads it as if from the
socket. A request that carries no signature at all is refused before its body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from shipyard.errors import AuthFailure, ShipyardError
from shipyard.gateway.auth import Door, SignedRequest, Verifier, action_of, authorize
from shipyard.gateway.errors import (
    control_error_response,
    facade_error_response,
    runtime_error_response,
)

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DISCARD_TIMEOUT_S = 2.0
_DISCARD_LIMIT = 1 << 20  # of an unsigned request's body, read so the client sees the 403


class BodyTooLarge(ShipyardError):
    """A signed request whose body is larger than any door takes."""

    wire_type = "ValidationException"
    status_code = 413


class BodyTimeout(ShipyardError):
    """The client did not send its whole body in time."""

    wire_type = "ValidationException"
    status_code = 408


class RequireSignature:
    """Wraps the gateway's app: verify, authorise, then pass the request on unchanged."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        verifier: Verifier,
        account_id: str,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.account_id = account_id
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def __repr__(self) -> str:
        return f"RequireSignature({self.verifier!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wanted = _wanted(scope)
        target = wanted.get(b"x-amz-target")
        door_action = action_of(scope["method"], scope["path"], target)
        if door_action is None:
            await self.app(scope, receive, send)
            return
        door, action = door_action
        try:
            declared = wanted.get(b"content-length") or ""
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                # Refused at once: waiting for a body we would refuse lets a client that
                # declares 100 MB and sends nothing hold the request open.
                raise BodyTooLarge(
                    f"Request body is larger than the maximum of {self.max_body_bytes} bytes."
                )
            if b"authorization" not in wanted:
                await _discard(receive, _DISCARD_LIMIT)
                body = b""
            else:
                body = await self._read_body(receive)
            caller = self.verifier.verify(
                SignedRequest(
                    method=scope["method"],
                    raw_path=scope.get("raw_path") or scope["path"].encode(),
                    query_string=scope.get("query_string", b""),
                    headers=scope["headers"],
                    body=body,
                )
            )
            authorize(caller, action, account_id=self.account_id)
        except (AuthFailure, BodyTooLarge, BodyTimeout) as exc:
            log.info("refused %s %s: %s", scope["method"], scope["path"], exc.wire_type)
            await _render(door, exc, scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        break
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        if message.get("more_body", False):
                            await _discard(receive, _DISCARD_LIMIT)
                        raise BodyTooLarge(
                            f"Request body is larger than the maximum of "
                            f"{self.max_body_bytes} bytes."
                        )
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise BodyTimeout(
                f"The request body did not arrive within {self.body_timeout_s:g} seconds."
            ) from None
        return b"".join(chunks)


_WANTED = (b"x-amz-target", b"content-length", b"authorization")


def _wanted(scope: Scope) -> dict[bytes, str]:
    """The few headers this layer reads itself, in one pass."""
    return {key: value.decode("latin-1") for key, value in scope["headers"] if key in _WANTED}


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then what the socket says next."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _discard(receive: Receive, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of body so the client reads our refusal.

    Bounded in time too: a client that trickles its body must not hold the refusal back.
    """
    seen = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_DISCARD_TIMEOUT_S):
            while seen <= limit:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                seen += len(message.get("body", b""))


async def _render(
    door: Door, exc: ShipyardError, scope: Scope, receive: Receive, send: Send
) -> None:
    if door is Door.RUNTIME:
        await runtime_error_response(exc, send)
        return
    if door is Door.FACADE:
        response = facade_error_response(exc)
    elif door is Door.V2:
        from starlette.responses import Response

        payload = json.dumps({"error": exc.message})
        response = Response(payload, exc.status_code, media_type="application/json")
    else:
        response = control_error_response(exc)
    await response(scope, receive, send)
