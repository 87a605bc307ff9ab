"""The jobs doors over HTTP: ``POST /inference`` (the one-call facade) and job logs.

The facade answers with the HTTP status equal to the body's ``status``:
200 scheduled, 501 no usable ``type``, 510 type not white-listed, 502 limit reached.
"""

from __future__ import annotations

import json
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shipyard.errors import AccessDenied, JobTypeNotAllowed, MissingJobType, ResourceNotFound
from shipyard.gateway.api.control import read_body
from shipyard.gateway.edge.auth import admitted, resource_arn
from shipyard.gateway.wire.errors import control_error_response, facade_error_response
from shipyard.job_contract import open_untrusted, untrusted_size
from shipyard.jobs.service import JobService, _from_template

_MAX_LOG_CHUNK_BYTES = 1 << 20

MAX_BODY_BYTES = 64 << 10
"""``{"type": ...}`` is a few bytes; a bigger body is refused (413) unread."""

MAX_TYPE_CHARS = 128
"""Longest job type name taken; longer ones are refused without being echoed whole."""


class JobsDoor:
    """Translates the facade's and the logs' HTTP into JobService calls."""

    def __init__(self, *, jobs: JobService) -> None:
        self.jobs = jobs

    def __repr__(self) -> str:
        return f"JobsDoor({self.jobs!r})"

    async def inference(self, request: Request) -> Response:
        try:
            job_type = _job_type(await read_body(request, max_bytes=MAX_BODY_BYTES))
            self._reach(request, job_type)
            job, remaining = await run_in_threadpool(self.jobs.submit, job_type)
        except Exception as exc:
            return facade_error_response(exc)
        return JSONResponse(
            {
                "status": 200,
                "errMsg": f"A new job [{job.name}] was scheduled successfully, and "
                f"{remaining} slots remaining.",
                "jobName": job.name,
                "slotsRemaining": remaining,
            }
        )

    def _reach(self, request: Request, job_type: str) -> None:
        """AccessDenied unless the caller's key reaches the job a ``job_type`` job would be
        (its ``resources``), before anything is scheduled: its name is made
        as the job's is (the type, then a time stamp), so patterns on the name's start
        (``training-job/team-a-*``) decide. An unknown type is left to ``submit``."""
        edge = admitted(request.scope)
        jobs = self.jobs
        if edge.reaches_all or job_type not in jobs.config.white_list:
            return
        name = _from_template(jobs.config, job_type)["TrainingJobName"]
        edge.reach(resource_arn(jobs.region, jobs.account_id, "training-job", name))

    async def logs(self, request: Request) -> Response:
        """The job's log from byte ``offset`` on (all attempts, oldest first).

        ``X-Shipyard-Next-Offset`` says where to ask next and ``X-Shipyard-Job-Status``
        whether more can come, which is all ``shipyard logs --follow`` needs.
        """
        name = request.path_params["name"]
        jobs = self.jobs
        try:  # keys scoped by resource must reach the job's ARN
            arn = resource_arn(jobs.region, jobs.account_id, "training-job", name)
            admitted(request.scope).reach(arn)
        except AccessDenied as exc:
            return control_error_response(exc)
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            return JSONResponse({"message": "offset must be an integer"}, status_code=400)
        try:
            files = await run_in_threadpool(self.jobs.log_files, name)
            job = await run_in_threadpool(self.jobs.describe, name)
        except ResourceNotFound:
            return JSONResponse({"message": f"Could not find job {name}."}, status_code=404)
        chunk = await run_in_threadpool(_read_from, files, offset)
        headers = {
            "X-Shipyard-Next-Offset": str(offset + len(chunk)),
            "X-Shipyard-Job-Status": job.status.value,
        }
        return Response(chunk, media_type="text/plain; charset=utf-8", headers=headers)


def _job_type(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # the decoder recurses once per nesting level
        raise MissingJobType("The request body is not a JSON object.") from None
    if not isinstance(body, dict):
        raise MissingJobType("The request body is not a JSON object.")
    job_type = body.get("type")
    if not isinstance(job_type, str) or not job_type.strip():
        raise MissingJobType('The request has no valid "type": give a job type name.')
    if len(job_type) > MAX_TYPE_CHARS:
        # No white list holds such a name; and errMsg must not echo a megabyte back.
        raise JobTypeNotAllowed(
            f"The type [{job_type[:MAX_TYPE_CHARS]}...] is not in the white list."
        )
    return job_type


def _read_from(files: list[Path], offset: int) -> bytes:
    """Bytes ``offset``.. of the files read as one stream; missing files are empty.

    The job's code may have replaced its log (a link to a file it cannot read itself,
    a FIFO): such a file reads as empty (job_contract.py ``open_untrusted``).
    """
    for path in files:
        size = untrusted_size(path)
        if offset >= size:
            offset -= size
            continue
        try:
            with open_untrusted(path) as f:
                f.seek(offset)
                return f.read(_MAX_LOG_CHUNK_BYTES)
        except OSError:
            return b""
    return b""
