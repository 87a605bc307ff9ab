"""JobSupervisor: converges every active job's process to the store, and back.

Desired state is the job row (InProgress, Stopping); actual state is the runner and the
status lines it reports, both reached through the backend's JobHandle. Each pass:

- a job with no runner gets one (or adopts the runner an interrupted pass started);
- new status lines become status changes, each with its event, in one transaction;
- a Stopping job's runner gets SIGTERM (it forwards it and kills after the grace time);
- a runner that is gone without a final line was lost (kill -9, reboot): the job is
  retried from its last checkpoint when RetryStrategy or managed spot allows, or failed
  with a reason that says so.

Runners outlive the gateway; a new gateway finds them again from the handle refs in the
store (or, for a start never recorded, from the attempt's folder), so a restart neither
stops a job nor loses its end. Gateways sharing the store watch only the jobs whose
lease they hold (leases.py): two would start a job twice and announce each of
its changes twice. When a holder dies, another takes its jobs over with their refs.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shipyard.backends.base import JOB_RUNNER, JobBackend, JobHandle
from shipyard.background import Wakeup
from shipyard.errors import BackendError
from shipyard.events.kinds import Announcer
from shipyard.job_contract import (
    JOB_FILE,
    Channel,
    Checkpoint,
    JobSpec,
    Resource,
    StatusLine,
)
from shipyard.jobs.service import hyperparameter
from shipyard.metrics import Metrics
from shipyard.records import ACTIVE_JOB_STATUSES, Job, JobStatus, StatusTransition
from shipyard.storage.jobs import JobStore
from shipyard.storage.metadata import now

log = logging.getLogger(__name__)

Claim = Callable[[Collection[str]], Awaitable[set[str]]]
"""Leases.claim (leases.py): the names of those this gateway holds now."""

_SPOT_RETRIES = 10
"""Managed spot without MaxWaitTimeInSeconds: how many times a lost job is taken again."""


class JobSupervisor:
    """Starts, watches and stops job runners so they match the store.

    Processing jobs are supervised alike (processing/supervisor.py): another ``runner``
    module, another ``prepare``."""

    runner = JOB_RUNNER
    """The module the backend runs for each attempt (``python -m``)."""
    counted = True
    """Whether its jobs are the training jobs the ``jobs`` metrics count."""

    def __init__(
        self,
        *,
        store: JobStore,
        backend: JobBackend,
        announcer: Announcer[Job],
        metrics: Metrics,
        jobs_dir: Path,
        s3_endpoint_url: str | None,
        stop_grace_s: float,
        poll_period_s: float,
        on_event: Callable[[], None],
        claim: Claim | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        """Takes the leases of the jobs named and says which this gateway holds, so it
        watches only those; None: every job (the store is its alone)."""
        self.backend = backend
        self.announcer = announcer
        self.metrics = metrics
        self.jobs_dir = jobs_dir
        self.s3_endpoint_url = s3_endpoint_url
        self.stop_grace_s = stop_grace_s
        self.poll_period_s = poll_period_s
        self._on_event = on_event
        self._wake = Wakeup()
        self._signalled: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"JobSupervisor(jobs_dir={str(self.jobs_dir)!r})"

    def wake(self) -> None:
        """Look at the jobs now (a job was created or asked to stop); safe from any thread."""
        self._wake.set()

    async def run(self) -> None:
        self._wake.bind()
        while True:
            try:
                await self.step()
            except Exception:  # one bad pass must not end supervision
                log.exception("job supervision pass failed")
            await self._wake.wait(self.poll_period_s)

    async def step(self) -> None:
        jobs = await asyncio.to_thread(self.store.list, active_only=True)
        if self.counted:
            for status in ACTIVE_JOB_STATUSES:
                self.metrics.jobs.labels(status.value).set(sum(j.status == status for j in jobs))
        if self.claim is not None:
            held = await self.claim([j.name for j in jobs])
            jobs = [j for j in jobs if j.name in held]
        for job in jobs:
            try:
                await self._converge(job)
            except Exception:
                log.exception("could not converge job %s", job.name)

    def workdir(self, job: Job) -> Path:
        return self.jobs_dir / job.name / f"attempt-{job.attempt}"

    async def _converge(self, job: Job) -> None:
        if job.runner is None:
            await self._launch(job)
            return
        handle = self.backend.attach_job(job.runner)
        alive = self.backend.job_running(handle)
        job = await self._apply_status(job, handle)
        if not job.active:
            return
        if job.status == JobStatus.STOPPING and (job.name, handle.ref) not in self._signalled:
            self.backend.signal_job(handle, signal.SIGTERM)
            self._signalled.add((job.name, handle.ref))
        if not alive:
            # The runner may have written its last line just before it ended.
            job = await self._apply_status(job, handle)
            if job.active:
                await asyncio.to_thread(self._lost, job, handle)

    async def _launch(self, job: Job) -> None:
        workdir = self.workdir(job)
        # A runner started by a pass that ended before it recorded the handle is adopted,
        # and so is one from before the store kept handles (migration 0005): the lines
        # already applied stay applied, or the job's transitions and events would repeat.
        # Adopted even when Stopping, so the runner is stopped rather than forgotten.
        handle = self.backend.find_job(workdir)
        applied = job.applied_lines
        if handle is None:
            if job.status == JobStatus.STOPPING:
                await asyncio.to_thread(self._finish_unstarted, job)
                return
            applied = 0
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            try:
                s3_access = self.prepare(job, workdir)
                handle = await self.backend.start_job(
                    workdir,
                    s3_endpoint_url=self.s3_endpoint_url,
                    s3_access=s3_access,
                    runner=self.runner,
                )
            except BackendError as exc:
                await asyncio.to_thread(self._fail, job, str(exc))
                return
        await asyncio.to_thread(
            self.store.change, job.name, runner=handle.ref, applied_lines=applied
        )

    async def _apply_status(self, job: Job, handle: JobHandle) -> Job:
        try:
            lines = await asyncio.to_thread(self.backend.job_status, handle, skip=job.applied_lines)
        except ValueError:
            log.exception("job %s: unreadable status", job.name)
            return job
        for offset, line in enumerate(lines, start=job.applied_lines + 1):
            job = await asyncio.to_thread(self._apply_line, job, line, offset)
        return job

    def _apply_line(self, job: Job, line: StatusLine, applied: int) -> Job:
        at = datetime.fromtimestamp(line.time, tz=UTC)
        changes: dict[str, Any] = {"applied_lines": applied}
        if job.started is None:
            changes["started"] = at
        end = None
        if line.final is not None:
            end = at
            changes.update(
                status=JobStatus(line.final.status),
                failure_reason=line.final.failure_reason,
                model_artifacts=line.final.model_artifacts,
                ended=at,
            )
        transition = StatusTransition(line.secondary, at, end, line.message)
        changed = self.store.change(
            job.name, secondary=transition, event_for=self.announcer, **changes
        )
        self._after_change(changed, job)
        return changed

    def _lost(self, job: Job, handle: JobHandle) -> None:
        self.backend.kill_job(handle)
        if job.status == JobStatus.STOPPING:
            self._finish_unstarted(job)  # asked to stop, and it has: nothing to retry
            return
        retry, why = _may_retry(job)
        if retry:
            log.warning("job %s lost its process; starting attempt %s", job.name, job.attempt + 1)
            message = f"The job's process was lost; restarting it (attempt {job.attempt + 1})"
            changed = self.store.change(
                job.name,
                attempt=job.attempt + 1,
                runner=None,
                applied_lines=0,
                secondary=StatusTransition("Restarting", now(), None, message),
                event_for=self.announcer,
            )
            self._after_change(changed, job)
            self.wake()
            return
        self._fail(job, f"The job's process ended without recording an outcome ({why}).")

    def _fail(self, job: Job, reason: str) -> None:
        at = now()
        changed = self.store.change(
            job.name,
            status=JobStatus.FAILED,
            failure_reason=reason[:1024],
            ended=at,
            secondary=StatusTransition("Failed", at, at, reason[:1024]),
            event_for=self.announcer,
        )
        self._after_change(changed, job)

    def _finish_unstarted(self, job: Job) -> None:
        at = now()
        changed = self.store.change(
            job.name,
            status=JobStatus.STOPPED,
            ended=at,
            secondary=StatusTransition("Stopped", at, at, f"{self.store.noun} stopped"),
            event_for=self.announcer,
        )
        self._after_change(changed, job)

    def _after_change(self, job: Job, previous: Job) -> None:
        if job.status != previous.status and not job.active:
            if self.counted:
                self.metrics.jobs_finished.labels(job.status.value).inc()
            self._signalled.discard((job.name, previous.runner or ""))
        self._on_event()

    def prepare(self, job: Job, workdir: Path) -> bool:
        """Write what the runner reads into ``workdir`` (``job.json``); return whether
        the job reads or writes S3, and so gets S3 credentials.

        Raises:
            BackendError: the job cannot be run as asked; the message says why."""
        spec = self._spec(job)
        (workdir / JOB_FILE).write_text(spec.to_json())
        # S3 credentials only for a job that reads or writes S3: its own locations, or an
        # s3:// its script is given (a hyperparameter, a variable); not for an s3://
        # elsewhere in its request (a tag).
        return any(uri.startswith("s3://") for uri in _opened(spec))

    def _spec(self, job: Job) -> JobSpec:
        request = job.request
        algorithm = request.get("AlgorithmSpecification") or {}
        checkpoint = request.get("CheckpointConfig")
        resource = request.get("ResourceConfig") or {}
        return JobSpec(
            name=job.name,
            arn=job.arn,
            image=algorithm["TrainingImage"],
            program=hyperparameter(request, "sagemaker_program"),
            submit_directory=hyperparameter(request, "sagemaker_submit_directory"),
            hyperparameters=dict(request.get("HyperParameters") or {}),
            channels=tuple(_channel(c, algorithm) for c in request.get("InputDataConfig", [])),
            output_path=request["OutputDataConfig"]["S3OutputPath"],
            checkpoint=(
                Checkpoint(
                    uri=checkpoint["S3Uri"],
                    local_path=checkpoint.get("LocalPath", "/opt/ml/checkpoints"),
                )
                if checkpoint
                else None
            ),
            max_runtime_s=(request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds"),
            started_at=job.created.timestamp(),
            stop_grace_s=self.stop_grace_s,
            environment=dict(request.get("Environment") or {}),
            resource=Resource(
                instance_type=resource.get("InstanceType", "ml.m5.large"),
                instance_count=int(resource.get("InstanceCount", 1)),
                volume_size_gb=int(resource.get("VolumeSizeInGB", 1)),
            ),
            attempt=job.attempt,
            entrypoint=tuple(algorithm["ContainerEntrypoint"])
            if algorithm.get("ContainerEntrypoint")
            else None,
            arguments=tuple(algorithm["ContainerArguments"])
            if algorithm.get("ContainerArguments")
            else None,
            network_isolation=bool(request.get("EnableNetworkIsolation", False)),
        )


def _channel(channel: dict[str, Any], algorithm: dict[str, Any]) -> Channel:
    source = channel["DataSource"]["S3DataSource"]
    return Channel(
        name=channel["ChannelName"],
        uri=source["S3Uri"],
        data_type=source.get("S3DataType", "S3Prefix"),
        content_type=channel.get("ContentType"),
        input_mode=channel.get("InputMode") or algorithm.get("TrainingInputMode", "File"),
    )


def _may_retry(job: Job) -> tuple[bool, str]:
    request = job.request
    retries = int((request.get("RetryStrategy") or {}).get("MaximumRetryAttempts", 0))
    if request.get("EnableManagedSpotTraining"):
        max_wait = (request.get("StoppingCondition") or {}).get("MaxWaitTimeInSeconds")
        if max_wait is not None:
            if now() < job.created + timedelta(seconds=int(max_wait)):
                return True, ""
            return False, f"MaxWaitTimeInSeconds {max_wait} has passed"
        retries = max(retries, _SPOT_RETRIES)
    if retries == 0:
        return (
            False,
            "the job has no RetryStrategy and is not a managed spot job, so it is not retried",
        )
    if job.attempt > retries:
        return False, f"all {retries} retries of its RetryStrategy are used"
    return True, ""


def _opened(spec: JobSpec) -> list[str]:
    """What a job's runner and script may open: its locations, and the values of its
    hyperparameters and environment (a script reading S3 by itself names it there)."""
    given = [*spec.hyperparameters.values(), *spec.environment.values()]
    # The sagemaker SDK writes hyperparameters JSON-encoded: '"s3://bucket/data"'.
    return [*spec.locations(), *(value.strip('"') for value in given)]
