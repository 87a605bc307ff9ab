"""The Open Inference Protocol's REST door: every ``/v2`` path, as a raw ASGI handler.

Raw ASGI for the same reason as the runtime door: ``POST .../infer`` is the data path.
The paths (``{version}`` is a variant, optional everywhere)::

    GET  /v2                                         server metadata
    GET  /v2/health/live | /v2/health/ready          200 when live / ready
    GET  /v2/models/{endpoint}[/versions/{v}]        model metadata
    GET  /v2/models/{endpoint}[/versions/{v}]/ready  200 when an instance can answer
    POST /v2/models/{endpoint}[/versions/{v}]/infer  JSON tensors or the binary extension

Errors are ``{"error": "<message>"}`` with the status of gateway.oip.status_of.
"""

from __future__ import annotations

import logging
from typing import Any

from shipyard.errors import AuthFailure, ClientGone, PayloadTooLarge, RuntimeFailure, TensorError
from shipyard.gateway.doors.oip.protocol import InferenceProtocol, status_of
from shipyard.gateway.wire.errors import retry_after, send_json
from shipyard.http import bodies
from shipyard.http.server import on_disconnect
from shipyard.routing.call import Call
from shipyard.routing.invocation import Invocations
from shipyard.tensors import (
    HEADER_LENGTH,
    header_length_of,
    numpy_imported,
    parse_request,
    rest_response,
    select_outputs,
)

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

_HEADER_LENGTH = HEADER_LENGTH.lower().encode()


class OipRestDoor:
    """Serves ``/v2/...`` over HTTP with an :class:`InferenceProtocol`."""

    def __init__(self, protocol: InferenceProtocol) -> None:
        self.protocol = protocol
        self.access = protocol.access

    def __repr__(self) -> str:
        return f"OipRestDoor({self.protocol!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = scope["path"].strip("/").split("/")
        method = scope["method"]
        calls: list[Call] = []
        failure: BaseException | None = None
        try:
            status = await self._route(scope, receive, send, parts, method, calls)
        except ClientGone:
            return
        except Exception as exc:
            failure = exc
            if not isinstance(exc, RuntimeFailure | TensorError | AuthFailure):
                log.exception("v2 request %s %s failed", method, scope["path"])
            if isinstance(exc, PayloadTooLarge) and exc.body_left:
                await bodies.drain(receive)
            error = status_of(exc)
            status = error.http
            await send_json(send, status, {"error": error.message}, retry_after(exc))
        Invocations.count(calls[0] if calls else None, status, failure)

    async def _route(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        parts: list[str],
        method: str,
        calls: list[Call],
    ) -> int:
        protocol = self.protocol
        if parts == ["v2"] and method == "GET":
            return await _json(send, 200, protocol.server_metadata())
        if parts[:2] == ["v2", "health"] and len(parts) == 3 and method == "GET":
            if parts[2] == "live":
                return await _json(send, 200, {"live": True})
            if parts[2] == "ready":
                ready = protocol.is_ready()
                return await _json(send, 200 if ready else 503, {"ready": ready})
        if parts[:2] == ["v2", "models"] and len(parts) >= 3:
            name, version, action = _model_path(parts[2:])
            self.access.reach(scope, name)  # each /v2/models path acts on the endpoint
            if action == "" and method == "GET":
                return await _json(send, 200, protocol.model_metadata(name, version))
            if action == "ready" and method == "GET":
                ready = protocol.model_ready(name, version)
                return await _json(send, 200 if ready else 400, {"name": name, "ready": ready})
            if action == "infer" and method == "POST":
                return await self._infer(scope, receive, send, name, version, calls)
        path = scope["path"]
        raise _NoSuchPath(f"shipyard does not serve {method} {path}.")

    async def _infer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        name: str,
        version: str | None,
        calls: list[Call],
    ) -> int:
        header_length: bytes | None = None
        content_length: int | None = None
        codings: list[bytes] = []
        for key, value in scope["headers"]:
            if key == _HEADER_LENGTH:
                header_length = value
            elif key == b"content-length":
                content_length = int(value)
            elif key == b"content-encoding":
                codings.append(value)  # repeated, one list (RFC 9110 5.3)
        access = self.access
        if content_length is not None and content_length > access.max_payload_bytes:
            raise access.too_large(body_left=True)
        body = await access.read_body(scope, receive)
        if codings:
            # tritonclient.http's request_compression_algorithm: gzip or deflate. The
            # binary extension's header length counts the JSON header before compression.
            body = await access.decoded(body, b",".join(codings))
        length = header_length_of(None, header_length.decode("latin-1") if header_length else None)
        await numpy_imported()
        request = parse_request(body, length)
        answer = await self.protocol.infer(name, version, request, calls, on_disconnect(scope))
        header: dict[str, Any] = {
            "model_name": answer.model_name,
            "model_version": answer.model_version,
        }
        if request.id is not None:
            header["id"] = request.id
        payload, json_length = rest_response(header, select_outputs(request, answer.outputs))
        headers = [(b"content-length", str(len(payload)).encode())]
        if json_length is None:
            headers.append((b"content-type", b"application/json"))
        else:
            headers.append((b"content-type", b"application/octet-stream"))
            headers.append((_HEADER_LENGTH, str(json_length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        return 200


class _NoSuchPath(RuntimeFailure):
    status_code = 404


def _model_path(rest: list[str]) -> tuple[str, str | None, str]:
    """``{name}[/versions/{v}][/action]`` → (name, version, action or "")."""
    name, rest = rest[0], rest[1:]
    version: str | None = None
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
    if len(rest) > 1:
        return name, version, "/".join(rest)
    return name, version, rest[0] if rest else ""


async def _json(send: Send, status: int, body: dict[str, Any]) -> int:
    await send_json(send, status, body)
    return status
