"""TransformService: CreateTransformJob and its family, desired state only.

It checks what botocore's model cannot (the model exists and can serve a batch: not
MultiModel, not Direct, as a transform names neither a target model nor container; filters
are in SageMaker's JSONPath subset, locations are allowed), records the job with its
event, and wakes the TransformSupervisor, which runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shipyard.errors import InvalidParameter, ResourceLimitExceeded, ResourceNotFound
from shipyard.events.kinds import Announcer
from shipyard.host_access import HostAccess
from shipyard.records import ExecutionMode, JobStatus, TransformJob
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.tags import Tagging
from shipyard.storage.transform_jobs import TransformStore
from shipyard.transform.jsonpath import compile_filter

DEFAULT_MAX_PAYLOAD_MB = 6
DEFAULT_CONCURRENCY = 1
MAX_PAYLOADS_MB = 100
"""SageMaker's bound on MaxPayloadInMB, and on MaxConcurrentTransforms x MaxPayloadInMB:
the payloads in flight to one instance, which the gateway holds."""


Budget = Callable[[Sequence[tuple[str, int]]], None]
"""Refuses (InstanceType, count) pairs past the gateway's instance quota."""


class TransformService:
    """Batch transform jobs: create, describe, list, stop."""

    def __init__(
        self,
        *,
        store: TransformStore,
        models: MetadataStore,
        announcer: Announcer[TransformJob],
        wake: Callable[[], None],
        region: str,
        account_id: str,
        max_instances: int,
        budget: Budget | None = None,
        host_access: HostAccess | None = None,
        tagging: Tagging | None = None,
    ) -> None:
        self.store = store
        self.models = models
        self.announcer = announcer
        self._wake = wake
        self.region = region
        self.account_id = account_id
        self.max_instances = max_instances
        self.budget = budget
        """Refuses (ResourceLimitExceeded) instances past the gateway's quota, which
        endpoints and transform jobs share (EndpointService.check_budget)."""
        self.host_access = host_access or HostAccess()
        self.tagging = tagging
        if tagging is not None:
            tagging.track("transform-job", self.list_jobs)

    def __repr__(self) -> str:
        return f"TransformService({self.store!r})"

    def arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:transform-job/{name.lower()}"

    def create(self, request: dict[str, Any]) -> TransformJob:
        request = {k: v for k, v in request.items() if k != "Tags"}
        self._check(request)
        stamp = now()
        job = TransformJob(
            name=request["TransformJobName"],
            arn=self.arn(request["TransformJobName"]),
            status=JobStatus.IN_PROGRESS,
            request=request,
            created=stamp,
            modified=stamp,
        )
        self.store.create(job, event_for=self.announcer)
        self._wake()
        return job

    def describe(self, name: str) -> TransformJob:
        return self.store.get(name)

    def list_jobs(self) -> list[TransformJob]:
        return self.store.list()

    def stop(self, name: str) -> TransformJob:
        """InProgress -> Stopping; the supervisor stops it. Stopping or Stopped: no-op."""
        current = self.store.get(name)
        if current.status in (JobStatus.STOPPING, JobStatus.STOPPED):
            return current
        job = self.store.change(
            name,
            expect=[JobStatus.IN_PROGRESS],
            status=JobStatus.STOPPING,
            event_for=self.announcer,
        )
        self._wake()
        return job

    # -- checks -----------------------------------------------------------------------

    def _check_instances(self, resources: dict[str, Any]) -> None:
        """The job's instances within the quotas: its own, and the gateway's (shared with
        endpoints); ResourceLimitExceeded past either."""
        count = int(resources["InstanceCount"])
        if count > self.max_instances:
            raise ResourceLimitExceeded(
                f"TransformResources.InstanceCount {count} is more than the limit of "
                f"{self.max_instances} instances per job."
            )
        if self.budget is not None:
            self.budget([(str(resources.get("InstanceType", "")), count)])

    def _check(self, request: dict[str, Any]) -> None:
        name = request["ModelName"]
        try:
            model = self.models.get_model(name, kept=False)
        except ResourceNotFound:
            arn = f"arn:aws:sagemaker:{self.region}:{self.account_id}:model/{name.lower()}"
            raise InvalidParameter(f'Could not find model "{arn}".') from None
        if model.multi_model:
            raise InvalidParameter(
                f"Model {name} is a MultiModel model; a transform job needs a model that "
                "answers every request itself."
            )
        if model.execution_mode is ExecutionMode.DIRECT:
            # A transform sends no TargetContainerHostname, so every record would fail.
            raise InvalidParameter(
                f"Model {name} invokes its containers directly (InferenceExecutionConfig.Mode "
                "Direct); a transform job names no target container, so it needs a model "
                "that answers every request itself, such as a Serial inference pipeline."
            )
        source = request["TransformInput"]["DataSource"]["S3DataSource"]
        if source["S3DataType"] not in ("S3Prefix", "ManifestFile"):
            raise InvalidParameter(
                f"S3DataType {source['S3DataType']} is not supported; use S3Prefix or ManifestFile."
            )
        for field, uri in (
            ("TransformInput.DataSource.S3DataSource.S3Uri", source["S3Uri"]),
            ("TransformOutput.S3OutputPath", request["TransformOutput"]["S3OutputPath"]),
        ):
            if not uri.startswith(("s3://", "file:///", "/")):
                raise InvalidParameter(
                    f"{field}: {uri!r} is not an s3:// or file:// URI or an absolute path."
                )
            self.host_access.check_location(uri, field)
        # The model's instances start with this Environment added to the model's own.
        self.host_access.check_process(environment=request.get("Environment"), chooses_code=False)
        self._check_instances(request["TransformResources"])
        payload = request.get("MaxPayloadInMB")
        if payload is not None and int(payload) > MAX_PAYLOADS_MB:
            raise InvalidParameter(
                f"MaxPayloadInMB {payload} is more than the maximum of {MAX_PAYLOADS_MB}."
            )
        concurrency = int(request.get("MaxConcurrentTransforms") or 0)
        if payload is not None and concurrency * int(payload) > MAX_PAYLOADS_MB:
            raise InvalidParameter(
                f"MaxConcurrentTransforms {concurrency} x MaxPayloadInMB {payload} is more than "
                f"the maximum of {MAX_PAYLOADS_MB} MB."
            )
        processing = request.get("DataProcessing") or {}
        formats = {
            "InputFilter": request["TransformInput"].get("ContentType"),
            "OutputFilter": request["TransformOutput"].get("Accept"),
        }
        for field, content_type in formats.items():
            expression = processing.get(field)
            if expression is not None:
                try:
                    compile_filter(expression, content_type=content_type)
                except ValueError as exc:
                    raise InvalidParameter(f"DataProcessing.{field}: {exc}") from None
