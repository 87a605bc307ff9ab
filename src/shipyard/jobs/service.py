"""JobService: both doors (CreateTrainingJob and ``POST /inference``) land here.

It validates a job, records it as desired state (InProgress, Starting) within the
concurrency ``limit``, and wakes the supervisor, which starts and watches the process.
It never sees HTTP and never starts a process itself.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shipyard.backends.base import runtime_for
from shipyard.errors import (
    InvalidParameter,
    JobLimitReached,
    JobTypeNotAllowed,
    ResourceInUse,
    ResourceLimitExceeded,
    ShipyardError,
)
from shipyard.events.kinds import Announcer
from shipyard.host_access import HostAccess
from shipyard.records import Job, JobStatus, StatusTransition
from shipyard.stackfile import JobsConfig
from shipyard.storage.jobs import JobStore
from shipyard.storage.metadata import now
from shipyard.storage.tags import Tagging

_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9-]+")


class JobService:
    """Long-running jobs: create within the limit, describe, list, stop, read logs."""

    def __init__(
        self,
        *,
        store: JobStore,
        config: JobsConfig,
        announcer: Announcer[Job],
        wake: Callable[[], None],
        jobs_dir: Path,
        region: str,
        account_id: str,
        host_access: HostAccess | None = None,
        tagging: Tagging | None = None,
    ) -> None:
        self.store = store
        self.host_access = host_access or HostAccess()
        self.tagging = tagging
        """Where the Tags of CreateTrainingJob go; None: they are dropped."""
        if tagging is not None:
            tagging.track("training-job", store.list)
        self.config = config
        self.validate: Callable[[dict[str, Any]], None] | None = None
        """Holds a CreateTrainingJob request to botocore's shapes (the control door's
        validator, set where it is built); None: not checked."""
        self.live_templates = False
        """Whether ``config`` was put through ``PUT /stack`` rather than read from the
        stack file at start: its jobs are then checked as any caller's (check_templates)."""
        self.announcer = announcer
        self._wake = wake
        self.jobs_dir = jobs_dir
        self.region = region
        self.account_id = account_id

    def __repr__(self) -> str:
        return f"JobService(limit={self.config.limit}, store={self.store!r})"

    @property
    def limit(self) -> int:
        return self.config.limit

    def create(self, request: dict[str, Any], *, job_type: str | None = None) -> tuple[Job, int]:
        """Record a new job and wake the supervisor; return it with the slots left.

        Raises ResourceLimitExceeded when ``limit`` jobs are active, ResourceInUse when
        the name is taken, InvalidParameter for a job this gateway cannot run.
        """
        _check_runnable(request)
        if job_type is None or self.live_templates:
            # Templates from the stack file the gateway started with are the operator's
            # own; those put through PUT /stack are checked as any caller's request.
            self.check_host_access(request)
        name = request["TrainingJobName"]
        created = now()
        job = Job(
            name=name,
            arn=f"arn:aws:sagemaker:{self.region}:{self.account_id}:training-job/{name.lower()}",
            status=JobStatus.IN_PROGRESS,
            secondary_status="Starting",
            request=request,
            created=created,
            modified=created,
            job_type=job_type,
            transitions=(
                StatusTransition("Starting", created, None, "Launching requested ML instances"),
            ),
        )
        remaining = self.store.create(job, limit=self.limit, event_for=self.announcer)
        self._wake()
        return job, remaining

    def check_host_access(self, request: dict[str, Any]) -> None:
        """Refuse commands, variables and local locations the auth: section does not
        allow (InvalidParameter naming the field)."""
        access = self.host_access
        algorithm = request.get("AlgorithmSpecification") or {}
        access.check_process(
            image=str(algorithm.get("TrainingImage", "")),
            entrypoint=algorithm.get("ContainerEntrypoint"),
            environment=request.get("Environment"),
            image_field="AlgorithmSpecification.TrainingImage",
            entrypoint_field="AlgorithmSpecification.ContainerEntrypoint",
        )
        for n, channel in enumerate(request.get("InputDataConfig") or [], start=1):
            source = (channel.get("DataSource") or {}).get("S3DataSource") or {}
            access.check_location(source.get("S3Uri"), f"InputDataConfig.{n}.S3Uri")
        # Read as the supervisor reads it for the runner (JSON-decoded, as the SDK sends it).
        access.check_location(
            hyperparameter(request, "sagemaker_submit_directory"),
            "HyperParameters.sagemaker_submit_directory",
        )
        access.check_location(
            (request.get("OutputDataConfig") or {}).get("S3OutputPath"),
            "OutputDataConfig.S3OutputPath",
        )
        access.check_location(
            (request.get("CheckpointConfig") or {}).get("S3Uri"), "CheckpointConfig.S3Uri"
        )

    def submit(self, job_type: str) -> tuple[Job, int]:
        """The facade's one call: a job of ``job_type`` from its template.

        Raises JobTypeNotAllowed outside the white list and JobLimitReached at the limit;
        neither takes a slot.
        """
        if job_type not in self.config.white_list:
            raise JobTypeNotAllowed(f"The type [{job_type}] is not in the white list.")
        for _ in range(3):
            request = _from_template(self.config, job_type)
            try:
                return self.create(request, job_type=job_type)
            except ResourceLimitExceeded as exc:
                raise JobLimitReached(self.limit) from exc
            except ResourceInUse:
                continue  # two submissions in the same microsecond: take a new name
        raise JobLimitReached(self.limit)

    def describe(self, name: str) -> Job:
        return self.store.get(name)

    def list_jobs(self) -> list[Job]:
        return self.store.list()

    def stop(self, name: str) -> Job:
        """Ask the job to stop: Stopping now, Stopped once its process has ended."""
        job = self.store.change(
            name,
            expect=(JobStatus.IN_PROGRESS,),
            status=JobStatus.STOPPING,
            secondary=StatusTransition("Stopping", now(), None, "Stopping the training job"),
            event_for=self.announcer,
        )
        self._wake()
        return job

    def log_files(self, name: str) -> list[Path]:
        """The job's log files, one per attempt, oldest first (the job must exist)."""
        job = self.store.get(name)
        return [
            self.jobs_dir / job.name / f"attempt-{n}" / "job.log" for n in range(1, job.attempt + 1)
        ]

    def check_templates(self, config: JobsConfig, *, host_access: bool = True) -> None:
        """Refuse ``config`` (a jobs section put through ``PUT /stack``, or read from the
        stack file at start) when a job of one of its templates would be refused by
        CreateTrainingJob: InvalidParameter naming the template and the field. Its
        requests are held to botocore's shapes (``validate``) and to what this gateway
        runs; with ``host_access``, to what the caller's call could open and start too
        (a file read at start is the operator's own)."""
        for job_type in config.templates:
            try:
                request = _from_template(config, job_type)
                if host_access:
                    self.check_host_access(request)
                else:  # the operator's own file: only the gateway's own variables refused
                    HostAccess().check_process(environment=request.get("Environment"))
                if job_type in config.white_list:  # what the facade makes jobs of
                    if self.validate is not None:
                        self.validate(request)
                    _check_runnable(request)
            except ShipyardError as exc:
                raise InvalidParameter(f"jobs.templates.{job_type}: {exc.message}") from None
            except (AttributeError, TypeError, KeyError, ValueError) as exc:
                raise InvalidParameter(
                    f"jobs.templates.{job_type}: not a CreateTrainingJob request ({exc!r})."
                ) from None


def _from_template(config: JobsConfig, job_type: str) -> dict[str, Any]:
    """The CreateTrainingJob request of a ``job_type`` job, from its template."""
    request = copy.deepcopy(config.templates[job_type])
    stamp = now().strftime("%Y%m%d-%H%M%S-%f")
    prefix = _NAME_UNSAFE.sub("-", job_type).strip("-")[: 62 - len(stamp)] or "job"
    request["TrainingJobName"] = f"{prefix}-{stamp}"
    request["RoleArn"] = config.role_arn
    output = request.setdefault("OutputDataConfig", {})
    output["S3OutputPath"] = config.s3_bucket
    request.setdefault("AlgorithmSpecification", {}).setdefault("TrainingInputMode", "File")
    request.setdefault("StoppingCondition", {})
    return request


def hyperparameter(request: dict[str, Any], key: str) -> str | None:
    """A hyperparameter's value; the SageMaker SDK JSON-encodes them (``'"infer.py"'``)."""
    value = request.get("HyperParameters", {}).get(key)
    if value is None:
        return None
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return str(value)
    return decoded if isinstance(decoded, str) else str(value)


def _check_runnable(request: dict[str, Any]) -> None:
    algorithm = request.get("AlgorithmSpecification") or {}
    image = algorithm.get("TrainingImage")
    if not image:
        raise InvalidParameter(
            "AlgorithmSpecification.TrainingImage is required: shipyard/python or a "
            "SageMaker framework image (script mode), cmd:<command>, or a training image."
        )
    if runtime_for(image) == "python" and not hyperparameter(request, "sagemaker_program"):
        raise InvalidParameter(
            "HyperParameters.sagemaker_program is required: it names the script to run."
        )
    if int((request.get("ResourceConfig") or {}).get("InstanceCount", 1)) > 1:
        raise InvalidParameter(
            "ResourceConfig.InstanceCount: this gateway runs 1 instance per job."
        )
    names = [c["ChannelName"] for c in request.get("InputDataConfig", [])]
    if len(set(names)) != len(names):
        raise InvalidParameter("InputDataConfig: channel names must be unique.")
    for channel in request.get("InputDataConfig", []):
        _check_channel(channel)


def _check_channel(channel: dict[str, Any]) -> None:
    name = channel["ChannelName"]
    source = channel["DataSource"].get("S3DataSource")
    if source is None:
        raise InvalidParameter(f"InputDataConfig.{name}: only S3DataSource channels are supported.")
    if source.get("S3DataType", "S3Prefix") != "S3Prefix":
        raise InvalidParameter(f"InputDataConfig.{name}: only S3DataType S3Prefix is supported.")
    if channel.get("InputMode", "File") == "Pipe":
        raise InvalidParameter(
            f"InputDataConfig.{name}: InputMode Pipe is not supported; use File."
        )
