"""The control-plane door: ``POST /`` in AWS JSON 1.1, as boto3's ``sagemaker`` sends it."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from shipyard.control.endpoints import EndpointService
from shipyard.errors import SerializationException, UnknownOperation
from shipyard.gateway.actions import ACTIONS, JOB_ACTIONS
from shipyard.gateway.errors import AMZ_JSON, control_error_response
from shipyard.gateway.validation import RequestValidator
from shipyard.jobs.service import JobService

_PREFIX = "SageMaker."


def _json_default(value: object) -> object:
    # AWS JSON 1.1 sends timestamps as epoch seconds.
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(f"cannot serialise {type(value).__name__}")


class ControlDoor:
    """Parses ``X-Amz-Target``, validates against the service model, runs the action."""

    def __init__(
        self, *, service: EndpointService, jobs: JobService, validator: RequestValidator
    ) -> None:
        self.service = service
        self.jobs = jobs
        self.validator = validator

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
        target = request.headers.get("x-amz-target", "")
        action = target.removeprefix(_PREFIX) if target.startswith(_PREFIX) else None
        if action is None or (action not in ACTIONS and action not in JOB_ACTIONS):
            raise UnknownOperation(f"The operation {target or '(none)'} is not supported.")
        raw = await request.body()
        try:
            params = json.loads(raw or b"{}")
        except ValueError as exc:
            raise SerializationException(f"Request body is not valid JSON: {exc}") from exc
        self.validator.validate(action, params)
        if action in JOB_ACTIONS:
            return await run_in_threadpool(JOB_ACTIONS[action], self.jobs, params)
        return await run_in_threadpool(ACTIONS[action], self.service, params)
