"""MonitoringService: Model Monitor's data quality job definitions and monitoring
schedules, as the control plane asks for them.

A schedule names a job definition (``MonitoringJobDefinitionName``, type
``DataQuality``) or carries one inline (``MonitoringJobDefinition``); either way it is
read into one :class:`Plan`, which the runs (runs.py) turn into processing jobs. A
schedule is refused at Create, with ValidationException naming the field, when its
cron is not one Model Monitor takes (cron.py), its endpoint does not exist or captures
no data, its definition or baselining job is unknown, or ``auth:`` would refuse what
it runs or where it writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from shipyard.capture.config import CaptureConfig, capture_of
from shipyard.control.endpoints import EndpointService
from shipyard.errors import (
    InvalidParameter,
    MonitoringNotFound,
    ResourceInUse,
    ShipyardError,
)
from shipyard.host_access import HostAccess
from shipyard.job_contract import open_beneath
from shipyard.monitoring import cron
from shipyard.processing.service import (
    ProcessingService,
    callers_image,
    callers_variables,
)
from shipyard.processing.spec import below_opt_ml
from shipyard.records import JobStatus
from shipyard.storage.artifacts import join_uri
from shipyard.storage.metadata import now
from shipyard.storage.monitoring import Definition, Execution, MonitoringStore, Schedule

DATA_QUALITY = "DataQuality"
DEFAULT_INPUT_PATH = "/opt/ml/processing/input/endpoint"
DEFAULT_OUTPUT_PATH = "/opt/ml/processing/output"

PENDING, SCHEDULED, STOPPED, FAILED = "Pending", "Scheduled", "Stopped", "Failed"


@dataclass(frozen=True, slots=True)
class Plan:
    """What each run of a schedule does, from its definition or its inline one."""

    endpoint: str
    input_path: str
    app: dict[str, Any]
    environment: dict[str, str]
    outputs: list[dict[str, Any]]
    resources: dict[str, Any]
    statistics_uri: str | None
    constraints_uri: str | None
    role: str
    stopping: dict[str, Any] | None = None
    definition: str | None = None
    network: dict[str, Any] = field(default_factory=dict)
    baselining_job: str | None = None
    """BaseliningJobName, when no StatisticsResource and ConstraintsResource are named:
    its output's files are the baseline (MonitoringService.plan reads them)."""


@dataclass(frozen=True, slots=True)
class RunView:
    """One execution for the console, with its violations when its report is here."""

    execution: Execution
    violations: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule's console page: the schedule and its runs, newest first."""

    schedule: Schedule
    endpoint: str
    runs: list[RunView]


SHOWN_RUNS = 20
"""How many of a schedule's runs its console page shows."""


class MonitoringService:
    """Job definitions and schedules: recorded here, run by MonitorRuns."""

    def __init__(
        self,
        *,
        store: MonitoringStore,
        processing: ProcessingService,
        endpoints: EndpointService,
        region: str,
        account_id: str,
        wake: Callable[[], None],
        host_access: HostAccess | None = None,
    ) -> None:
        self.store = store
        self.processing = processing
        self.endpoints = endpoints
        self.region = region
        self.account_id = account_id
        self._wake = wake
        self.host_access = host_access or HostAccess()

    def __repr__(self) -> str:
        return f"MonitoringService(store={self.store!r})"

    def _arn(self, kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:{kind}/{name.lower()}"

    # -- definitions ----------------------------------------------------------------------

    def create_definition(self, request: dict[str, Any]) -> Definition:
        name = request["JobDefinitionName"]
        if "EndpointInput" not in (request.get("DataQualityJobInput") or {}):
            raise InvalidParameter(
                "DataQualityJobInput.EndpointInput is required: this gateway monitors "
                "endpoints' captured data (BatchTransformInput is not supported)."
            )
        plan = self._resolved(_plan_of_definition(request, name))
        self._check(plan, "")
        definition = Definition(
            name, self._arn("data-quality-job-definition", name), request, now()
        )
        self.store.add_definition(definition)
        return definition

    def describe_definition(self, name: str) -> Definition:
        found = self.store.definition(name)
        if found is None:
            raise MonitoringNotFound(f"Could not find job definition {name}.")
        return found

    def list_definitions(self) -> list[Definition]:
        return self.store.definitions()

    def delete_definition(self, name: str) -> None:
        self.describe_definition(name)
        users = [s.name for s in self.store.schedules() if _definition_name(s.request) == name]
        if users:
            raise ResourceInUse(
                f"Job definition {name} is used by the monitoring schedule {users[0]}; delete "
                "the schedule first."
            )
        self.store.delete_definition(name)

    # -- schedules ------------------------------------------------------------------------

    def create_schedule(self, request: dict[str, Any]) -> Schedule:
        name = request["MonitoringScheduleName"]
        cadence, _ = self._checked(request)
        created = now()
        schedule = Schedule(
            name=name,
            arn=self._arn("monitoring-schedule", name),
            request=request,
            status=PENDING,
            created=created,
            modified=created,
            next_tick=cadence.next_tick(created),
        )
        self.store.add_schedule(schedule)
        self._wake()
        return schedule

    def update_schedule(self, request: dict[str, Any]) -> Schedule:
        name = request["MonitoringScheduleName"]
        current = self.describe_schedule(name)
        updated = {
            **current.request,
            "MonitoringScheduleConfig": request["MonitoringScheduleConfig"],
        }
        cadence, _ = self._checked(updated)
        tick = None if cadence.once and self._has_run(name) else cadence.next_tick(now())
        changed = self.store.change_schedule(name, request=updated, next_tick=tick)
        if changed is None:
            raise MonitoringNotFound(f"Could not find monitoring schedule {name}.")
        self._wake()
        return changed

    def describe_schedule(self, name: str) -> Schedule:
        found = self.store.schedule(name)
        if found is None:
            raise MonitoringNotFound(f"Could not find monitoring schedule {name}.")
        return found

    def list_schedules(self) -> list[Schedule]:
        return self.store.schedules()

    def delete_schedule(self, name: str) -> None:
        """Gone at once: no run of it starts afterwards (runs already started end)."""
        if not self.store.delete_schedule(name):
            raise MonitoringNotFound(f"Could not find monitoring schedule {name}.")

    def stop_schedule(self, name: str) -> None:
        self.describe_schedule(name)
        self.store.change_schedule(name, status=STOPPED)

    def start_schedule(self, name: str) -> None:
        schedule = self.describe_schedule(name)
        cadence = cron.parse(_config(schedule.request).get("ScheduleConfig") or {})
        tick = schedule.next_tick
        if not cadence.once:
            tick = cadence.next_tick(now())
        self.store.change_schedule(name, status=SCHEDULED, next_tick=tick)
        self._wake()

    def executions(self) -> list[Execution]:
        return self.store.executions()

    def last_execution(self, name: str) -> Execution | None:
        runs = [e for e in self.store.executions() if e.schedule == name]
        return max(runs, key=lambda e: e.scheduled, default=None)

    def schedule_view(self, name: str) -> ScheduleView:
        """The schedule ``name`` and its newest runs, each with the violations its
        analyzer left in the job's folder (read through no link: the job wrote it)."""
        schedule = self.describe_schedule(name)
        runs = sorted(
            (e for e in self.store.executions() if e.schedule == name),
            key=lambda e: e.scheduled,
            reverse=True,
        )[:SHOWN_RUNS]
        try:
            endpoint = self.plan(schedule.request).endpoint
        except ShipyardError:
            endpoint = ""
        return ScheduleView(schedule, endpoint, [RunView(e, self._violations(e)) for e in runs])

    def _violations(self, execution: Execution) -> list[dict[str, Any]] | None:
        if execution.status != "CompletedWithViolations":
            return [] if execution.status == "Completed" else None
        try:
            job = self.processing.describe(execution.job_name)
            output = job.request["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]
        except (ShipyardError, KeyError, IndexError):
            return None
        relative = below_opt_ml(str(output.get("LocalPath", "")))
        if relative is None:
            return None
        root = self.processing.jobs_dir / job.name / f"attempt-{job.attempt}" / "ml"
        try:
            with open_beneath(root, f"{relative.as_posix()}/constraint_violations.json") as f:
                found = json.loads(f.read(1 << 22))
        except (OSError, ValueError):
            return None
        violations = found.get("violations") if isinstance(found, dict) else None
        return (
            [v for v in violations if isinstance(v, dict)] if isinstance(violations, list) else None
        )

    def _has_run(self, name: str) -> bool:
        return self.last_execution(name) is not None

    # -- plans ----------------------------------------------------------------------------

    def plan(self, schedule_request: dict[str, Any]) -> Plan:
        """The runs' plan of a schedule (its definition read now); InvalidParameter
        when the definition is gone or says nothing runnable."""
        config = _config(schedule_request)
        name = config.get("MonitoringJobDefinitionName")
        if name:
            definition = self.store.definition(str(name))
            if definition is None:
                raise InvalidParameter(
                    f"MonitoringScheduleConfig.MonitoringJobDefinitionName: the job definition "
                    f"{name} does not exist."
                )
            return self._resolved(_plan_of_definition(definition.request, definition.name))
        inline = config.get("MonitoringJobDefinition")
        if not inline:
            raise InvalidParameter(
                "MonitoringScheduleConfig: MonitoringJobDefinitionName or "
                "MonitoringJobDefinition is required."
            )
        return self._resolved(_plan_of_inline(inline))

    def _resolved(self, plan: Plan) -> Plan:
        if plan.statistics_uri or plan.constraints_uri or not plan.baselining_job:
            return plan
        statistics, constraints = self.baseline_of_job(plan.baselining_job)
        return replace(plan, statistics_uri=statistics, constraints_uri=constraints)

    def capture(self, endpoint: str) -> CaptureConfig:
        """The endpoint's data capture; InvalidParameter when it has none."""
        try:
            found, _ = self.endpoints.describe_endpoint(endpoint)
            config = self.endpoints.describe_endpoint_config(found.config_name)
        except ShipyardError:
            raise InvalidParameter(f"Endpoint {endpoint} does not exist.") from None
        capture = capture_of(config)
        if capture is None or not capture.enabled:
            raise InvalidParameter(
                f"Endpoint {endpoint} does not capture data: its endpoint config needs a "
                "DataCaptureConfig with EnableCapture."
            )
        return capture

    def _checked(self, request: dict[str, Any]) -> tuple[cron.Cadence, Plan]:
        config = _config(request)
        monitoring_type = config.get("MonitoringType", DATA_QUALITY)
        if monitoring_type != DATA_QUALITY:
            raise InvalidParameter(
                f"MonitoringScheduleConfig.MonitoringType: {monitoring_type} is not supported; "
                "this gateway runs DataQuality monitoring."
            )
        cadence = cron.parse(config.get("ScheduleConfig") or {})
        plan = self.plan(request)
        self.capture(plan.endpoint)
        self._check(plan, "MonitoringScheduleConfig.MonitoringJobDefinition.")
        return cadence, plan

    def _check(self, plan: Plan, prefix: str) -> None:
        """Refuse a baseline that cannot be found and what ``auth:`` would refuse."""
        access = self.host_access
        image = str(plan.app.get("ImageUri", ""))
        access.check_process(
            image=callers_image(image),
            entrypoint=plan.app.get("ContainerEntrypoint"),
            environment=callers_variables(image, plan.environment),
            image_field=f"{prefix}ImageUri",
        )
        for n, output in enumerate(plan.outputs, start=1):
            uri = (output.get("S3Output") or {}).get("S3Uri")
            access.check_location(uri, f"{prefix}MonitoringOutputs.{n}.S3Output.S3Uri")
        access.check_location(plan.statistics_uri, f"{prefix}StatisticsResource.S3Uri")
        access.check_location(plan.constraints_uri, f"{prefix}ConstraintsResource.S3Uri")

    def baseline_of_job(self, job_name: str) -> tuple[str, str]:
        """The statistics and constraints a baselining job wrote; InvalidParameter when
        there is no such job."""
        try:
            job = self.processing.describe(job_name)
        except ShipyardError:
            raise InvalidParameter(
                f"BaselineConfig.BaseliningJobName: no processing job {job_name}."
            ) from None
        outputs = (job.request.get("ProcessingOutputConfig") or {}).get("Outputs") or []
        if not outputs or job.status != JobStatus.COMPLETED:
            raise InvalidParameter(
                f"BaselineConfig.BaseliningJobName: the job {job_name} has not completed "
                "with an output."
            )
        folder = outputs[0]["S3Output"]["S3Uri"]
        return join_uri(folder, "statistics.json"), join_uri(folder, "constraints.json")


def _config(request: dict[str, Any]) -> dict[str, Any]:
    return dict(request.get("MonitoringScheduleConfig") or {})


def _definition_name(request: dict[str, Any]) -> str | None:
    name = _config(request).get("MonitoringJobDefinitionName")
    return str(name) if name else None


def _baseline(config: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    statistics = (config.get("StatisticsResource") or {}).get("S3Uri")
    constraints = (config.get("ConstraintsResource") or {}).get("S3Uri")
    return statistics, constraints, config.get("BaseliningJobName")


def _plan_of_definition(request: dict[str, Any], name: str) -> Plan:
    app = dict(request.get("DataQualityAppSpecification") or {})
    endpoint_input = (request.get("DataQualityJobInput") or {}).get("EndpointInput") or {}
    statistics, constraints, job = _baseline(request.get("DataQualityBaselineConfig") or {})
    outputs = (request.get("DataQualityJobOutputConfig") or {}).get("MonitoringOutputs") or []
    return Plan(
        endpoint=str(endpoint_input.get("EndpointName", "")),
        input_path=str(endpoint_input.get("LocalPath") or DEFAULT_INPUT_PATH),
        app=app,
        environment={str(k): str(v) for k, v in (app.get("Environment") or {}).items()},
        outputs=list(outputs),
        resources=dict(request.get("JobResources") or {}),
        statistics_uri=statistics,
        constraints_uri=constraints,
        role=str(request.get("RoleArn", "")),
        stopping=request.get("StoppingCondition"),
        definition=name,
        network=dict(request.get("NetworkConfig") or {}),
        baselining_job=job,
    )


def _plan_of_inline(inline: dict[str, Any]) -> Plan:
    inputs = inline.get("MonitoringInputs") or []
    endpoint_input = (inputs[0] if inputs else {}).get("EndpointInput") or {}
    if not endpoint_input:
        raise InvalidParameter(
            "MonitoringScheduleConfig.MonitoringJobDefinition.MonitoringInputs: an "
            "EndpointInput is required."
        )
    statistics, constraints, job = _baseline(inline.get("BaselineConfig") or {})
    outputs = (inline.get("MonitoringOutputConfig") or {}).get("MonitoringOutputs") or []
    return Plan(
        endpoint=str(endpoint_input.get("EndpointName", "")),
        input_path=str(endpoint_input.get("LocalPath") or DEFAULT_INPUT_PATH),
        app=dict(inline.get("MonitoringAppSpecification") or {}),
        environment={str(k): str(v) for k, v in (inline.get("Environment") or {}).items()},
        outputs=list(outputs),
        resources=dict(inline.get("MonitoringResources") or {}),
        statistics_uri=statistics,
        constraints_uri=constraints,
        role=str(inline.get("RoleArn", "")),
        stopping=inline.get("StoppingCondition"),
        network=dict(inline.get("NetworkConfig") or {}),
        baselining_job=job,
    )
