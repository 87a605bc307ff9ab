"""MonitorRuns: starts each schedule's runs at their ticks and follows them to their end.

Each pass (every ``period_s``, or at once when woken):

- a ``Pending`` schedule becomes ``Scheduled``;
- a ``Scheduled`` schedule whose tick is due gets a run: an execution recorded with its
  tick moved on, in one transaction (storage/monitoring.py), then its processing job
  (the analyzer over the endpoint's captured records, processing/service.py). A cron
  tick not reached within MISSED_AFTER (the gateway was down) is skipped, not run
  late; a ``NOW`` schedule's one run is never skipped;
- an execution follows its processing job: ``InProgress`` while it runs, then
  ``Completed`` or ``CompletedWithViolations`` (the analyzer's message says which),
  ``Failed`` or ``Stopped``. The per-feature metrics of a run that publishes them are
  put in CloudWatch, at its ScheduledTime, before the execution ends.

Everything lives in the store, so a restarted gateway picks up where the last left off:
an execution whose job was never created gets it, and one whose job ran on gets its
end. Gateways sharing the store start runs only while they hold the one lease of the
kind MONITORING.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from shipyard.background import Wakeup
from shipyard.cloudwatch.service import CloudWatchService
from shipyard.errors import ResourceInUse, ShipyardError
from shipyard.job_contract import open_beneath
from shipyard.monitoring import cron
from shipyard.monitoring.messages import NO_DATA, WITH_VIOLATIONS
from shipyard.monitoring.service import (
    DEFAULT_OUTPUT_PATH,
    PENDING,
    SCHEDULED,
    MonitoringService,
    Plan,
)
from shipyard.processing.spec import CAPTURE_INPUT
from shipyard.records import Job, JobStatus
from shipyard.storage.artifacts import join_uri
from shipyard.storage.metadata import now
from shipyard.storage.monitoring import Execution, Schedule

log = logging.getLogger(__name__)

MISSED_AFTER = timedelta(seconds=60)
"""A cron tick not run within this is missed (the gateway was down): skipped."""
NAMESPACE = "aws/sagemaker/Endpoints/data-metrics"
BASELINE_STATS = "/opt/ml/processing/baseline/stats"
BASELINE_CONSTRAINTS = "/opt/ml/processing/baseline/constraints"
CAPTURE_FORMAT = json.dumps(
    {"sagemakerCaptureJson": {"captureIndexNames": ["endpointInput", "endpointOutput"]}}
)

Claim = Callable[[Collection[str]], Awaitable[set[str]]]


class MonitorRuns:
    """The loop that turns schedules into executions and executions into outcomes."""

    def __init__(
        self,
        *,
        service: MonitoringService,
        cloudwatch: CloudWatchService | None,
        period_s: float = 2.0,
        claim: Claim | None = None,
    ) -> None:
        self.service = service
        self.cloudwatch = cloudwatch
        self.period_s = period_s
        self.claim = claim
        self._wake = Wakeup()

    def __repr__(self) -> str:
        return f"MonitorRuns(period_s={self.period_s})"

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        self._wake.bind()
        while True:
            try:
                await self.step()
            except Exception:  # one bad pass must not end the runs
                log.exception("monitoring pass failed")
            await self._wake.wait(self.period_s)

    async def step(self) -> None:
        if self.claim is not None and not await self.claim(["all"]):
            return
        await asyncio.to_thread(self._step)

    def _step(self) -> None:
        store = self.service.store
        at = now()
        for schedule in store.schedules():
            if schedule.status == PENDING:
                schedule = store.change_schedule(schedule.name, status=SCHEDULED) or schedule
            if schedule.status == SCHEDULED and schedule.next_tick and schedule.next_tick <= at:
                try:
                    self._tick(schedule, at)
                except Exception:
                    log.exception("could not start a run of %s", schedule.name)
        for execution in store.executions(active_only=True):
            try:
                self._follow(execution)
            except Exception:
                log.exception("could not follow the run %s", execution.job_name)

    def _tick(self, schedule: Schedule, at: datetime) -> None:
        cadence = cron.parse(_schedule_config(schedule))
        scheduled = schedule.next_tick
        assert scheduled is not None
        next_tick = None if cadence.once else cadence.next_tick(max(at, scheduled))
        if not cadence.once and at - scheduled > MISSED_AFTER:
            log.info("monitoring schedule %s: the tick of %s was missed", schedule.name, scheduled)
            self.service.store.change_schedule(schedule.name, next_tick=next_tick)
            return
        start, end = cadence.window(scheduled)
        plan = self.service.plan(schedule.request)
        name = _job_name(schedule.name, scheduled)
        try:
            capture = self.service.capture(plan.endpoint)
            request = run_request(
                plan, schedule, scheduled, (start, end), name, capture.destination
            )
            failure = None
        except ShipyardError as exc:
            request, failure = {}, exc.message
        execution = Execution(
            job_name=name,
            schedule=schedule.name,
            scheduled=scheduled,
            status="Failed" if failure else "Pending",
            failure_reason=failure,
            window_start=start,
            window_end=end,
            created=at,
            modified=at,
            detail={
                "endpoint": plan.endpoint,
                "definition": plan.definition,
                "job_arn": self.service.processing.arn(name),
                "request": request,
                "schedule_arn": schedule.arn,
            },
        )
        if self.service.store.add_execution(execution, next_tick=next_tick) and not failure:
            self._create_job(execution)

    def _create_job(self, execution: Execution) -> None:
        with contextlib.suppress(ResourceInUse):  # created before a restart
            self.service.processing.create(
                execution.detail["request"],
                schedule_arn=execution.detail.get("schedule_arn"),
                checked=False,  # checked at the schedule's Create, built by us since
            )

    def _follow(self, execution: Execution) -> None:
        try:
            job = self.service.processing.describe(execution.job_name)
        except ShipyardError:
            self._create_job(execution)
            return
        store = self.service.store
        if job.active:
            if execution.status == "Pending":
                store.change_execution(execution.job_name, status="InProgress")
            return
        if job.status == JobStatus.COMPLETED:
            message = job.model_artifacts or ""
            status = (
                "CompletedWithViolations" if message.startswith(WITH_VIOLATIONS) else "Completed"
            )
            self._publish(execution, job)
            store.change_execution(execution.job_name, status=status)
        elif job.status == JobStatus.STOPPED:
            store.change_execution(execution.job_name, status="Stopped")
        else:
            reason = job.failure_reason or "The processing job failed."
            store.change_execution(
                execution.job_name,
                status="Failed",
                failure_reason=NO_DATA if NO_DATA in reason else reason,
            )

    def _publish(self, execution: Execution, job: Job) -> None:
        """The run's per-feature metrics, if its analyzer wrote them."""
        if self.cloudwatch is None:
            return
        workdir = self.service.processing.jobs_dir / job.name / f"attempt-{job.attempt}"
        try:
            with open_beneath(workdir / "ml", "output/metrics.json") as f:
                metrics = json.loads(f.read(1 << 22))
        except (OSError, ValueError):
            return
        dimensions = [
            {"Name": "Endpoint", "Value": execution.detail.get("endpoint", "")},
            {"Name": "MonitoringSchedule", "Value": execution.schedule},
        ]
        stamp = execution.scheduled.timestamp()
        data = []
        for prefix, key in (
            ("feature_baseline_drift_", "drift"),
            ("feature_non_null_", "non_null"),
            ("feature_data_", "data"),
        ):
            for feature, value in (metrics.get(key) or {}).items():
                data.append(
                    {
                        "MetricName": f"{prefix}{feature}",
                        "Dimensions": dimensions,
                        "Value": float(value),
                        "Timestamp": stamp,
                        "Unit": "None",
                    }
                )
        for start in range(0, len(data), 1000):
            self.cloudwatch.put_own_metric_data(NAMESPACE, data[start : start + 1000])


def run_request(
    plan: Plan,
    schedule: Schedule,
    scheduled: datetime,
    window: tuple[datetime, datetime],
    name: str,
    capture_destination: str,
) -> dict[str, Any]:
    """The CreateProcessingJob request of one run."""
    output = (plan.outputs[0] if plan.outputs else {}).get("S3Output") or {}
    local_output = str(output.get("LocalPath") or DEFAULT_OUTPUT_PATH)
    folder = join_uri(
        str(output.get("S3Uri", "")),
        plan.endpoint,
        schedule.name,
        scheduled.strftime("%Y/%m/%d/%H"),
    )
    environment = {
        **plan.environment,
        "dataset_format": CAPTURE_FORMAT,
        "dataset_source": plan.input_path,
        "output_path": local_output,
        "publish_cloudwatch_metrics": plan.environment.get("publish_cloudwatch_metrics", "Enabled"),
        "sagemaker_endpoint_name": plan.endpoint,
        "sagemaker_monitoring_schedule_name": schedule.name,
        "start_time": window[0].strftime("%Y-%m-%dT%H:%M:%SZ"),
        "end_time": window[1].strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    inputs = [
        _input(CAPTURE_INPUT, join_uri(capture_destination, plan.endpoint) + "/", plan.input_path)
    ]
    if plan.statistics_uri:
        inputs.append(_input("baseline", plan.statistics_uri, BASELINE_STATS))
        environment["baseline_statistics"] = f"{BASELINE_STATS}/{_file_name(plan.statistics_uri)}"
    if plan.constraints_uri:
        inputs.append(_input("constraints", plan.constraints_uri, BASELINE_CONSTRAINTS))
        environment["baseline_constraints"] = (
            f"{BASELINE_CONSTRAINTS}/{_file_name(plan.constraints_uri)}"
        )
    request: dict[str, Any] = {
        "ProcessingJobName": name,
        "ProcessingInputs": inputs,
        "ProcessingOutputConfig": {
            "Outputs": [
                {
                    "OutputName": "result",
                    "S3Output": {
                        "S3Uri": folder,
                        "LocalPath": local_output,
                        "S3UploadMode": str(output.get("S3UploadMode") or "EndOfJob"),
                    },
                }
            ]
        },
        "ProcessingResources": plan.resources
        or {
            "ClusterConfig": {
                "InstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "VolumeSizeInGB": 1,
            }
        },
        "AppSpecification": {
            k: v
            for k, v in plan.app.items()
            if k in ("ImageUri", "ContainerEntrypoint", "ContainerArguments")
        },
        "Environment": environment,
        "RoleArn": plan.role,
    }
    if plan.stopping:
        request["StoppingCondition"] = plan.stopping
    return request


def _input(name: str, uri: str, local_path: str) -> dict[str, Any]:
    return {
        "InputName": name,
        "S3Input": {
            "S3Uri": uri,
            "LocalPath": local_path,
            "S3DataType": "S3Prefix",
            "S3InputMode": "File",
            "S3DataDistributionType": "FullyReplicated",
        },
    }


def _file_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _schedule_config(schedule: Schedule) -> dict[str, Any]:
    config = schedule.request.get("MonitoringScheduleConfig") or {}
    return dict(config.get("ScheduleConfig") or {})


def _job_name(schedule: str, scheduled: datetime) -> str:
    """A run's processing job: named by its tick, unique per schedule and tick."""
    digest = hashlib.sha256(f"{schedule}@{scheduled.isoformat()}".encode()).hexdigest()[:12]
    return f"model-monitoring-{scheduled:%Y%m%d%H%M}-{digest}"
