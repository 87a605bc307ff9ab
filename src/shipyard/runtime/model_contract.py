"""The multi-model container contract over HTTP: TargetModel invocations and ``/models``.

Served instead of RuntimeApp when the runtime starts in multi-model mode:

- ``GET /ping``: 200 as soon as the process serves; models load on demand.
- ``POST /invocations`` with ``X-Amzn-SageMaker-Target-Model: <name>``: that model, loaded
  first if needed, answers as in single-model mode (Content-Type, Accept,
  Custom-Attributes, handler errors); without the header, 400.
- SageMaker's API for multi-model containers, where ``{name}`` is one path segment (a
  ``/`` in a name is sent as ``%2F``):

  - ``GET /models`` (query ``page_size``, ``next_page_token``): 200
    ``{"models": [{"modelName", "modelUrl"}], "nextPageToken"}``, the token only when
    more follow;
  - ``POST /models`` ``{"model_name", "url"}``: 200 once loaded; 409 when loaded or being
    loaded; 507 when it cannot fit;
  - ``GET /models/{name}``: 200 ``{"modelName", "modelUrl", "memoryBytes"}``, or 404;
  - ``DELETE /models/{name}``: 200 once unloaded, or 404 when not loaded;
  - ``POST /models/{name}/invoke``: as ``/invocations``, for a loaded model only, else 404.

The response headers and the errors are multimodel.py's. A platform error carries
``X-Shipyard-Error``, so the gateway tells ``ModelNotFound`` from a user's handler that
raised with status 404.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from shipyard.contract import (
    BATCH,
    ERROR,
    EVICTED,
    LOADED_MODELS,
    MODEL_CACHE,
    MODEL_TIMINGS,
    TARGET_MODEL_HEADER,
    format_batch,
    format_evicted,
    format_timings,
)
from shipyard.errors import BadModelRequest, InvalidTargetModel, MultiModelError
from shipyard.runtime.batching import BatchConfig, Batcher
from shipyard.runtime.handlers import Handlers
from shipyard.runtime.multimodel import Acquired, ModelCache, check_model_name
from shipyard.runtime.server import (
    Receive,
    Scope,
    Send,
    context_of,
    describe_failure,
    request_headers,
    with_context,
)
from shipyard.runtime.workers import Inline, Runner, batch_runner

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]

_TARGET_MODEL = TARGET_MODEL_HEADER.lower().encode()
_CACHE = MODEL_CACHE
_EVICTED = EVICTED
_TIMINGS = MODEL_TIMINGS
_LOADED = LOADED_MODELS
_ERROR = ERROR
_TEXT = (b"content-type", b"text/plain; charset=utf-8")
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True, slots=True)
class _Request:
    body: bytes
    content_type: str
    accept: str
    attributes: str | None
    target: bytes | None
    headers: list[tuple[bytes, bytes]]
    """All of them: a Context reads its session there (runtime/server.py's ``context_of``)."""


class MultiModelApp:
    """The ASGI app of a multi-model instance: the models of one ModelCache, on demand."""

    def __init__(
        self,
        cache: ModelCache[Handlers],
        *,
        threads: Runner | None = None,
        batching: BatchConfig | None = None,
    ) -> None:
        self.cache = cache
        self.threads = threads or Inline()
        self.batching = batching
        """Server-side batching, for each model that defines ``predict_batch_fn``."""
        self._batch_runner = None if batching is None else batch_runner(self.threads)
        """What runs every model's batches: one runner, however many models come and go."""

    def __repr__(self) -> str:
        return f"MultiModelApp({self.cache!r}, {self.threads!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # uvicorn runs with lifespan and websockets off; nothing else arrives
        path = scope["path"]
        method = scope["method"]
        if path == "/invocations":
            if method == "POST":
                await self._invocations(scope, receive, send)
            else:
                await _text(send, 405, "Method Not Allowed", [(b"allow", b"POST")])
        elif path == "/ping":
            if method == "GET" or method == "HEAD":
                await _send(send, 200, [(b"content-length", b"0")], b"")
            else:
                await _text(send, 405, "Method Not Allowed", [(b"allow", b"GET, HEAD")])
        elif path == "/models" or path.startswith("/models/"):
            await self._models(scope, receive, send)
        else:
            await _text(send, 404, "Not Found")

    async def _invocations(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = await _read_request(scope, receive)
        if request is None:
            return
        try:
            if self.batching is not None:
                status, headers, body = await self._batched(
                    await self.cache.acquire(_target(request.target)), request, self.batching
                )
            else:
                # Handed straight to _respond: no local here keeps the model alive while
                # the response is sent, so an unload meanwhile frees its memory at once.
                status, headers, body = await self.threads.run(
                    _respond, await self.cache.acquire(_target(request.target)), request, self.cache
                )
        except MultiModelError as exc:
            await self._refuse(send, exc)
            return
        await _send(send, status, headers, body)

    async def _batched(
        self, acquired: Acquired[Handlers], request: _Request, config: BatchConfig
    ) -> tuple[int, Headers, bytes]:
        """Through the model's own batcher when it batches; else as without batching."""
        handlers = acquired.model
        if not handlers.batches or not handlers.batchable(request.content_type):
            return await self.threads.run(_respond, acquired, request, self.cache)
        batcher = handlers.batcher
        if batcher is None:
            assert self._batch_runner is not None, "batching is configured"
            batcher = handlers.batcher = Batcher(handlers, self._batch_runner, config)
        headers = _model_headers(acquired, self.cache)
        context = context_of(request.headers, request.attributes) if handlers.uses_context else None
        try:
            answer = await batcher.submit(
                (request.body, request.content_type, request.accept, context)
            )
            extra = with_context([], context)  # ValueError: a value no header can hold
        except Exception as exc:
            status, text = describe_failure(exc)
            body = text.encode()
            return status, [*headers, _TEXT, (b"content-length", str(len(body)).encode())], body
        headers.append((b"content-type", answer.media_type.encode("latin-1")))
        headers.append((b"content-length", str(len(answer.payload)).encode()))
        headers.append((BATCH, format_batch(answer.size, answer.wait_s)))
        return 200, headers + extra, answer.payload

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _model_route(scope)
        method = scope["method"]
        try:
            if route is None:
                await _text(send, 404, "Not Found")
            elif route[0] is None:
                await self._collection(scope, receive, send, method)
            elif route[1]:
                await self._invoke_loaded(scope, receive, send, route[0])
            else:
                await self._member(send, method, route[0])
        except MultiModelError as exc:
            await self._refuse(send, exc)

    async def _collection(self, scope: Scope, receive: Receive, send: Send, method: str) -> None:
        if method == "GET":
            await _json(send, 200, self._list(scope), [self._count()])
        elif method == "POST":
            body = await _read_body(receive)
            if body is None:
                return
            name, url = _load_request(body)
            headers = _model_headers(await self.cache.load(name, url), self.cache)
            await _json(send, 200, {"modelName": name, "modelUrl": url}, headers)
        else:
            await _text(send, 405, "Method Not Allowed", [(b"allow", b"GET, POST")])

    async def _member(self, send: Send, method: str, name: str) -> None:
        if method == "GET":
            info = self.cache.describe(name)
            payload = {"modelName": info.name, "modelUrl": info.url}
            await _json(send, 200, {**payload, "memoryBytes": info.memory_bytes}, [self._count()])
        elif method == "DELETE":
            timings = format_timings(unload_s=await self.cache.unload(name))
            headers = [(_TIMINGS, timings.encode()), self._count()]
            await _json(send, 200, {"modelName": name}, headers)
        else:
            await _text(send, 405, "Method Not Allowed", [(b"allow", b"GET, DELETE")])

    async def _invoke_loaded(self, scope: Scope, receive: Receive, send: Send, name: str) -> None:
        if scope["method"] != "POST":
            await _text(send, 405, "Method Not Allowed", [(b"allow", b"POST")])
            return
        request = await _read_request(scope, receive)
        if request is None:
            return
        status, headers, body = await self.threads.run(
            _respond, self.cache.touch(name), request, self.cache
        )
        await _send(send, status, headers, body)

    def _list(self, scope: Scope) -> dict[str, Any]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        start = _query_int(query, "next_page_token", minimum=0) or 0
        size = _query_int(query, "page_size", minimum=1)
        models = self.cache.models()
        end = len(models) if size is None else start + size
        page = [{"modelName": info.name, "modelUrl": info.url} for info in models[start:end]]
        if end < len(models):
            return {"models": page, "nextPageToken": str(end)}
        return {"models": page}

    def _count(self) -> tuple[bytes, bytes]:
        return (_LOADED, str(self.cache.loaded_count).encode())

    async def _refuse(self, send: Send, exc: MultiModelError) -> None:
        code = exc.code
        log.warning("%s (%s): %s", code, exc.status_code, exc)
        await _text(
            send, exc.status_code, f"{code}: {exc}", [(_ERROR, code.encode()), self._count()]
        )


def _respond(
    acquired: Acquired[Handlers], request: _Request, cache: ModelCache[Handlers]
) -> tuple[int, Headers, bytes]:
    """Run the request through the model's handlers: status, headers and body."""
    handlers = acquired.model
    headers = _model_headers(acquired, cache)
    context = context_of(request.headers, request.attributes) if handlers.uses_context else None
    try:
        payload, media_type = handlers.invoke(
            request.body, request.content_type, request.accept, context
        )
        extra = with_context([], context)  # ValueError: a value no header can hold
    except Exception as exc:
        status, text = describe_failure(exc)
        body = text.encode()
        return status, [*headers, _TEXT, (b"content-length", str(len(body)).encode())], body
    headers.append((b"content-type", media_type.encode("latin-1")))
    headers.append((b"content-length", str(len(payload)).encode()))
    return 200, headers + extra, payload


def _model_headers(acquired: Acquired[Any], cache: ModelCache[Handlers]) -> Headers:
    headers = [
        (_CACHE, b"hit" if acquired.hit else b"miss"),
        (_LOADED, str(cache.loaded_count).encode()),
    ]
    if acquired.evicted:
        headers.append((_EVICTED, format_evicted(acquired.evicted).encode()))
    timings = acquired.timings()
    if timings:
        headers.append((_TIMINGS, timings.encode()))
    return headers


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client went away."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _read_request(scope: Scope, receive: Receive) -> _Request | None:
    body = await _read_body(receive)
    if body is None:
        return None
    content_type, accept, attributes, _, target = request_headers(scope["headers"], _TARGET_MODEL)
    return _Request(body, content_type, accept, attributes, target, scope["headers"])


def _target(raw: bytes | None) -> str:
    if raw is None:
        raise InvalidTargetModel(
            f"The {TARGET_MODEL_HEADER} header is required: this instance serves "
            "several models and must be told which one to invoke."
        )
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidTargetModel(f"The {TARGET_MODEL_HEADER} header is not UTF-8.") from None


def _model_route(scope: Scope) -> tuple[str | None, bool] | None:
    """``(None, False)`` for /models, ``(name, invoke?)`` for /models/{name}[/invoke]."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    segments = raw.decode("latin-1").split("/")[2:]  # after "", "models"
    if not segments:
        return None, False
    if not segments[0] or len(segments) > 2 or segments[1:] not in ([], ["invoke"]):
        return None
    try:
        return unquote(segments[0], errors="strict"), len(segments) == 2
    except UnicodeDecodeError:
        return None


def _load_request(body: bytes) -> tuple[str, str]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        payload = None
    name = payload.get("model_name") if isinstance(payload, dict) else None
    url = payload.get("url") if isinstance(payload, dict) else None
    if not isinstance(name, str) or not isinstance(url, str) or not url:
        raise BadModelRequest(
            'POST /models takes a JSON object {"model_name": "<name>", "url": "<artifact>"}.'
        )
    return check_model_name(name, what="model_name"), url


def _query_int(query: dict[str, list[str]], key: str, *, minimum: int) -> int | None:
    values = query.get(key)
    if not values:
        return None
    try:
        value = int(values[0])
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise BadModelRequest(
            f"{key} must be a whole number, {minimum} or more; got {values[0]!r}."
        )
    return value


async def _send(send: Send, status: int, headers: Headers, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _text(send: Send, status: int, text: str, headers: Headers | None = None) -> None:
    body = text.encode()
    length = (b"content-length", str(len(body)).encode())
    await _send(send, status, [*(headers or []), _TEXT, length], body)


async def _json(send: Send, status: int, payload: object, headers: Headers) -> None:
    body = json.dumps(payload).encode()
    await _send(send, status, [*headers, _JSON, (b"content-length", str(len(body)).encode())], body)
