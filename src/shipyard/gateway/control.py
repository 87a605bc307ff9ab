"""The control-plane door: ``POST /`` in AWS JSON 1.1, as boto3's ``sagemaker`` sends it.

Whatever arrives, the answer is an AWS JSON error or a result, never a 500 or a hang:
the body is read up to a cap (``MAX_BODY_BYTES``) within a time limit, JSON nested
deeper than any SageMaker shape is refused before anything walks it, and the request is
checked against botocore's service model before an action sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from shipyard.control.endpoints import EndpointService
from shipyard.control.logs import LogService
from shipyard.control.scaling import ScalingService
from shipyard.errors import RequestTooLarge, SerializationException, UnknownOperation
from shipyard.gateway.actions import ACTIONS, JOB_ACTIONS
from shipyard.gateway.actions.autoscaling import ACTIONS as SCALING_ACTIONS
from shipyard.gateway.actions.logs import ACTIONS as LOG_ACTIONS
from shipyard.gateway.actions.transform_jobs import ACTIONS as TRANSFORM_ACTIONS
from shipyard.gateway.auth import admitted
from shipyard.gateway.errors import AMZ_JSON, control_error_response
from shipyard.gateway.validation import RequestValidator
from shipyard.jobs.service import JobService
from shipyard.transform.service import TransformService

_PREFIX = "SageMaker."
_LOGS_PREFIX = "Logs_20140328."
_SCALING_PREFIX = "AnyScaleFrontendService."

MAX_BODY_BYTES = 1 << 20
"""SageMaker's control-plane requests are a few KiB; a bigger body is refused unread."""

MAX_DEPTH = 64
"""Deepest JSON nesting accepted; SageMaker's input shapes nest about ten levels."""

BODY_TIMEOUT_S = 30.0
"""How long the whole body may take to arrive; a slower client gets a 400."""

_DRAIN_BYTES = 8 << 20
_DRAIN_S = 2.0


def _json_default(value: object) -> object:
    # AWS JSON 1.1 sends timestamps as epoch seconds.
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(f"cannot serialise {type(value).__name__}")


class ControlDoor:
    """Runs the ``X-Amz-Target`` the edge read (``auth.Admitted``), validated against the
    service model."""

    def __init__(
        self,
        *,
        service: EndpointService,
        jobs: JobService,
        validator: RequestValidator,
        logs: LogService | None = None,
        scaling: ScalingService | None = None,
        transforms: TransformService | None = None,
    ) -> None:
        self.service = service
        self.jobs = jobs
        self.validator = validator
        self.logs = logs
        """CloudWatch Logs' calls (``Logs_20140328.*``), when served."""
        self._logs_validator = RequestValidator("logs") if logs is not None else None
        self.transforms = transforms
        """Batch transform's calls, when served."""
        self.scaling = scaling
        """Application Auto Scaling's calls (``AnyScaleFrontendService.*``), when served."""
        self._scaling_validator = (
            RequestValidator("application-autoscaling") if scaling is not None else None
        )

    async def handle(self, request: Request) -> Response:
        request_id = {"x-amzn-RequestId": str(uuid.uuid4())}
        try:
            result = await self._handle(request)
        except Exception as exc:  # every error leaves through the one renderer
            response = control_error_response(exc)
            response.headers.update(request_id)
            return response
        body = json.dumps(result, default=_json_default)
        return Response(body, media_type=AMZ_JSON, headers=request_id)

    async def _handle(self, request: Request) -> dict[str, Any]:
        # The target the edge read and authorised, never the header again: a second
        # reading could pick another value (DESIGN 2.9, "read once").
        target = admitted(request.scope).target
        if target.startswith(_LOGS_PREFIX) and self.logs is not None:
            return await self._logs(request, target.removeprefix(_LOGS_PREFIX))
        if target.startswith(_SCALING_PREFIX) and self.scaling is not None:
            return await self._scaling(request, target.removeprefix(_SCALING_PREFIX))
        action = target.removeprefix(_PREFIX) if target.startswith(_PREFIX) else None
        served = action is not None and (
            action in ACTIONS
            or action in JOB_ACTIONS
            or (action in TRANSFORM_ACTIONS and self.transforms is not None)
        )
        if action is None or not served:
            raise UnknownOperation(f"The operation {target[:200] or '(none)'} is not supported.")
        params = _parse(await read_body(request, max_bytes=MAX_BODY_BYTES))
        self.validator.validate(action, params)
        assert isinstance(params, dict)  # validate refuses anything but a JSON object
        _drop_nulls(params)
        if action in JOB_ACTIONS:
            return await run_in_threadpool(JOB_ACTIONS[action], self.jobs, params)
        if action in TRANSFORM_ACTIONS:
            assert self.transforms is not None  # "served" checked it
            return await run_in_threadpool(TRANSFORM_ACTIONS[action], self.transforms, params)
        return await run_in_threadpool(ACTIONS[action], self.service, params)

    async def _logs(self, request: Request, action: str) -> dict[str, Any]:
        if action not in LOG_ACTIONS:
            raise UnknownOperation(f"The operation {_LOGS_PREFIX}{action[:200]} is not supported.")
        params = _parse(await read_body(request, max_bytes=MAX_BODY_BYTES))
        assert self._logs_validator is not None and self.logs is not None
        self._logs_validator.validate(action, params)
        assert isinstance(params, dict)
        _drop_nulls(params)
        return await run_in_threadpool(LOG_ACTIONS[action], self.logs, params)

    async def _scaling(self, request: Request, action: str) -> dict[str, Any]:
        if action not in SCALING_ACTIONS:
            raise UnknownOperation(
                f"The operation {_SCALING_PREFIX}{action[:200]} is not supported."
            )
        params = _parse(await read_body(request, max_bytes=MAX_BODY_BYTES))
        assert self._scaling_validator is not None and self.scaling is not None
        self._scaling_validator.validate(action, params)
        assert isinstance(params, dict)
        _drop_nulls(params)
        return await run_in_threadpool(SCALING_ACTIONS[action], self.scaling, params)


async def read_body(request: Request, *, max_bytes: int) -> bytes:
    """The body, refused with RequestTooLarge as soon as it is known to pass ``max_bytes``.

    Shared by the doors that buffer small JSON bodies (the control plane, the facade).
    """
    declared = admitted(request.scope).head.content_length or ""
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in stream:
                size += len(chunk)
                if size > max_bytes:
                    break
                chunks.append(chunk)
    except TimeoutError:
        raise SerializationException(
            f"The request body did not arrive within {BODY_TIMEOUT_S:g} seconds."
        ) from None
    except ClientDisconnect:
        # Nobody is left to read the answer; say so without a traceback in the log.
        raise SerializationException("The client closed the connection mid-body.") from None
    if size > max_bytes:
        await _drain(stream)
        raise _too_large(max_bytes)
    return b"".join(chunks)


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Read and drop a little more of an oversize body, so that a client still sending
    reads the 413 rather than a reset connection; then give up and let it close."""
    seen = 0
    with contextlib.suppress(TimeoutError, ClientDisconnect):
        async with asyncio.timeout(_DRAIN_S):
            async for chunk in stream:
                seen += len(chunk)
                if seen > _DRAIN_BYTES:
                    return


def _too_large(max_bytes: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than {max_bytes} bytes, the most this door accepts."
    )


def _parse(raw: bytes) -> object:
    """The body as JSON; ``SerializationException`` for anything else or too deep."""
    try:
        params = json.loads(raw or b"{}")
    except RecursionError:  # the decoder recurses once per level
        raise _too_deep() from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise SerializationException(f"Request body is not valid JSON: {exc}") from exc
    _check_depth(params)
    return params


def _check_depth(value: object) -> None:
    """Refuse nesting past MAX_DEPTH, walking without recursion (the validator and
    error messages recurse along the value), and strings no UTF-8 can hold (a lone
    surrogate escape such as ``"\\udfff"``), which nothing downstream could store."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
            continue
        if isinstance(item, dict):
            for key in item:
                _check_text(key)
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise _too_deep()
        stack.extend((child, depth + 1) for child in children)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError:
        raise SerializationException(
            "Request body is not valid JSON: a string holds a lone surrogate, which is no "
            "Unicode character."
        ) from None


def _drop_nulls(value: object) -> None:
    """Remove null members, which AWS's deserialiser reads as absent, so that actions
    see ``"MaxResults": null`` as no MaxResults. Validation has already refused nulls
    where they are not allowed (list items, map values)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in [k for k, v in item.items() if v is None]:
                del item[key]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _too_deep() -> SerializationException:
    return SerializationException(f"Request body nests deeper than {MAX_DEPTH} levels.")
