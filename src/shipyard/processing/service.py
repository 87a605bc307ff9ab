"""ProcessingService: CreateProcessingJob and its family land here.

A request is checked (what this gateway runs, where its files may lie, what ``auth:``
allows), recorded as an InProgress job within the jobs' concurrency limit, and the
supervisor is woken; the supervisor and the runner do the rest (supervisor.py,
runner.py). It never sees HTTP and never starts a process itself.

What runs, decided here once (``command``):

- the built-in analyzer for the repository ``sagemaker-model-monitor-analyzer``
  (monitoring/analyzer.py), as the sagemaker SDK's monitors name it;
- a SageMaker framework image or ``shipyard/python``: ContainerEntrypoint (required)
  and ContainerArguments, a leading ``python3`` being the gateway's own Python;
- any other image is refused for now: container processing jobs are not run here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from shipyard.errors import InvalidParameter, ResourceNotFound
from shipyard.events.kinds import Announcer
from shipyard.host_access import HostAccess
from shipyard.images import BUILTIN_IMAGES, is_framework_image
from shipyard.processing.spec import PROCESSING_ROOT, below_opt_ml
from shipyard.records import Job, JobStatus, StatusTransition
from shipyard.storage.jobs import JobStore
from shipyard.storage.metadata import now

ANALYZER_REPOSITORY = "sagemaker-model-monitor-analyzer"
"""The image repository of Model Monitor's analyzer: run by the built-in one."""
ANALYZER_COMMAND = (sys.executable, "-m", "shipyard.monitoring.analyzer")
ANALYZER_VARIABLES = frozenset(
    {
        "analysis_type",
        "baseline_constraints",
        "baseline_statistics",
        "categorical_drift_method",
        "dataset_format",
        "dataset_source",
        "end_time",
        "output_path",
        "publish_cloudwatch_metrics",
        "sagemaker_endpoint_name",
        "sagemaker_monitoring_schedule_name",
        "start_time",
    }
)
"""The analyzer's settings (monitoring/analyzer.py): the built-in analyzer's own, so
``auth:`` takes them for it as SageMaker's variables are taken for a model."""
PYTHON_NAMES = ("python3", "python")
"""A leading entrypoint word that means "the built-in Python"."""


class ProcessingService:
    """Processing jobs: create within the limit, describe, list, stop, read logs."""

    def __init__(
        self,
        *,
        store: JobStore,
        announcer: Announcer[Job],
        wake: Callable[[], None],
        jobs_dir: Path,
        limit: int,
        region: str,
        account_id: str,
        host_access: HostAccess | None = None,
    ) -> None:
        self.store = store
        self.announcer = announcer
        self._wake = wake
        self.jobs_dir = jobs_dir
        self.limit = limit
        self.region = region
        self.account_id = account_id
        self.host_access = host_access or HostAccess()

    def __repr__(self) -> str:
        return f"ProcessingService(limit={self.limit}, store={self.store!r})"

    def arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:processing-job/{name.lower()}"

    def create(
        self, request: dict[str, Any], *, schedule_arn: str | None = None, checked: bool = True
    ) -> Job:
        """Record a new job and wake the supervisor.

        ``schedule_arn``: the monitoring schedule whose run it is. ``checked``: whether
        the caller's host access is held to ``auth:`` (a monitoring run's requests are
        built by the gateway from what was checked at their schedule's Create).

        Raises ResourceLimitExceeded at the limit, ResourceInUse when the name is
        taken, InvalidParameter naming the field for a job this gateway cannot run.
        """
        command(request)  # refuse what cannot run before it takes a slot
        check_paths(request)
        if checked:
            self.check_host_access(request)
        name = request["ProcessingJobName"]
        created = now()
        job = Job(
            name=name,
            arn=self.arn(name),
            status=JobStatus.IN_PROGRESS,
            secondary_status="Starting",
            request=request,
            created=created,
            modified=created,
            job_type=schedule_arn,
            transitions=(StatusTransition("Starting", created, None, "Starting the job"),),
        )
        self.store.create(job, limit=self.limit, event_for=self.announcer)
        self._wake()
        return job

    def check_host_access(self, request: dict[str, Any]) -> None:
        """Refuse commands, variables and local locations ``auth:`` does not allow."""
        app = request.get("AppSpecification") or {}
        entrypoint = app.get("ContainerEntrypoint")
        image = str(app.get("ImageUri", ""))
        self.host_access.check_process(
            image=callers_image(image),
            # [python3, a script of its inputs, ...] is the built-in Python running the
            # job's own code, as a framework model's script: no command of the host's.
            entrypoint=None if _runs_own_script(entrypoint) else entrypoint,
            environment=callers_variables(image, request.get("Environment")),
            image_field="AppSpecification.ImageUri",
            entrypoint_field="AppSpecification.ContainerEntrypoint",
        )
        for field, uri in _locations(request):
            self.host_access.check_location(uri, field)

    def describe(self, name: str) -> Job:
        try:
            return self.store.get(name)
        except ResourceNotFound:
            raise ResourceNotFound(f"Could not find requested job with name {name}") from None

    def list_jobs(self) -> list[Job]:
        return self.store.list()

    def stop(self, name: str) -> Job:
        """Stopping now, Stopped once the job's processes have ended."""
        self.describe(name)
        job = self.store.change(
            name,
            expect=(JobStatus.IN_PROGRESS,),
            status=JobStatus.STOPPING,
            secondary=StatusTransition("Stopping", now(), None, "Stopping the processing job"),
            event_for=self.announcer,
        )
        self._wake()
        return job

    def log_files(self, name: str) -> list[Path]:
        """The job's log file (the job must exist)."""
        job = self.describe(name)
        return [
            self.jobs_dir / job.name / f"attempt-{n}" / "job.log" for n in range(1, job.attempt + 1)
        ]


def command(request: dict[str, Any]) -> tuple[str, ...]:
    """What the job runs, in its ``/opt/ml`` view; InvalidParameter when nothing here can."""
    app = request.get("AppSpecification") or {}
    image = str(app.get("ImageUri", ""))
    entrypoint = list(app.get("ContainerEntrypoint") or [])
    arguments = list(app.get("ContainerArguments") or [])
    if _repository(image) == ANALYZER_REPOSITORY:
        return (*ANALYZER_COMMAND, *arguments)
    if image not in BUILTIN_IMAGES and not is_framework_image(image):
        raise InvalidParameter(
            f"AppSpecification.ImageUri: {image[:200]!r} is not an image this gateway runs "
            "processing jobs in: use a SageMaker framework image, shipyard/python or "
            f"{ANALYZER_REPOSITORY}."
        )
    if not entrypoint:
        raise InvalidParameter(
            "AppSpecification.ContainerEntrypoint is required for a framework image: "
            "it names what to run ([python3, /opt/ml/processing/input/code/script.py])."
        )
    if entrypoint[0] in PYTHON_NAMES:
        entrypoint[0] = sys.executable
    return (*entrypoint, *arguments)


def callers_image(image: str) -> str | None:
    """The image a caller runs, for ``auth:`` to judge: none for the analyzer, which is
    the gateway's own code (no container is pulled or run)."""
    return None if _repository(image) == ANALYZER_REPOSITORY else image


def callers_variables(image: str, environment: Any) -> Any:
    """``environment`` less the analyzer's own settings when ``image`` is the analyzer."""
    if _repository(image) != ANALYZER_REPOSITORY or not isinstance(environment, dict):
        return environment
    return {k: v for k, v in environment.items() if k not in ANALYZER_VARIABLES}


def check_paths(request: dict[str, Any]) -> None:
    """Refuse what this gateway does not fetch or upload, and LocalPaths outside
    ``/opt/ml/processing/`` or overlapping another: InvalidParameter naming the field."""
    resources = (request.get("ProcessingResources") or {}).get("ClusterConfig") or {}
    if int(resources.get("InstanceCount", 1)) > 1:
        raise InvalidParameter(
            "ProcessingResources.ClusterConfig.InstanceCount: this gateway runs 1 instance per job."
        )
    paths: list[tuple[str, PurePosixPath]] = []
    for n, item in enumerate(request.get("ProcessingInputs") or [], start=1):
        field = f"ProcessingInputs.{n}"
        paths.append((f"{field}.S3Input.LocalPath", _input_path(item, field)))
    outputs = (request.get("ProcessingOutputConfig") or {}).get("Outputs") or []
    for n, item in enumerate(outputs, start=1):
        field = f"ProcessingOutputConfig.Outputs.{n}"
        if "FeatureStoreOutput" in item:
            raise InvalidParameter(f"{field}.FeatureStoreOutput is not supported; use S3Output.")
        s3 = item.get("S3Output")
        if not s3:
            raise InvalidParameter(f"{field}.S3Output is required.")
        paths.append((f"{field}.S3Output.LocalPath", _local_path(s3, f"{field}.S3Output")))
    for i, (field, path) in enumerate(paths):
        for other_field, other in paths[:i]:
            if path.is_relative_to(other) or other.is_relative_to(path):
                raise InvalidParameter(f"{field}: {path} overlaps {other_field} ({other}).")


def _input_path(item: dict[str, Any], field: str) -> PurePosixPath:
    if "DatasetDefinition" in item:
        raise InvalidParameter(f"{field}.DatasetDefinition is not supported; use S3Input.")
    s3 = item.get("S3Input")
    if not s3:
        raise InvalidParameter(f"{field}.S3Input is required.")
    if s3.get("S3InputMode", "File") == "Pipe":
        raise InvalidParameter(f"{field}.S3Input.S3InputMode: Pipe is not supported; use File.")
    if s3.get("S3CompressionType", "None") == "Gzip":
        raise InvalidParameter(f"{field}.S3Input.S3CompressionType: Gzip is not supported.")
    return _local_path(s3, f"{field}.S3Input")


def _local_path(s3: dict[str, Any], field: str) -> PurePosixPath:
    local = str(s3.get("LocalPath", ""))
    relative = below_opt_ml(local)
    if relative is None:
        raise InvalidParameter(
            f"{field}.LocalPath: {local[:200]!r} must lie under {PROCESSING_ROOT}/."
        )
    return PurePosixPath("/opt/ml") / relative


def _locations(request: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for n, item in enumerate(request.get("ProcessingInputs") or [], start=1):
        found.append(
            (f"ProcessingInputs.{n}.S3Input.S3Uri", (item.get("S3Input") or {}).get("S3Uri"))
        )
    outputs = (request.get("ProcessingOutputConfig") or {}).get("Outputs") or []
    for n, item in enumerate(outputs, start=1):
        uri = (item.get("S3Output") or {}).get("S3Uri")
        found.append((f"ProcessingOutputConfig.Outputs.{n}.S3Output.S3Uri", uri))
    return [(field, str(uri)) for field, uri in found if uri]


def _runs_own_script(entrypoint: Any) -> bool:
    if not isinstance(entrypoint, list) or len(entrypoint) < 2:
        return False
    script = below_opt_ml(str(entrypoint[1]))
    return entrypoint[0] in PYTHON_NAMES and script is not None


def _repository(image: str) -> str:
    return image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
