"""The one place errors become responses, in each door's wire shape.

- control plane (AWS JSON 1.1 and 1.0): HTTP 400 with ``{"__type": code, "message": ...}``;
  CloudWatch's faults (``MetricsFault``) name their error shape in ``__type`` and their
  query-compatible code in ``x-amzn-query-error``, as botocore's errorfactory expects
- Smithy RPC v2 CBOR (CloudWatch): the same members, CBOR-encoded
- runtime (rest-json, sagemaker-runtime): ``x-amzn-ErrorType`` header and a body that
  carries ModelError's ``OriginalStatusCode``, ``OriginalMessage`` and ``LogStreamArn``
- jobs facade (``POST /inference``): ``{"status": code, "errMsg": ...}``, same HTTP status
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import cbor2
from starlette.responses import Response

from shipyard.errors import (
    AuthFailure,
    FacadeRefusal,
    MetricsFault,
    ModelError,
    RuntimeFailure,
    ShipyardError,
)

log = logging.getLogger(__name__)

AMZ_JSON = "application/x-amz-json-1.1"
CBOR = "application/cbor"


def _control_error(exc: Exception) -> tuple[int, dict[str, str], dict[str, str]]:
    """Status, body and headers of a control-plane error, whatever the wire."""
    if not isinstance(exc, ShipyardError):
        log.error("control-plane request failed", exc_info=exc)
        return 500, {"__type": "InternalFailure", "message": "An internal error occurred."}, {}
    if isinstance(exc, MetricsFault):
        body = {"__type": exc.shape, "message": exc.message}
        return exc.status_code, body, {"x-amzn-query-error": f"{exc.wire_type};Sender"}
    body = {"__type": exc.wire_type, "message": exc.message}
    return exc.status_code, body, {"x-amzn-ErrorType": exc.wire_type}


def control_error_response(exc: Exception, *, media_type: str = AMZ_JSON) -> Response:
    status, body, headers = _control_error(exc)
    return Response(json.dumps(body), status_code=status, media_type=media_type, headers=headers)


def rpc_v2_error_response(exc: Exception) -> Response:
    status, body, headers = _control_error(exc)
    headers["smithy-protocol"] = "rpc-v2-cbor"
    return Response(cbor2.dumps(body), status_code=status, media_type=CBOR, headers=headers)


def runtime_error_body(exc: ShipyardError) -> dict[str, Any]:
    body: dict[str, Any] = {"ErrorCode": exc.wire_type, "message": exc.message}
    body["Message"] = exc.message
    if isinstance(exc, ModelError):
        body["OriginalStatusCode"] = exc.original_status_code
        body["OriginalMessage"] = exc.original_message
        body["LogStreamArn"] = exc.log_stream_arn
    return body


def runtime_error_answer(exc: ShipyardError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The runtime's error answer for ``exc``: status, headers and body."""
    payload = json.dumps(runtime_error_body(exc)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"x-amzn-errortype", exc.wire_type.encode()),
    ]
    if isinstance(exc, RuntimeFailure) and exc.retry_after_s is not None:
        headers.append((b"retry-after", str(exc.retry_after_s).encode()))
    return exc.status_code, headers, payload


async def runtime_error_response(exc: ShipyardError, send: Any) -> None:
    status, headers, payload = runtime_error_answer(exc)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def facade_error_response(exc: Exception) -> Response:
    """The facade's shape: ``{"status", "errMsg"}``, the HTTP status equal to ``status``."""
    if isinstance(exc, FacadeRefusal | AuthFailure) or (
        isinstance(exc, ShipyardError) and 400 <= exc.status_code < 500
    ):
        status, message = exc.status_code, exc.message
    else:
        log.error("facade request failed", exc_info=exc)
        status, message = 500, "An internal error occurred."
    body = json.dumps({"status": status, "errMsg": message})
    return Response(body, status_code=status, media_type="application/json")


def unknown_path_response(path: str, method: str, status_code: int) -> Response:
    """A path or method no door serves, answered in the shape of the door it looks like,
    so a client reports a named error instead of failing to parse ``Not Found``."""
    if path == "/console" or (
        path.startswith("/console/") and not path.startswith("/console/api/")
    ):
        # A browser's page: the path it asked for (which a link can fill with markup) is
        # not repeated, and the answer is not to be read as anything but text.
        return Response(
            "Not found" if status_code == 404 else "Method not allowed",
            status_code=status_code,
            media_type="text/plain",
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
        )
    if status_code == 405:
        message = f"{method} is not supported on {path}."
    else:
        message = f"shipyard does not serve {method} {path}."
    if path.startswith("/endpoints/"):  # the runtime's rest-json doors
        body = {"ErrorCode": "UnknownOperationException", "message": message, "Message": message}
        return Response(
            json.dumps(body),
            status_code=status_code,
            media_type="application/json",
            headers={"x-amzn-ErrorType": "UnknownOperationException"},
        )
    if path.startswith("/inference"):  # the jobs facade
        facade = {"status": status_code, "errMsg": message}
        return Response(json.dumps(facade), status_code=status_code, media_type="application/json")
    if path.startswith("/service/"):  # Smithy RPC v2 (CloudWatch)
        from shipyard.errors import UnknownOperation

        response = rpc_v2_error_response(UnknownOperation(message))
        response.status_code = status_code
        return response
    if path.startswith("/jobs/"):  # job logs
        logs = {"message": message}
        return Response(json.dumps(logs), status_code=status_code, media_type="application/json")
    body = {"__type": "UnknownOperationException", "message": message}
    return Response(
        json.dumps(body),
        status_code=status_code,
        media_type=AMZ_JSON,
        # The path is repeated: nothing but JSON to a browser (the console's API too).
        headers={
            "x-amzn-ErrorType": "UnknownOperationException",
            "X-Content-Type-Options": "nosniff",
        },
    )


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_body(exc: ShipyardError) -> tuple[int, dict[str, Any]]:
    """The OpenAI-compatible door's error: status and ``{"error": {message,
    type, param, code}}``, as the ``openai`` client raises it.

    A model's own error keeps a 4xx status (a parameter it refused, its own overload)
    and becomes 500 otherwise. The statuses the door's own errors mean are not the
    model's to give: a model's 401 or 403 (a service it called refused it) is its
    failure, 500, not the caller's key; its 404 (an adapter it lacks) is a request it
    refused, 400, not an unknown model. When the model answered an OpenAI error object,
    that object is passed on. An authentication failure is 401, a key without the right
    403.
    """
    status = exc.status_code
    code: str | None = exc.wire_type
    message = exc.message
    if isinstance(exc, ModelError):
        original = exc.original_status_code
        status = _MODELS_OWN.get(original, original) if 400 <= original < 500 else 500
        code = "model_error"
        given = _model_error_object(exc.original_message)
        if given is not None:
            return status, {"error": given}
        message = exc.original_message or exc.message
    elif isinstance(exc, AuthFailure):
        status = 403 if exc.wire_type == "AccessDeniedException" else 401
        code = "invalid_api_key" if status == 401 else "access_denied"
    elif status == 404:
        code = "model_not_found" if exc.wire_type == "ValidationError" else code
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}


_MODELS_OWN = {401: 500, 403: 500, 404: 400}
"""A model's statuses that would read as the door's own errors, as the door answers them."""


def _model_error_object(text: str) -> dict[str, Any] | None:
    """The OpenAI error object a model answered, alone or after the built-in runtime's
    ``<ExcType>: `` (runtime/server.py), if it answered one."""
    if not text.startswith("{"):
        _, colon, rest = text.partition(": ")
        if not colon or not rest.startswith("{"):
            return None
        text = rest
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):  # the model wrote it
        return None
    error = found.get("error") if isinstance(found, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error
    return None


async def openai_error_response(exc: ShipyardError, send: Any) -> None:
    status, body = openai_error_body(exc)
    await send_json(send, status, body, retry_after(exc))


def retry_after(exc: BaseException) -> list[tuple[bytes, bytes]]:
    """The ``Retry-After`` header of an error that says when to retry (an overloaded
    queue, a throttled request), for every HTTP door's answer; none otherwise."""
    if isinstance(exc, RuntimeFailure) and exc.retry_after_s is not None:
        return [(b"retry-after", str(exc.retry_after_s).encode())]
    return []


async def send_json(
    send: Any, status: int, body: dict[str, Any], extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A JSON answer on a raw ASGI door: the head (with ``extra`` headers), then the
    body in one message."""
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def openai_error_event(code: str, message: str) -> bytes:
    """A failure once a stream's events flow: one last server-sent event."""
    error = {"message": message, "type": "server_error", "param": None, "code": code}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
