"""The OpenAI-compatible door: ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings``, as the ``openai`` client (v1) sends them.

A raw ASGI handler on the data path, as the runtime doors are (gateway/doors/runtime.py). It
translates the OpenAI wire into the same :class:`~shipyard.routing.call.Call` an
InvokeEndpoint makes, and the answer back; everything between (variants, components,
sessions, shadows, limits, metrics, data capture) is routing/invocation.py's, so a
request here is served exactly as the same body sent to InvokeEndpoint would be.

- ``model`` names an endpoint, or ``<endpoint>/<inference component>``; the body reaches
  the model unchanged (the LMI request shape). The door checks only that it is a JSON
  object naming ``model``: parameters are the model's to accept or refuse.
- ``stream: true`` asks the instance for a streamed answer: JSON Lines of OpenAI chunk
  objects (one per item a built-in handler's generator yields). :class:`SseFraming`
  frames each line as a server-sent ``data:`` event and ends with ``data: [DONE]``; a
  failure once events flow is one last ``data: {"error": ...}`` event. The streamed
  exchange is gateway/doors/streaming.py's ``StreamRelay``: a client that disconnects cuts
  the exchange, which closes the model's generator.
- Errors are OpenAI's error object (gateway/wire/errors.py: ``openai_error_response``).
- ``GET /v1/models`` lists the real-time endpoints (and ``endpoint/component`` for
  endpoints of inference components) the caller's key reaches.

Under ``auth:``, every path here counts as ``sagemaker-runtime:InvokeEndpoint`` (the
edge, gateway/edge/signatures.py, admits SigV4 or a key's bearer token) and each request asks
``reach`` for the endpoint it names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from shipyard.contract import FORWARDED
from shipyard.errors import (
    AuthFailure,
    ClientGone,
    EndpointNotFound,
    InternalFailure,
    PayloadTooLarge,
    RuntimeFailure,
    RuntimeValidationError,
)
from shipyard.gateway.doors.endpoint import EndpointAccess, session_headers
from shipyard.gateway.doors.relay import ASK_STREAM, FramingError, StreamClient, StreamRelay
from shipyard.gateway.edge.auth import admitted, resource_arn
from shipyard.gateway.wire.errors import openai_error_event, openai_error_response, send_json
from shipyard.gateway.wire.runtime_headers import INVOKE_ENDPOINT, check_header
from shipyard.http import bodies
from shipyard.http.client import Response
from shipyard.http.server import on_disconnect
from shipyard.routing import priorities, sessions
from shipyard.routing.call import Call, Exchange
from shipyard.routing.invocation import Invocations
from shipyard.routing.table import EndpointRoute

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

PREFIX = "/v1"
_INVOKE = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/embeddings"))
_MODELS = "/v1/models"
_JSON = b"application/json"
_ASK_JSON = ((b"Content-Type", _JSON), (b"Accept", _JSON))
_NOT_FORWARDED = (b"content-type", b"accept")  # the body is JSON and so is the answer
_DONE = b"data: [DONE]\n\n"
MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest line of a model's streamed answer the door holds while it waits for the
line's end."""


class ModelNotFound(EndpointNotFound):
    """``model`` names no endpoint (or component) this gateway serves: OpenAI's 404."""

    status_code = 404


class OpenAIDoor:
    """Translates the OpenAI API to calls (routing/invocation.py) and back."""

    def __init__(self, *, access: EndpointAccess) -> None:
        self.access = access
        self.invocations = access.invocations
        self.router = access.router
        self.relay = StreamRelay(access.invocations, openai_error_response)
        self.created = int(time.time())
        """What ``/v1/models`` gives as every model's ``created``: when this gateway
        started serving it (an endpoint's own creation time is in the store, which the
        data path never reads)."""

    def __repr__(self) -> str:
        return f"OpenAIDoor({self.router!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if path in _INVOKE:
                if method != "POST":
                    raise _NotAllowed(f"{method} is not supported on {path}; use POST.")
                await self._invoke(scope, receive, send)
            elif path == _MODELS or path.startswith(_MODELS + "/"):
                if method != "GET":
                    raise _NotAllowed(f"{method} is not supported on {path}; use GET.")
                await self._models(scope, send, path[len(_MODELS) + 1 :])
            else:
                raise _UnknownPath(f"shipyard does not serve {method} {path}.")
        except (RuntimeFailure, AuthFailure) as exc:
            if isinstance(exc, PayloadTooLarge) and exc.body_left:
                await bodies.drain(receive)
            await openai_error_response(exc, send)
        except ClientGone:
            return
        except Exception:
            log.exception("OpenAI request %s %s failed", method, path)
            await openai_error_response(InternalFailure("Internal failure."), send)

    # -- models -----------------------------------------------------------------------

    async def _models(self, scope: Scope, send: Send, wanted: str) -> None:
        edge = admitted(scope)
        region, account = self.invocations.region, self.invocations.account_id
        found = []
        for name, route in sorted(self.router.routes.items()):
            if route.async_config is not None:
                continue
            if not edge.reaches(resource_arn(region, account, "endpoint", name)):
                continue
            if route.hosts_components:
                found += [f"{name}/{c}" for c in sorted(route.components)]
            else:
                found.append(name)
        if wanted:
            if wanted not in found:
                raise ModelNotFound(_no_model(wanted))
            await send_json(send, 200, self._model(wanted))
            return
        await send_json(send, 200, {"object": "list", "data": [self._model(m) for m in found]})

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "shipyard"}

    # -- invocations ------------------------------------------------------------------

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        access = self.access
        forward, declared = _forwarded(scope)
        if declared is not None and declared > access.max_payload_bytes:
            raise access.too_large(body_left=True)  # refused before it is read
        body = await access.read_body(scope, receive)
        model, stream, priority = _read_request(body)
        name, _, component = model.partition("/")
        access.reach(scope, name)
        route = self._route(model, name, component)
        if stream:
            forward.append(ASK_STREAM)

            async def prepare(client: StreamClient) -> tuple[EndpointRoute, Call]:
                call = Call(forward, body, started=started, component=component or None)
                call.priority = priority
                return route, call

            await self.relay.serve(receive, send, prepare, SseFraming(), model)
            return
        call = Call(
            forward,
            body,
            content_length=len(body),
            watch_gone=on_disconnect(scope),
            started=started,
            component=component or None,
            priority=priority,
        )
        response = await self._whole(route, call, model)
        headers = [
            (b"content-type", response.header(b"content-type") or _JSON),
            (b"content-length", str(len(response.body)).encode()),
            (b"x-amzn-invoked-production-variant", call.variant.name.encode()),  # type: ignore[union-attr]
        ]
        if call.session is not None:
            headers += session_headers(call, response.header(sessions.CLOSED_HEADER))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    async def _whole(self, route: EndpointRoute, call: Call, model: str) -> Response:
        """The model's whole answer to ``call``, counted.

        A generation can run for minutes: a client that leaves meanwhile cuts the
        exchange (which closes the instance's connection, and the runtime the model's
        generator), as a stream's does, rather than leaving the instance to work for
        nobody. Such a call is not counted: nobody got an answer. The disconnect is
        watched by a callback of the connection's (``call.watch_gone``), not a task:
        a task per request cost a tenth of the door's throughput on a cheap model.
        """
        task = asyncio.current_task()
        assert task is not None and call.watch_gone is not None
        gone = False

        def left() -> None:
            nonlocal gone
            gone = True
            task.cancel()

        unwatch = call.watch_gone(left)
        status, error = 200, None
        try:
            return await self.invocations.run(route, call)
        except (RuntimeFailure, AuthFailure) as exc:
            status, error = exc.status_code, exc
            raise
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            status = 0
            raise ClientGone() from None
        except ClientGone:
            status = 0
            raise
        except Exception:
            log.exception("OpenAI invocation of %s failed", model)
            status = 500
            raise InternalFailure("Internal failure.") from None
        finally:
            unwatch()
            if status:
                Invocations.count(call, status, error)

    def _route(self, model: str, name: str, component: str) -> EndpointRoute:
        """The endpoint ``model`` names; 404 for an unknown endpoint or component, 400
        for an endpoint of components named bare: a component is required there."""
        try:
            route = self.invocations.route(name)
        except EndpointNotFound:
            raise ModelNotFound(_no_model(model)) from None
        if component or model.endswith("/"):
            if not route.hosts_components or component not in route.components:
                raise ModelNotFound(_no_model(model))
        elif route.hosts_components:
            names = ", ".join(f"{name}/{c}" for c in sorted(route.components)) or "none yet"
            raise RuntimeValidationError(
                f"The model `{model}` is an endpoint of inference components: name one as "
                f"`<endpoint>/<component>` ({names})."
            )
        return route


class SseFraming:
    """The door's streamed answer: each JSON line the model sends as one server-sent
    event, ``data: [DONE]`` at the end, a failure as a last ``data: {"error": ...}``.

    The model's chunks need not end on a line: a partial line waits for the rest (held
    as its pieces, so a long line costs its length once), up to MAX_LINE_BYTES; a chunk
    that is one whole JSON object is one event (the built-in runtime's item). A
    model that already speaks SSE (its lines begin ``data:``, its last is ``[DONE]``)
    is framed once, not twice."""

    __slots__ = ("_pieces", "_held")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._held = 0

    def head(self, exchange: Exchange, call: Call) -> dict[str, Any]:
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-amzn-invoked-production-variant", exchange.variant.name.encode()),
        ]
        headers += session_headers(call, exchange.response.header(sessions.CLOSED_HEADER))
        return {"type": "http.response.start", "status": 200, "headers": headers}

    def parts(self, chunk: bytes) -> Iterable[bytes]:
        if b"\n" not in chunk:
            if not self._pieces and _one_object(chunk):
                return (_event(chunk),)  # one item a generator yielded, encoded whole
            self._hold(chunk)
            return ()
        first, *lines, rest = chunk.split(b"\n")
        if self._pieces:
            first = b"".join((*self._pieces, first))
            self._pieces.clear()
            self._held = 0
        if rest:
            self._hold(rest)
        events = b"".join(_event(line) for line in (first, *lines))
        return (events,) if events else ()

    def failure(self, code: str, message: str) -> bytes:
        return self._flush() + openai_error_event(code, message)

    def internal_failure(self) -> bytes:
        return self._flush() + openai_error_event("internal_error", "Internal failure.")

    def end(self) -> bytes:
        return self._flush() + _DONE

    def _hold(self, piece: bytes) -> None:
        self._held += len(piece)
        if self._held > MAX_LINE_BYTES:
            raise FramingError(
                f"the model sent a line of more than {MAX_LINE_BYTES} bytes; a streamed "
                "answer is one JSON object a line"
            )
        self._pieces.append(piece)

    def _flush(self) -> bytes:
        rest = b"".join(self._pieces)
        self._pieces.clear()
        self._held = 0
        return _event(rest)


def _one_object(chunk: bytes) -> bool:
    """Whether ``chunk`` is one whole JSON object: the built-in runtime sends each item a
    model's generator yields as one chunk, encoded without a line's end (the routing
    client keeps the instance's chunks whole)."""
    stripped = chunk.strip()
    if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
        return False
    try:
        return isinstance(json.loads(stripped), dict)
    except (ValueError, RecursionError):  # the model wrote it
        return False


def _event(line: bytes) -> bytes:
    line = line.strip()
    if line.startswith(b"data:"):
        line = line[5:].lstrip()
    if not line or line == b"[DONE]":
        return b""
    return b"data: " + line + b"\n\n"


def _forwarded(scope: Scope) -> tuple[list[tuple[bytes, bytes]], int | None]:
    """The headers for the instance (the body's type and the answer's, JSON, and the
    runtime headers a client may send: sessions, custom attributes, limited as
    InvokeEndpoint limits them) and the body's declared length."""
    forward: list[tuple[bytes, bytes]] = [*_ASK_JSON]
    declared: int | None = None
    for key, value in scope["headers"]:
        if key == b"content-length":
            if not value.isdigit():
                raise RuntimeValidationError("Content-Length must be a number of bytes.")
            declared = int(value)
        elif key not in _NOT_FORWARDED and (wire := FORWARDED.get(key)) is not None:
            check_header(INVOKE_ENDPOINT, key, value)
            forward.append((wire, value))
    return forward, declared


def _read_request(body: bytes) -> tuple[str, bool, int | None]:
    """The ``model`` a request body names, whether it asks for a stream and the priority
    its ``service_tier`` asks for (routing/priorities.py); 400 unless it is a JSON object
    naming one with a known tier."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise RuntimeValidationError(
            "The request body is not valid JSON: send a JSON object."
        ) from None
    if not isinstance(request, dict):
        raise RuntimeValidationError("The request body must be a JSON object.")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise RuntimeValidationError(
            "You must provide a model parameter: an endpoint's name, or "
            "`<endpoint>/<inference component>`."
        )
    priority = priorities.from_service_tier(request.get("service_tier"))
    return model, request.get("stream") is True, priority


def _no_model(model: str) -> str:
    return f"The model `{model}` does not exist or you do not have access to it."


class _NotAllowed(RuntimeValidationError):
    status_code = 405


class _UnknownPath(RuntimeValidationError):
    wire_type = "UnknownOperationException"
    status_code = 404
