"""The runtime door: ``POST /endpoints/{name}/invocations`` as a raw ASGI handler.

Raw ASGI rather than a Starlette route because this is the data path: the body is passed
through as bytes (never parsed), the routing table is read from memory, and the only
per-request work is picking an instance and copying bytes.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from shipyard.contract import FORWARDED
from shipyard.errors import (
    AuthFailure,
    ClientGone,
    InternalFailure,
    PayloadTooLarge,
    RuntimeFailure,
)
from shipyard.gateway.doors.endpoint import EndpointAccess, session_headers
from shipyard.gateway.wire.errors import runtime_error_answer, runtime_error_response
from shipyard.gateway.wire.runtime_headers import INVOKE_ENDPOINT, check_header
from shipyard.http import bodies
from shipyard.http.client import Response
from shipyard.http.server import Respond, on_disconnect
from shipyard.routing import sessions
from shipyard.routing.call import ASKED_BY, Call
from shipyard.routing.invocation import Invocations

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

_TARGET_VARIANT = b"x-amzn-sagemaker-target-variant"
_COMPONENT = b"x-amzn-sagemaker-inference-component"
_CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"


class RuntimeDoor:
    """Translates sagemaker-runtime requests to calls (routing/invocation.py) and back."""

    def __init__(self, *, access: EndpointAccess) -> None:
        self.access = access
        self.invocations = access.invocations
        self.router = access.router
        self.max_payload_bytes = access.max_payload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        started = time.perf_counter()
        calls: list[Call] = []  # the call, once made, for its variant's counts
        error: BaseException | None = None
        try:
            status = await self._invoke(scope, receive, send, name, started, calls)
        except (RuntimeFailure, AuthFailure) as exc:
            status, error = exc.status_code, exc
            if isinstance(exc, PayloadTooLarge) and exc.body_left:
                await bodies.drain(receive)
            await runtime_error_response(exc, send)
        except ClientGone:
            return
        except Exception:
            log.exception("invocation of %s failed", name)
            status = 500
            await runtime_error_response(InternalFailure("Internal failure."), send)
        if calls:
            Invocations.count(calls[0], status, error)

    async def _invoke(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        name: str,
        started: float,
        calls: list[Call],
    ) -> int:
        self.access.reach(scope, name)
        route = self.invocations.route(name)
        call = self._call(scope, started)
        if call.content_length is not None and call.content_length > self.max_payload_bytes:
            raise self.access.too_large(body_left=True)
        # The whole body before any instance is chosen: a client that trickles it must
        # not hold an instance's slot (or a place in its queue) while it does.
        call.body = await self.access.read_body(scope, receive)
        call.watch_gone = on_disconnect(scope)
        calls.append(call)
        response = await self.invocations.run(route, call)
        headers = self._answer_headers(call, response)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        return 200

    def take(self, scope: Scope, name: str, body: bytes, respond: Respond) -> bool:
        """Serve the invocation in ``scope``, its whole ``body`` in hand, with no task
        (Invocations.start): sent now, or queued until an instance can take it, and its
        answer given to ``respond`` (status, headers, body) from the loop's callbacks.
        False: refused before anything was sent, and the door's ASGI call serves the
        request, which answers the refusal in the door's shape."""
        started = time.perf_counter()
        try:
            self.access.reach(scope, name)
            route = self.invocations.route(name)
            call = self._call(scope, started)
            if len(body) > self.max_payload_bytes:
                return False
            call.body = body
            call.watch_gone = on_disconnect(scope)
            return self.invocations.start(route, call, partial(self._answer, call, respond))
        except Exception:
            # Refused, or something unexpected, before anything was sent: the ASGI call
            # meets the same and answers it in the door's shape.
            return False

    def _answer(
        self,
        call: Call,
        respond: Respond,
        response: Response | None,
        error: BaseException | None,
    ) -> None:
        """Answer a call ``take`` started, as ``__call__`` answers (and counts) one."""
        if isinstance(error, ClientGone):
            return  # left while it waited for an instance: nobody to answer
        try:
            if response is not None:
                answer = 200, self._answer_headers(call, response), response.body
            elif isinstance(error, RuntimeFailure | AuthFailure):
                answer = runtime_error_answer(error)
            else:
                raise error or AssertionError("neither an answer nor an error")
        except Exception as exc:
            log.error("invocation failed", exc_info=exc)
            error = None
            answer = runtime_error_answer(InternalFailure("Internal failure."))
        respond(*answer)
        Invocations.count(call, answer[0], error)

    def _call(self, scope: Scope, started: float) -> Call:
        """The call the request's headers make, its body to come: what is forwarded to
        the model, TargetVariant, InferenceComponentName and the declared length, each
        header held to its limits."""
        forward: list[tuple[bytes, bytes]] = []
        target: str | None = None
        component: str | None = None
        content_length: int | None = None
        asks = 0
        for key, value in scope["headers"]:
            if key in INVOKE_ENDPOINT:  # a header with limits of its own
                check_header(INVOKE_ENDPOINT, key, value)
            wire = FORWARDED.get(key)
            if wire is not None:
                forward.append((wire, value))
                if wire in ASKED_BY:  # TargetModel, TargetContainerHostname: rare
                    asks |= ASKED_BY[wire]
            elif key == b"content-length":
                content_length = int(value)
            elif key == _TARGET_VARIANT:
                target = value.decode()
            elif key == _COMPONENT:
                component = value.decode(errors="replace")
        return Call(
            forward,
            b"",
            content_length=content_length,
            target=target,
            started=started,
            component=component,
            asks=asks,
        )

    @staticmethod
    def _answer_headers(call: Call, response: Response) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", response.header(b"content-type") or b"application/octet-stream"),
            (b"content-length", str(len(response.body)).encode()),
            (b"x-amzn-invoked-production-variant", call.variant.name.encode()),  # type: ignore[union-attr]
        ]
        attributes = response.header(_CUSTOM_ATTRIBUTES)
        if attributes is not None:
            headers.append((b"x-amzn-sagemaker-custom-attributes", attributes))
        if call.session is not None:
            headers += session_headers(call, response.header(sessions.CLOSED_HEADER))
        return headers
