"""The asynchronous runtime door: ``POST /endpoints/{name}/async-invocations``.

InvokeEndpointAsync names its input's location in a header or sends the input inline as
its body (at most 128,000 bytes), never both. The door checks the endpoint is
asynchronous, queues the request durably (an inline input with it) and answers 202 with
the InferenceId and where the output or failure file will appear.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.concurrency import run_in_threadpool

from shipyard.async_inference.queue import MAX_INLINE_BYTES, AsyncInvocations
from shipyard.errors import (
    AuthFailure,
    BodyTimedOut,
    BodyTimeout,
    BodyTooLarge,
    ClientLeft,
    InternalFailure,
    RuntimeFailure,
    RuntimeValidationError,
)
from shipyard.gateway.edge.auth import admitted, resource_arn
from shipyard.gateway.wire.errors import runtime_error_response
from shipyard.gateway.wire.runtime_headers import INVOKE_ENDPOINT_ASYNC, check_header
from shipyard.http import bodies
from shipyard.routing.router import Router

log = logging.getLogger(__name__)

_PREFIX = b"x-amzn-sagemaker-"


class AsyncDoor:
    """Translates InvokeEndpointAsync into AsyncInvocations.submit and back."""

    def __init__(
        self,
        *,
        router: Router,
        invocations: AsyncInvocations,
        account_id: str,
        region: str = "us-east-1",
        body_timeout_s: float = 60.0,
    ) -> None:
        self.router = router
        self.invocations = invocations
        self.account_id = account_id
        self.region = region
        self.body_timeout_s = body_timeout_s

    def __repr__(self) -> str:
        return f"AsyncDoor({self.invocations!r})"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, name: str) -> None:
        try:
            inline = await self._read_body(scope, receive)
            body, headers = await self._submit(scope, name, inline)
        except ClientLeft:
            return  # gone before its body was whole: nobody to answer
        except (RuntimeFailure, AuthFailure) as exc:
            await runtime_error_response(exc, send)
            return
        except Exception:
            log.exception("asynchronous invocation of %s failed", name)
            await runtime_error_response(InternalFailure("Internal failure."), send)
            return
        payload = json.dumps(body).encode()
        headers += [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        await send({"type": "http.response.start", "status": 202, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> bytes:
        """The input sent inline, if any: one over MAX_INLINE_BYTES is refused (and the
        rest of it read and dropped, so the client reads the answer)."""
        try:
            return await bodies.read_body(
                scope, receive, max_bytes=MAX_INLINE_BYTES, timeout_s=self.body_timeout_s
            )
        except BodyTooLarge as exc:
            if exc.body_left:
                await bodies.drain(receive)
            raise RuntimeValidationError(
                f"Body is over the maximum of {MAX_INLINE_BYTES} bytes: put a larger input "
                "at an InputLocation."
            ) from None
        except BodyTimedOut as exc:
            raise BodyTimeout(
                f"The request body did not arrive within {exc.timeout_s:g} seconds."
            ) from None

    async def _submit(
        self, scope: dict[str, Any], name: str, inline: bytes
    ) -> tuple[dict[str, str], list[tuple[bytes, bytes]]]:
        edge = admitted(scope)
        if edge.caller is not None:  # keys scoped by resource
            edge.reach(resource_arn(self.region, self.account_id, "endpoint", name))
        route = self.router.routes.get(name)
        if route is None:
            raise RuntimeValidationError(f"Endpoint {name} of account {self.account_id} not found.")
        if route.async_config is None:
            raise RuntimeValidationError(
                f"Endpoint {name} is not an asynchronous endpoint: invoke it with InvokeEndpoint."
            )
        for key, value in scope["headers"]:
            check_header(INVOKE_ENDPOINT_ASYNC, key, value)
        given = {
            k[len(_PREFIX) :].decode(): v.decode(errors="replace")
            for k, v in scope["headers"]
            if k.startswith(_PREFIX)
        }
        inference_id = given.get("inference-id")
        if inference_id is not None and (
            "/" in inference_id or "\\" in inference_id or inference_id in (".", "..")
        ):
            # It names the output and failure files: it must not reach another folder.
            raise RuntimeValidationError(
                f"InferenceId {inference_id[:64]!r} may not contain '/' or '\\' or be '.' "
                "or '..': it names the output file."
            )
        request = await run_in_threadpool(
            self.invocations.submit,
            name,
            route.async_config,
            input_location=given.get("inputlocation"),
            body=inline or None,
            inference_id=inference_id,
            content_type=given.get("content-type"),
            accept=given.get("accept"),
            custom_attributes=given.get("custom-attributes"),
            ttl_s=_int(given, "requestttlseconds", "RequestTTLSeconds"),
            timeout_s=_int(given, "invocationtimeoutseconds", "InvocationTimeoutSeconds"),
            output_extension=given.get("s3outputpathextension"),
            filename=given.get("filename"),
        )
        headers = [
            (b"x-amzn-sagemaker-outputlocation", request.output_location.encode()),
            (b"x-amzn-sagemaker-failurelocation", request.failure_location.encode()),
        ]
        return {"InferenceId": request.inference_id}, headers


def _int(given: dict[str, str], key: str, name: str) -> int | None:
    value = given.get(key)
    if value is None:
        return None
    # ASCII digits alone: Python's int() also takes "1_000", spaces and other scripts' digits.
    if not value.isascii() or not value.isdigit():
        raise RuntimeValidationError(f"{name} must be an integer, not {value!r}.")
    return int(value)
