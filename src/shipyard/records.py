"""Typed records of the domain and their status enums.

Status enums keep AWS's values so they serialise without a mapping. Each enum that is a
state machine keeps its allowed transitions beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class EndpointStatus(StrEnum):
    CREATING = "Creating"
    UPDATING = "Updating"
    SYSTEM_UPDATING = "SystemUpdating"
    ROLLING_BACK = "RollingBack"
    UPDATE_ROLLBACK_FAILED = "UpdateRollbackFailed"
    IN_SERVICE = "InService"
    DELETING = "Deleting"
    FAILED = "Failed"


ENDPOINT_TRANSITIONS: dict[EndpointStatus, frozenset[EndpointStatus]] = {
    EndpointStatus.CREATING: frozenset(
        {EndpointStatus.IN_SERVICE, EndpointStatus.FAILED, EndpointStatus.DELETING}
    ),
    EndpointStatus.UPDATING: frozenset(
        {
            EndpointStatus.IN_SERVICE,
            EndpointStatus.FAILED,
            EndpointStatus.DELETING,
            EndpointStatus.ROLLING_BACK,
        }
    ),
    EndpointStatus.IN_SERVICE: frozenset(
        {EndpointStatus.UPDATING, EndpointStatus.DELETING, EndpointStatus.FAILED}
    ),
    EndpointStatus.FAILED: frozenset({EndpointStatus.DELETING, EndpointStatus.UPDATING}),
    EndpointStatus.DELETING: frozenset(),
    EndpointStatus.SYSTEM_UPDATING: frozenset({EndpointStatus.IN_SERVICE}),
    EndpointStatus.ROLLING_BACK: frozenset(
        {
            EndpointStatus.IN_SERVICE,
            EndpointStatus.DELETING,
            EndpointStatus.FAILED,
            EndpointStatus.UPDATE_ROLLBACK_FAILED,
        }
    ),
    EndpointStatus.UPDATE_ROLLBACK_FAILED: frozenset(
        {EndpointStatus.UPDATING, EndpointStatus.DELETING, EndpointStatus.IN_SERVICE}
    ),
}


class RoutingStrategy(StrEnum):
    RANDOM = "RANDOM"
    LEAST_OUTSTANDING_REQUESTS = "LEAST_OUTSTANDING_REQUESTS"


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    arn: str
    image: str
    model_data_url: str | None
    environment: dict[str, str]
    execution_role_arn: str | None
    created: datetime
    raw: dict[str, Any] = field(default_factory=dict)
    """The request as the user sent it, echoed by DescribeModel."""

    @property
    def container(self) -> dict[str, Any]:
        """The container that serves the model: PrimaryContainer, else the first of Containers."""
        primary = self.raw.get("PrimaryContainer")
        if isinstance(primary, dict):
            return primary
        containers = self.raw.get("Containers")
        first = containers[0] if isinstance(containers, list) and containers else None
        return first if isinstance(first, dict) else {}

    @property
    def containers(self) -> list[dict[str, Any]]:
        """Every container of the model, in order: Containers, else PrimaryContainer alone."""
        containers = self.raw.get("Containers")
        if isinstance(containers, list) and containers:
            return [c for c in containers if isinstance(c, dict)]
        return [self.container] if self.container else []

    @property
    def execution_mode(self) -> ExecutionMode:
        """InferenceExecutionConfig.Mode: how requests reach the containers (default Serial)."""
        config = self.raw.get("InferenceExecutionConfig") or {}
        return ExecutionMode(config.get("Mode") or ExecutionMode.SERIAL)

    @property
    def multi_container(self) -> bool:
        """Whether each instance is a group of container processes: an
        inference pipeline of two or more containers, or a Direct multi-container model."""
        if not isinstance(self.raw.get("Containers"), list):
            return False
        return len(self.containers) > 1 or self.execution_mode is ExecutionMode.DIRECT

    @property
    def multi_model(self) -> bool:
        """``Mode: MultiModel``: ModelDataUrl is a prefix and requests name a TargetModel."""
        return self.container.get("Mode") == ContainerMode.MULTI_MODEL

    @property
    def model_cache_enabled(self) -> bool:
        """MultiModelConfig.ModelCacheSetting, Enabled unless it says Disabled."""
        config = self.container.get("MultiModelConfig") or {}
        return config.get("ModelCacheSetting") != "Disabled"


class ContainerMode(StrEnum):
    """ContainerDefinition.Mode."""

    SINGLE_MODEL = "SingleModel"
    MULTI_MODEL = "MultiModel"


class ExecutionMode(StrEnum):
    """InferenceExecutionConfig.Mode of a multi-container model."""

    SERIAL = "Serial"
    """An inference pipeline: each container's answer is the next one's request."""
    DIRECT = "Direct"
    """Each request names the one container it is for (TargetContainerHostname)."""


@dataclass(frozen=True, slots=True)
class ServerlessConfig:
    """ProductionVariant.ServerlessConfig: a variant with instances only while it has work."""

    memory_mb: int
    """MemorySizeInMB: the most an instance may use; one over it is stopped."""
    max_concurrency: int
    """MaxConcurrency: requests in flight across the variant; past it, ThrottlingException."""
    provisioned_concurrency: int | None = None
    """ProvisionedConcurrency: requests the variant serves with no cold start (kept warm)."""

    def describe(self) -> dict[str, int]:
        """As SageMaker spells it (ProductionVariantServerlessConfig)."""
        out = {"MemorySizeInMB": self.memory_mb, "MaxConcurrency": self.max_concurrency}
        if self.provisioned_concurrency is not None:
            out["ProvisionedConcurrency"] = self.provisioned_concurrency
        return out


@dataclass(frozen=True, slots=True)
class VariantSpec:
    """One production variant of an endpoint config."""

    name: str
    model_name: str
    instance_type: str
    instance_count: int
    """0 for a serverless variant: it has instances only while it has work."""
    weight: float
    routing_strategy: RoutingStrategy
    serverless: ServerlessConfig | None = None
    shadow: bool = False
    """A ShadowProductionVariant: it gets copies of the production
    variant's requests, never a client's own, and its answers go only to /metrics."""
    managed_scaling: tuple[int, int] | None = None
    """ManagedInstanceScaling (ENABLED): the (MinInstanceCount, MaxInstanceCount) a
    variant of inference components grows and shrinks within as its copies need."""

    @property
    def hosts_components(self) -> bool:
        """A variant without a model: its instances host inference components."""
        return not self.model_name and self.serverless is None


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    name: str
    arn: str
    variants: tuple[VariantSpec, ...]
    created: datetime
    raw: dict[str, Any] = field(default_factory=dict)
    async_config: AsyncConfig | None = None
    """Set for asynchronous endpoints (AsyncInferenceConfig)."""

    @property
    def production_variants(self) -> tuple[VariantSpec, ...]:
        """The variants that take clients' requests (``variants`` holds shadows too)."""
        return tuple(v for v in self.variants if not v.shadow)

    @property
    def shadow_variants(self) -> tuple[VariantSpec, ...]:
        return tuple(v for v in self.variants if v.shadow)

    @property
    def hosts_components(self) -> bool:
        """An endpoint config for inference components: its variants name no model."""
        return any(v.hosts_components for v in self.variants)


class ComponentStatus(StrEnum):
    """InferenceComponentStatus."""

    CREATING = "Creating"
    UPDATING = "Updating"
    IN_SERVICE = "InService"
    DELETING = "Deleting"
    FAILED = "Failed"


SHORT_OF_CAPACITY = "Insufficient capacity"
"""How the FailureReason of an inference component whose copies fit nowhere begins: it
stays Updating, and its scaling policy may still take it back in."""


@dataclass(frozen=True, slots=True)
class ComputeRequirements:
    """InferenceComponentComputeResourceRequirements: what each copy reserves on an
    instance of its variant."""

    min_memory_mb: int
    cpus: float = 0.0
    """NumberOfCpuCoresRequired (0: not said; a copy then reserves no cores)."""
    max_memory_mb: int | None = None
    accelerators: float = 0.0

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"MinMemoryRequiredInMb": self.min_memory_mb}
        if self.cpus:
            out["NumberOfCpuCoresRequired"] = self.cpus
        if self.max_memory_mb is not None:
            out["MaxMemoryRequiredInMb"] = self.max_memory_mb
        if self.accelerators:
            out["NumberOfAcceleratorDevicesRequired"] = self.accelerators
        return out


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    """InferenceComponentSpecification: what each copy of a component runs."""

    model_name: str | None = None
    """ModelName: a model created with CreateModel; else ``image`` (Container)."""
    image: str | None = None
    artifact_url: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    requirements: ComputeRequirements | None = None
    """None only for an adapter (``base``), which runs in its base's copies."""
    base: str | None = None
    """BaseInferenceComponentName: the component whose copies load this adapter."""
    startup_timeout_s: int | None = None
    """StartupParameters.ContainerStartupHealthCheckTimeoutInSeconds."""


@dataclass(frozen=True, slots=True)
class InferenceComponent:
    name: str
    arn: str
    endpoint: str
    variant: str
    spec: ComponentSpec
    copies: int
    """RuntimeConfig.CopyCount: the copies wanted (DesiredCopyCount)."""
    status: ComponentStatus
    created: datetime
    modified: datetime
    failure_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    """The Specification as the client gave it, echoed by DescribeInferenceComponent."""
    generation: int = 0
    """Bumped when the specification changes: copies of an older one are replaced."""
    served: ServedSpec | None = None
    """The last specification whose copies came InService: what an update whose copies
    fail to start rolls back to."""


@dataclass(frozen=True, slots=True)
class ServedSpec:
    """A component's specification that served, as InferenceComponent holds it."""

    spec: ComponentSpec
    raw: dict[str, Any]
    generation: int


@dataclass(frozen=True, slots=True)
class VariantState:
    """What the user asked of one live variant (UpdateEndpointWeightsAndCapacities)."""

    name: str
    desired_weight: float
    desired_instance_count: int
    shadow: bool = False
    """A shadow variant (VariantSpec.shadow), described under ShadowProductionVariants."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    arn: str
    config_name: str
    status: EndpointStatus
    failure_reason: str | None
    created: datetime
    modified: datetime
    variants: tuple[VariantState, ...]
    pending_config_name: str | None = None
    """Set while a blue/green UpdateEndpoint converges to a new config."""
    generation: int = 0
    """Bumped on every change of desired state, so the reconciler notices it."""
    deployment: dict[str, Any] | None = None
    """While an update with a DeploymentConfig runs: ``{"config": DeploymentConfig as
    given, "started": epoch seconds, "share": the new fleet's share of traffic now,
    "stage": "ActivatingTraffic" | "Baking" | ...}`` (control/deployments.py)."""
    last_deployment: dict[str, Any] | None = None
    """The DeploymentConfig of the last update (or create) that gave one, as given:
    DescribeEndpoint's LastDeploymentConfig, and what RetainDeploymentConfig reuses."""
    retained: dict[str, dict[str, Any]] | None = None
    """While an UpdateEndpoint with RetainAllVariantProperties runs: per variant of the
    new config that the endpoint had, the properties it keeps (``weight``, ``count``)
    over the new config's; None otherwise."""


@dataclass(frozen=True, slots=True)
class Event:
    """One state change, recorded in the same transaction as the change itself (outbox).

    ``key`` is unique in the store: recording the same key twice keeps the first, which
    is what makes a notification exactly-once however often the change is seen.
    """

    key: str
    detail_type: str
    """EventBridge-style, e.g. ``SageMaker Training Job State Change``."""
    source: str
    resource: str
    """ARN of the resource that changed."""
    detail: dict[str, Any]
    topics: tuple[str, ...]
    """Where to announce it: topic names, SNS topic ARNs or apprise URLs; may be empty."""
    subject: str
    message: str
    time: datetime
    id: int | None = None


class JobStatus(StrEnum):
    """TrainingJobStatus, as SageMaker spells it."""

    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"


JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.IN_PROGRESS: frozenset(
        {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPING, JobStatus.STOPPED}
    ),
    JobStatus.STOPPING: frozenset({JobStatus.STOPPED, JobStatus.COMPLETED, JobStatus.FAILED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.STOPPED: frozenset(),
}

ACTIVE_JOB_STATUSES = (JobStatus.IN_PROGRESS, JobStatus.STOPPING)
"""Statuses that hold one of the ``limit`` slots."""


@dataclass(frozen=True, slots=True)
class StatusTransition:
    """One entry of ``SecondaryStatusTransitions``."""

    status: str
    start: datetime
    end: datetime | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Job:
    """One long-running job (a SageMaker training job), from either door."""

    name: str
    arn: str
    status: JobStatus
    secondary_status: str
    request: dict[str, Any]
    """The CreateTrainingJob request as accepted, template and defaults filled in."""
    created: datetime
    modified: datetime
    job_type: str | None = None
    """The facade's ``type``, when the job came through ``POST /inference``."""
    failure_reason: str | None = None
    model_artifacts: str | None = None
    started: datetime | None = None
    ended: datetime | None = None
    transitions: tuple[StatusTransition, ...] = ()
    attempt: int = 1
    runner: str | None = None
    """The current attempt's runner, once launched: its backend's JobHandle ``ref``."""
    applied_lines: int = 0
    """How many lines of the current attempt's status file are recorded."""

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_JOB_STATUSES


@dataclass(frozen=True, slots=True)
class AsyncConfig:
    """An endpoint config's AsyncInferenceConfig, in plain words."""

    output_path: str
    failure_path: str
    success_topic: str | None = None
    error_topic: str | None = None
    include_response_in: tuple[str, ...] = ()
    """``success`` and/or ``error``: notifications that carry the inference response."""
    max_concurrent_per_instance: int = 1


class AsyncStatus(StrEnum):
    QUEUED = "Queued"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class AsyncRequest:
    """One queued asynchronous invocation (InvokeEndpointAsync)."""

    endpoint: str
    inference_id: str
    input_location: str | None
    """Where the input is; None when it came inline (``body``)."""
    output_location: str
    failure_location: str
    received: datetime
    expires: datetime
    """Past this, a request not yet started fails as expired (RequestTTLSeconds)."""
    invocation_timeout_s: float
    content_type: str | None = None
    accept: str | None = None
    custom_attributes: str | None = None
    notify: dict[str, Any] = field(default_factory=dict)
    """Topics and response inclusion, fixed when the request was accepted."""
    status: AsyncStatus = AsyncStatus.QUEUED
    attempts: int = 0
    owner: str | None = None
    lease_until: datetime | None = None
    started: datetime | None = None
    """When a worker last took it from the queue."""
    finished: datetime | None = None
    failure_reason: str | None = None
    id: int | None = None
    body: bytes | None = None
    """The input sent inline (InvokeEndpointAsync's Body), kept with the request until it
    finishes (then cleared)."""


SAGEMAKER_NAMESPACE = "sagemaker"
VARIANT_INSTANCES = "sagemaker:variant:DesiredInstanceCount"
COMPONENT_COPIES = "sagemaker:inference-component:DesiredCopyCount"


def dimension_of(resource_id: str) -> str:
    """The ScalableDimension a ResourceId's form goes with: an inference component's
    (``inference-component/<name>``) copies, else a variant's instances."""
    return COMPONENT_COPIES if resource_id.startswith("inference-component/") else VARIANT_INSTANCES


"""The one ScalableDimension shipyard scales: a SageMaker variant's instance count."""


@dataclass(frozen=True, slots=True)
class ScalableTarget:
    """RegisterScalableTarget: one variant's DesiredInstanceCount, between two bounds."""

    resource_id: str
    """``endpoint/<name>/variant/<variant>``."""
    endpoint: str
    variant: str
    arn: str
    min_capacity: int
    max_capacity: int
    role_arn: str
    created: datetime
    suspended: dict[str, bool] = field(default_factory=dict)
    """SuspendedState: DynamicScalingInSuspended, DynamicScalingOutSuspended,
    ScheduledScalingSuspended."""
    component: str | None = None
    """For ``inference-component/<name>`` (DesiredCopyCount): the component's name;
    ``variant`` is then that name too (its metrics are keyed by it) and ``endpoint`` its
    endpoint, once known (the store leaves it empty)."""

    @property
    def dimension(self) -> str:
        return dimension_of(self.resource_id)


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """PutScalingPolicy: a target-tracking policy on one scalable target."""

    name: str
    resource_id: str
    arn: str
    policy_type: str
    config: dict[str, Any]
    """TargetTrackingScalingPolicyConfiguration, as the caller gave it."""
    created: datetime


class ActivityStatus(StrEnum):
    """ScalingActivityStatusCode."""

    IN_PROGRESS = "InProgress"
    SUCCESSFUL = "Successful"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class ScalingActivity:
    """One scaling step (DescribeScalingActivities), newest first when listed."""

    activity_id: str
    resource_id: str
    description: str
    cause: str
    started: datetime
    status: ActivityStatus
    from_count: int
    to_count: int
    ended: datetime | None = None
    status_message: str | None = None


@dataclass(frozen=True, slots=True)
class TransformJob:
    """One batch transform job (CreateTransformJob). Its status is a JobStatus, whose
    values and transitions TransformJobStatus shares."""

    name: str
    arn: str
    status: JobStatus
    request: dict[str, Any]
    """The CreateTransformJob request as accepted (without Tags)."""
    created: datetime
    modified: datetime
    failure_reason: str | None = None
    started: datetime | None = None
    ended: datetime | None = None
    objects_total: int | None = None
    """Input objects found, once they have been listed."""
    objects_done: int = 0
    records_done: int = 0

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_JOB_STATUSES
