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
from shipyard.gateway.doors.endpoint import (
    CUSTOM_ATTRIBUTES,
    EndpointAccess,
    ask_by_attributes,
    session_headers,
)
from shipyard.gateway.wire.errors import runtime_error_answer
from shipyard.gateway.wire.runtime_headers import INVOKE_ENDPOINT, check_header
from shipyard.http import bodies
from shipyard.http.client import Response
from shipyard.http.server import Respond, on_disconnect
from shipyard.routing import sessions
from shipyard.routing.call import ASKED_BY, Call
from shipyard.routing.invocation import Invocations
from shipyard.routing.table import EndpointRoute

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

_TARGET_VARIANT = b"x-amzn-sagemaker-target-variant"
_COMPONENT = b"x-amzn-sagemaker-inference-component"


class RuntimeDoor:
    """Translates sagemaker-runtime requests to calls (routing/invocation.py) and back.

    Two drivers over one preparation (``_prepare``: reach, route, the headers made a
    call, the declared length held to the limit) and one answering step (``_answer``:
    the answer's headers or the error's shape, and the variant's counts). ``__call__``,
    the ASGI app, reads the body and awaits ``Invocations.run``; ``serve_whole``, the
    callback path's, has the body whole and passes ``Invocations.start`` a callback.
    They differ only in how the body arrives and how the answer is written."""

    def __init__(self, *, access: EndpointAccess) -> None:
        self.access = access
        self.invocations = access.invocations
        self.router = access.router
        self.max_payload_bytes = access.max_payload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        started = time.perf_counter()
        call: Call | None = None  # once made (its body read), counted
        response: Response | None = None
        error: BaseException | None = None
        try:
            route, made = self._prepare(scope, name, started)
            # The whole body before any instance is chosen: a client that trickles it
            # must not hold an instance's slot (or a place in its queue) while it does.
            made.body = await self.access.read_body(scope, receive)
            made.watch_gone = on_disconnect(scope)
            call = made
            response = await self.invocations.run(route, call)
        except Exception as exc:
            error = exc
            if isinstance(exc, PayloadTooLarge) and exc.body_left:
                await bodies.drain(receive)
        answer = self._answer(name, call, None, response, error)
        if answer is None:
            return
        status, headers, body = answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def serve_whole(self, scope: Scope, name: str, body: bytes, respond: Respond) -> bool:
        """The callback path's driver: the invocation in ``scope``, its whole ``body`` in
        hand, served with no task. If an instance can take it at once, or its variant's
        queue can hold it (Invocations.start), its answer is given to ``respond``
        (status, headers, body) from the loop's callbacks. False: nothing was done, and
        ``__call__`` serves the request, which also answers every refusal (one met here
        is not answered here)."""
        started = time.perf_counter()
        try:
            route, call = self._prepare(scope, name, started)
            if len(body) > self.max_payload_bytes:
                return False  # chunked, so undeclared: ``__call__`` refuses it
            call.body = body
            call.watch_gone = on_disconnect(scope)
            # What _answer returns is for ``__call__``; Invocations.start drops it.
            answer = partial(self._answer, name, call, respond)
            try:
                return self.invocations.start(route, call, answer)  # type: ignore[arg-type]
            except (RuntimeFailure, AuthFailure) as exc:
                # Refused by the routing (admission, a full queue, no variant): answered
                # here, in the door's shape, so that what refused it counts it once.
                self._answer(name, call, respond, None, exc)
                return True
        except Exception:
            # Refused, or something unexpected, before anything was sent: ``__call__``
            # meets the same and answers it in the door's shape.
            return False

    def _prepare(self, scope: Scope, name: str, started: float) -> tuple[EndpointRoute, Call]:
        """What both drivers do before the body: the key's reach, the endpoint's route,
        the call the headers make (its body to come), the declared length held to
        ``max_payload_bytes``. Raises the refusal."""
        self.access.reach(scope, name)
        route = self.invocations.route(name)
        call = self._call(scope, started)
        if call.content_length is not None and call.content_length > self.max_payload_bytes:
            raise self.access.too_large(body_left=True)
        return route, call

    def _answer(
        self,
        name: str,
        call: Call | None,
        respond: Respond | None,
        response: Response | None,
        error: BaseException | None,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """The answering step both drivers share, and Invocations.start's callback: the
        model's answer with the runtime's headers, or the error in the runtime's shape
        (an unexpected one logged, and answered as an internal failure), written through
        ``respond`` (the callback path's; ``__call__`` sends what is returned); then
        counted for its variant (Invocations.count) when ``call`` was made. None for a
        client gone (left while it waited for its body or an instance): nobody to
        answer, and nothing counted."""
        if isinstance(error, ClientGone):
            return None
        try:
            if response is not None:
                assert call is not None
                answer = 200, self._answer_headers(call, response), response.body
            elif isinstance(error, RuntimeFailure | AuthFailure):
                answer = runtime_error_answer(error)
            else:
                raise error or AssertionError("neither an answer nor an error")
        except Exception as exc:
            log.error("invocation of %s failed", name, exc_info=exc)
            error = None
            answer = runtime_error_answer(InternalFailure("Internal failure."))
        if respond is not None:
            respond(*answer)
        if call is not None:
            Invocations.count(call, answer[0], error)
        return answer

    def _call(self, scope: Scope, started: float) -> Call:
        """The call the request's headers make, its body to come: what is forwarded to
        the model, TargetVariant, InferenceComponentName and the declared length, each
        header held to its limits."""
        forward: list[tuple[bytes, bytes]] = []
        target: str | None = None
        component: str | None = None
        content_length: int | None = None
        asks = 0
        attributes: bytes | None = None
        for key, value in scope["headers"]:
            if key in INVOKE_ENDPOINT:  # a header with limits of its own
                check_header(INVOKE_ENDPOINT, key, value)
            wire = FORWARDED.get(key)
            if wire is not None:
                forward.append((wire, value))
                if wire in ASKED_BY:  # TargetModel, TargetContainerHostname: rare
                    asks |= ASKED_BY[wire]
                elif key == CUSTOM_ATTRIBUTES:
                    attributes = value
            elif key == b"content-length":
                content_length = int(value)
            elif key == _TARGET_VARIANT:
                target = value.decode()
            elif key == _COMPONENT:
                component = value.decode(errors="replace")
        call = Call(
            forward,
            b"",
            content_length=content_length,
            target=target,
            started=started,
            component=component,
            asks=asks,
        )
        if attributes is not None:
            ask_by_attributes(call, attributes)
        return call

    @staticmethod
    def _answer_headers(call: Call, response: Response) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", response.header(b"content-type") or b"application/octet-stream"),
            (b"content-length", b"%d" % len(response.body)),
            (b"x-amzn-invoked-production-variant", call.variant.name.encode()),  # type: ignore[union-attr]
        ]
        attributes = response.header(CUSTOM_ATTRIBUTES)
        if attributes is not None:
            headers.append((b"x-amzn-sagemaker-custom-attributes", attributes))
        if call.session is not None:
            headers += session_headers(call, response.header(sessions.CLOSED_HEADER))
        return headers
