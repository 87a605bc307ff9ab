"""ProcessingSupervisor: the job supervisor (jobs/supervisor.py) for processing jobs.

The same convergence (a runner per InProgress job, its status lines applied, SIGTERM
for Stopping, found again after a gateway restart), with the processing runner and
its ``processing.json`` in place of the training runner's ``job.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shipyard.backends.base import PROCESSING_RUNNER
from shipyard.jobs.supervisor import JobSupervisor
from shipyard.processing.service import command
from shipyard.processing.spec import CAPTURE_INPUT, PROCESSING_FILE, Input, Output, ProcessingSpec
from shipyard.records import Job


class ProcessingSupervisor(JobSupervisor):
    """Starts, watches and stops processing runners so they match the store."""

    runner = PROCESSING_RUNNER
    counted = False

    def prepare(self, job: Job, workdir: Path) -> bool:
        spec = processing_spec(job, stop_grace_s=self.stop_grace_s)
        (workdir / PROCESSING_FILE).write_text(spec.to_json())
        # The runner fetches and uploads; the script is given S3 access only through
        # what its request names (its Environment).
        opened = [*spec.locations(), *spec.environment.values()]
        return any(uri.startswith("s3://") for uri in opened)


def processing_spec(job: Job, *, stop_grace_s: float) -> ProcessingSpec:
    """The runner's view of a CreateProcessingJob request."""
    request = job.request
    outputs = (request.get("ProcessingOutputConfig") or {}).get("Outputs") or []
    return ProcessingSpec(
        name=job.name,
        arn=job.arn,
        command=command(request),
        started_at=job.created.timestamp(),
        environment={str(k): str(v) for k, v in (request.get("Environment") or {}).items()},
        inputs=tuple(
            _input(item, run=job.job_type is not None)
            for item in request.get("ProcessingInputs") or []
        ),
        outputs=tuple(
            Output(
                name=item["OutputName"],
                uri=item["S3Output"]["S3Uri"],
                local_path=item["S3Output"]["LocalPath"],
            )
            for item in outputs
        ),
        config=_jsonable(request),
        max_runtime_s=(request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds"),
        stop_grace_s=stop_grace_s,
    )


def _input(item: dict[str, Any], *, run: bool) -> Input:
    """An input; ``run``: of a monitoring run (its capture input may be empty)."""
    s3 = item["S3Input"]
    return Input(
        name=item["InputName"],
        uri=s3["S3Uri"],
        local_path=s3["LocalPath"],
        data_type=s3.get("S3DataType", "S3Prefix"),
        missing_ok=run and item["InputName"] == CAPTURE_INPUT,
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
