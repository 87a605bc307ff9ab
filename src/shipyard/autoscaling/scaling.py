"""ScalingService: Application Auto Scaling's targets, policies and activities.

The control plane's actions for ``AnyScaleFrontendService.*`` land here. It checks what
botocore's model cannot (the endpoint and variant exist, Min <= Max, MinCapacity 0 only
for asynchronous endpoints, a metric shipyard publishes) and records desired state; the
Autoscaler (autoscaling/autoscaler.py) acts on it.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from shipyard.control.components import ComponentService
from shipyard.control.endpoints import EndpointService
from shipyard.errors import InvalidParameter, ObjectNotFound, ResourceNotFound
from shipyard.records import (
    COMPONENT_COPIES,
    SAGEMAKER_NAMESPACE,
    VARIANT_INSTANCES,
    ScalableTarget,
    ScalingActivity,
    ScalingPolicy,
    dimension_of,
)
from shipyard.storage.metadata import now
from shipyard.storage.scaling import ScalingStore, component_of, parse_resource_id

TARGET_TRACKING = "TargetTrackingScaling"
STEP_SCALING = "StepScaling"
ADJUSTMENT_TYPES = ("ChangeInCapacity", "PercentChangeInCapacity", "ExactCapacity")

VARIANT_METRICS = {
    "SageMakerVariantInvocationsPerInstance": "InvocationsPerInstance",
    "SageMakerVariantConcurrentRequestsPerModelHighResolution": "ConcurrentRequestsPerModel",
}
COMPONENT_METRICS = {
    "SageMakerInferenceComponentInvocationsPerCopy": "InvocationsPerCopy",
    "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution": (
        "ConcurrentRequestsPerCopy"
    ),
}
PREDEFINED_METRICS = {**VARIANT_METRICS, **COMPONENT_METRICS}
"""Predefined metric types shipyard tracks -> the CloudWatch metric each stands for."""

CUSTOM_METRICS = frozenset(
    {
        "InvocationsPerInstance",
        "Invocations",
        "ConcurrentRequestsPerModel",
        "ApproximateBacklogSize",
        "ApproximateBacklogSizePerInstance",
        "ApproximateAgeOfOldestRequest",
        "HasBacklogWithoutCapacity",
        "InvocationsPerCopy",
        "ConcurrentRequestsPerCopy",
    }
)
"""CloudWatch metric names (namespace AWS/SageMaker) a customized metric may name."""

ASYNC_METRICS = frozenset(
    {
        "ApproximateBacklogSize",
        "ApproximateBacklogSizePerInstance",
        "ApproximateAgeOfOldestRequest",
        "HasBacklogWithoutCapacity",
    }
)

DEFAULT_COOLDOWN_S = 300
"""Application Auto Scaling's default ScaleOutCooldown and ScaleInCooldown for SageMaker."""

_MAX_COOLDOWN_S = 86_400
_TARGET_VALUE_LIMIT = 2.0**360
"""Application Auto Scaling refuses a TargetValue beyond 2^360. Shipyard also refuses one
below 2^-360: a metric divided by it would overflow a float, and the autoscaler could not
turn it into a count of instances."""
_SUSPENDED = (
    "DynamicScalingInSuspended",
    "DynamicScalingOutSuspended",
    "ScheduledScalingSuspended",
)


class ScalingService:
    """Registers targets, puts policies, lists activities."""

    def __init__(
        self,
        *,
        store: ScalingStore,
        endpoints: EndpointService,
        wake: Callable[[], None],
        region: str,
        account_id: str,
        components: ComponentService | None = None,
        alarms_naming: Callable[[str], list[tuple[str, str]]] = lambda arn: [],
    ) -> None:
        self.store = store
        self.endpoints = endpoints
        self.components = components
        self._wake = wake
        self.region = region
        self.account_id = account_id
        self.alarms_naming = alarms_naming
        """A policy's ARN -> (name, ARN) of the CloudWatch alarms whose actions name it
        (alarms live in cloudwatch/; none by default)."""

    def __repr__(self) -> str:
        return f"ScalingService({self.store!r})"

    def policy_by_arn(self, arn: str) -> ScalingPolicy | None:
        return next((p for p in self.store.list_policies() if p.arn == arn), None)

    # -- targets ----------------------------------------------------------------------

    def register_target(
        self,
        resource: str,
        *,
        min_capacity: int | None,
        max_capacity: int | None,
        role_arn: str | None,
        suspended: dict[str, bool] | None,
    ) -> ScalableTarget:
        for field, value in (("MinCapacity", min_capacity), ("MaxCapacity", max_capacity)):
            if value is not None and value < 0:
                raise InvalidParameter(f"{field} must be 0 or more; it is {value}.")
        component = self._component(resource)
        endpoint, variant = ("", component) if component is not None else self._variant(resource)
        current = self.store.get_target(resource)
        if current is not None:
            low = current.min_capacity if min_capacity is None else min_capacity
            high = current.max_capacity if max_capacity is None else max_capacity
        elif min_capacity is None or max_capacity is None:
            raise InvalidParameter(
                "MinCapacity and MaxCapacity are required when registering a new scalable target."
            )
        else:
            low, high = min_capacity, max_capacity
        if low > high:
            raise InvalidParameter(
                f"Minimum capacity {low} cannot be greater than maximum capacity {high}."
            )
        if component is None:
            self._check_variant_bounds(endpoint, variant, low)
        limit = self.endpoints.max_instances_per_variant
        if high > limit:
            what = "copies per component" if component else "instances per production variant"
            raise InvalidParameter(
                f"MaxCapacity {high} is more than the limit of {limit} {what} "
                "(SHIPYARD_MAX_INSTANCES_PER_VARIANT)."
            )
        flags = dict(current.suspended) if current is not None else {}
        for key in _SUSPENDED:
            if suspended is not None and key in suspended:
                flags[key] = bool(suspended[key])
        if current is None:
            target = ScalableTarget(
                resource_id=resource,
                endpoint=endpoint,
                variant=variant,
                arn=self._target_arn(resource),
                min_capacity=low,
                max_capacity=high,
                role_arn=role_arn or self._service_role(),
                created=now(),
                suspended=flags,
                component=component,
            )
        else:
            target = replace(
                current,
                min_capacity=low,
                max_capacity=high,
                role_arn=role_arn or current.role_arn,
                suspended=flags,
            )
        self.store.put_target(target)
        self._wake()  # a count now outside [min, max] is brought inside at once
        return target

    def _check_variant_bounds(self, endpoint: str, variant: str, low: int) -> None:
        config = self._config_of(endpoint)
        spec = next(v for v in config.variants if v.name == variant)
        if spec.serverless is not None:
            raise InvalidParameter(
                f"Production variant {variant} of endpoint {endpoint} is serverless: it has no "
                f"{VARIANT_INSTANCES} to scale (its instances follow its requests)."
            )
        if low == 0 and config.async_config is None:
            raise InvalidParameter(
                f"MinCapacity 0 is only allowed for asynchronous endpoints; endpoint "
                f"{endpoint} is real-time, so its variant {variant} keeps at least 1 instance."
            )

    def describe_targets(self, resources: list[str] | None) -> list[ScalableTarget]:
        targets = self.store.list_targets()
        if resources:
            wanted = set(resources)
            targets = [t for t in targets if t.resource_id in wanted]
        return targets

    def deregister_target(self, resource: str) -> None:
        if not self.store.delete_target(resource):
            raise ObjectNotFound(_no_target(resource))

    # -- policies ---------------------------------------------------------------------

    def put_policy(
        self, name: str, resource: str, policy_type: str, config: dict[str, Any] | None
    ) -> ScalingPolicy:
        """A target tracking policy (``config`` its TargetTrackingScalingPolicyConfiguration)
        or a step scaling one (its StepScalingPolicyConfiguration), which a CloudWatch
        alarm naming its ARN runs (``run_step_policy``)."""
        target = self.store.get_target(resource)
        if target is None:
            raise ObjectNotFound(_no_target(resource))
        if policy_type not in (TARGET_TRACKING, STEP_SCALING):
            raise InvalidParameter(
                f"PolicyType {policy_type} is not supported: use {TARGET_TRACKING} or "
                f"{STEP_SCALING}."
            )
        if config is None:
            raise InvalidParameter(
                f"{policy_type}PolicyConfiguration is required for a {policy_type} policy."
                if policy_type == STEP_SCALING
                else f"TargetTrackingScalingPolicyConfiguration is required for a "
                f"{TARGET_TRACKING} policy."
            )
        if policy_type == TARGET_TRACKING:
            self._check_tracking(config, target)
        else:
            check_steps(config)
        current = next((p for p in self.store.list_policies(resource) if p.name == name), None)
        if current is not None and current.policy_type != policy_type:
            raise InvalidParameter(
                f"Policy {name} is a {current.policy_type} policy; delete it before putting a "
                f"{policy_type} policy of that name."
            )
        policy = ScalingPolicy(
            name=name,
            resource_id=resource,
            arn=self._policy_arn(resource, name),
            policy_type=policy_type,
            config=config,
            created=now(),
        )
        stored = self.store.put_policy(policy)
        self._wake()
        return stored

    def describe_policies(
        self, resource: str | None, names: list[str] | None
    ) -> list[ScalingPolicy]:
        policies = self.store.list_policies(resource)
        if names:
            wanted = set(names)
            policies = [p for p in policies if p.name in wanted]
        return policies

    def delete_policy(self, name: str, resource: str) -> None:
        if not self.store.delete_policy(resource, name):
            raise ObjectNotFound(
                f"No scaling policy found for service namespace: {SAGEMAKER_NAMESPACE}, "
                f"resource ID: {resource}, scalable dimension: {dimension_of(resource)}, policy "
                f"name: {name}"
            )

    def describe_activities(self, resource: str | None) -> list[ScalingActivity]:
        return self.store.list_activities(resource)

    # -- checks -----------------------------------------------------------------------

    def _component(self, resource: str) -> str | None:
        """The inference component ``resource`` names, checked to exist; None for a
        variant's ResourceId."""
        if dimension_of(resource) != COMPONENT_COPIES:
            return None
        name = component_of(resource)
        if name is None or self.components is None:
            raise InvalidParameter(
                f"Unsupported resource ID {resource}: an inference component is "
                "inference-component/<name>."
            )
        try:
            component = self.components.describe(name)
        except ResourceNotFound:
            raise InvalidParameter(
                f"The target resource {resource} does not exist: could not find inference "
                f'component "{name}".'
            ) from None
        if component.spec.base is not None:
            # As UpdateInferenceComponentRuntimeConfig refuses it: it has no copies.
            raise InvalidParameter(
                f"Inference component {name} is an adapter: it runs in the copies of its "
                f"base inference component {component.spec.base}, which is what scales."
            )
        return name

    def _variant(self, resource: str) -> tuple[str, str]:
        parsed = parse_resource_id(resource)
        if parsed is None:
            raise InvalidParameter(
                f"Unsupported resource ID {resource}: a SageMaker variant is "
                "endpoint/<endpoint name>/variant/<variant name>."
            )
        endpoint, variant = parsed
        try:
            current = self.endpoints.store.get_endpoint(endpoint)
        except ResourceNotFound:
            raise InvalidParameter(
                f"The target resource {resource} does not exist: could not find endpoint "
                f'"{endpoint}".'
            ) from None
        state = next((v for v in current.variants if v.name == variant), None)
        if state is None:
            raise InvalidParameter(
                f"The target resource {resource} does not exist: endpoint {endpoint} has no "
                f"production variant {variant}."
            )
        if state.shadow:
            # Shadows are scaled by hand (UpdateEndpointWeightsAndCapacities): their load
            # follows the production variant's, which is what a policy would scale.
            raise InvalidParameter(
                f"{variant} is a shadow variant of endpoint {endpoint}; automatic scaling "
                "applies to production variants only."
            )
        return endpoint, variant

    def _config_of(self, endpoint: str) -> Any:
        current = self.endpoints.store.get_endpoint(endpoint)
        return self.endpoints.store.get_endpoint_config(current.config_name)

    def _check_tracking(self, config: dict[str, Any], target: ScalableTarget) -> None:
        predefined = config.get("PredefinedMetricSpecification")
        custom = config.get("CustomizedMetricSpecification")
        if (predefined is None) == (custom is None):
            raise InvalidParameter(
                "A target tracking scaling policy needs exactly one of "
                "PredefinedMetricSpecification and CustomizedMetricSpecification."
            )
        value = float(config["TargetValue"])
        if not value > 0:  # NaN too
            raise InvalidParameter(f"TargetValue must be greater than 0; it is {value:g}.")
        if not 1 / _TARGET_VALUE_LIMIT <= value <= _TARGET_VALUE_LIMIT:
            raise InvalidParameter(
                f"TargetValue {value:g} is out of range: it must be between 2^-360 and 2^360."
            )
        for field in ("ScaleOutCooldown", "ScaleInCooldown"):
            cooldown = config.get(field)
            if cooldown is not None and not 0 <= int(cooldown) <= _MAX_COOLDOWN_S:
                raise InvalidParameter(
                    f"{field} must be between 0 and {_MAX_COOLDOWN_S} seconds; it is {cooldown}."
                )
        if predefined is not None:
            _check_predefined(predefined, target)
        else:
            self._check_custom(custom or {}, target)

    def _check_custom(self, custom: dict[str, Any], target: ScalableTarget) -> None:
        if custom.get("Metrics"):
            raise InvalidParameter(
                "Metric math (CustomizedMetricSpecification.Metrics) is not supported; name "
                "one metric with MetricName and Namespace."
            )
        name, namespace = custom.get("MetricName"), custom.get("Namespace")
        if namespace != "AWS/SageMaker":
            raise InvalidParameter(
                f"CustomizedMetricSpecification.Namespace {namespace!r}: shipyard publishes "
                "metrics only under AWS/SageMaker."
            )
        if name not in CUSTOM_METRICS:
            raise InvalidParameter(
                f"CustomizedMetricSpecification.MetricName {name!r} is not a metric shipyard "
                f"publishes; use one of {', '.join(sorted(CUSTOM_METRICS))}."
            )
        endpoint = metric_endpoint(custom, target.endpoint)
        if name in ASYNC_METRICS:
            try:
                config_of = self._config_of(endpoint)
            except ResourceNotFound:
                raise InvalidParameter(
                    f"CustomizedMetricSpecification names endpoint {endpoint}, which does not "
                    "exist."
                ) from None
            if config_of.async_config is None:
                raise InvalidParameter(
                    f"{name} is a metric of asynchronous endpoints; endpoint {endpoint} is "
                    "real-time."
                )

    def _target_arn(self, resource: str) -> str:
        digest = hashlib.sha256(resource.encode()).hexdigest()[:32]
        return (
            f"arn:aws:application-autoscaling:{self.region}:{self.account_id}:"
            f"scalable-target/{digest}"
        )

    def _policy_arn(self, resource: str, name: str) -> str:
        return (
            f"arn:aws:autoscaling:{self.region}:{self.account_id}:scalingPolicy:{uuid.uuid4()}:"
            f"resource/{SAGEMAKER_NAMESPACE}/{resource}:policyName/{name}"
        )

    def _service_role(self) -> str:
        # What AWS records when RoleARN is left out: its service-linked role.
        return (
            f"arn:aws:iam::{self.account_id}:role/aws-service-role/"
            "sagemaker.application-autoscaling.amazonaws.com/"
            "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
        )


def _check_predefined(predefined: dict[str, Any], target: ScalableTarget) -> None:
    kind = predefined["PredefinedMetricType"]
    allowed = COMPONENT_METRICS if target.component is not None else VARIANT_METRICS
    if kind not in allowed:
        raise InvalidParameter(
            f"PredefinedMetricType {kind} is not supported for {target.dimension}; use one "
            f"of {', '.join(sorted(allowed))}, or a CustomizedMetricSpecification."
        )
    if predefined.get("ResourceLabel"):
        raise InvalidParameter(f"ResourceLabel is not used with PredefinedMetricType {kind}.")


def check_steps(config: dict[str, Any]) -> None:
    """StepScalingPolicyConfiguration as Application Auto Scaling checks it: an
    adjustment type, and steps each with at least one bound whose intervals neither
    overlap nor leave a gap (an alarm's value in the gap would run no step). Steps that
    reach below 0 must end in one without a lower bound, and steps that reach above 0 in
    one without an upper bound, so that however far the alarm's value goes a step runs."""
    kind = config.get("AdjustmentType")
    if kind not in ADJUSTMENT_TYPES:
        raise InvalidParameter(
            f"AdjustmentType {kind} is not valid: use one of {', '.join(ADJUSTMENT_TYPES)}."
        )
    steps = config.get("StepAdjustments") or []
    if not steps:
        raise InvalidParameter("StepScalingPolicyConfiguration needs at least one StepAdjustment.")
    magnitude = config.get("MinAdjustmentMagnitude")
    if magnitude is not None and kind != "PercentChangeInCapacity":
        raise InvalidParameter(
            "MinAdjustmentMagnitude is only allowed with AdjustmentType PercentChangeInCapacity."
        )
    intervals = []
    for n, step in enumerate(steps, start=1):
        low = step.get("MetricIntervalLowerBound")
        high = step.get("MetricIntervalUpperBound")
        if low is None and high is None:
            raise InvalidParameter(
                f"StepAdjustments {n} has no bound: the upper and lower bound can't both be "
                "null in the same step adjustment."
            )
        if low is not None and high is not None and float(low) >= float(high):
            raise InvalidParameter(
                f"StepAdjustments {n}: MetricIntervalLowerBound must be below its upper bound."
            )
        if kind == "ExactCapacity" and int(step["ScalingAdjustment"]) < 0:
            raise InvalidParameter("An ExactCapacity ScalingAdjustment must be 0 or more.")
        intervals.append(
            (-math.inf if low is None else float(low), math.inf if high is None else float(high))
        )
    _check_intervals(intervals)
    cooldown = config.get("Cooldown")
    if cooldown is not None and not 0 <= int(cooldown) <= _MAX_COOLDOWN_S:
        raise InvalidParameter(f"Cooldown must be between 0 and {_MAX_COOLDOWN_S} seconds.")


def _check_intervals(intervals: list[tuple[float, float]]) -> None:
    """The steps' metric intervals (an open end as an infinity) cover one range without
    overlap or gap, open at either end that reaches past 0."""
    intervals = sorted(intervals)
    for (_, high), (low, _) in zip(intervals, intervals[1:], strict=False):
        if low < high:
            raise InvalidParameter("The StepAdjustments' metric intervals overlap.")
        if low > high:
            raise InvalidParameter(
                f"The StepAdjustments' metric intervals have a gap between {high:g} and "
                f"{low:g}: their ranges can't overlap or have a gap."
            )
    start, end = intervals[0][0], intervals[-1][1]
    if -math.inf < start < 0:
        raise InvalidParameter(
            f"A step adjustment has the negative lower bound {start:g}, so a step adjustment "
            "must have a null lower bound."
        )
    if 0 < end < math.inf:
        raise InvalidParameter(
            f"A step adjustment has the positive upper bound {end:g}, so a step adjustment "
            "must have a null upper bound."
        )


def step_wanted(config: dict[str, Any], current: int, breach: float | None) -> int | None:
    """The capacity a step scaling policy asks for when its alarm's value is ``breach``
    above (or below) the threshold; None when no step's interval holds it."""
    for step in config.get("StepAdjustments") or []:
        low = step.get("MetricIntervalLowerBound")
        high = step.get("MetricIntervalUpperBound")
        if breach is not None:
            if low is not None and breach < float(low):
                continue
            if high is not None and breach >= float(high):
                continue
        adjustment = int(step["ScalingAdjustment"])
        kind = config.get("AdjustmentType")
        if kind == "ExactCapacity":
            return adjustment
        if kind == "PercentChangeInCapacity":
            change = current * adjustment / 100.0
            # Rounded toward zero, but a change between -1 and 1 is one instance
            # (Application Auto Scaling's rounding for SageMaker).
            if 0 < abs(change) < 1:
                change = 1.0 if change > 0 else -1.0
            change = math.floor(change) if change > 0 else math.ceil(change)
            magnitude = int(config.get("MinAdjustmentMagnitude") or 0)
            if adjustment and abs(change) < magnitude:
                change = magnitude if adjustment > 0 else -magnitude
            return current + int(change)
        return current + adjustment
    return None


def metric_endpoint(custom: dict[str, Any], default: str) -> str:
    """The endpoint a customized metric's ``EndpointName`` dimension names (default: the
    target's own)."""
    for dimension in custom.get("Dimensions") or ():
        if dimension.get("Name") == "EndpointName":
            return str(dimension.get("Value", default))
    return default


def _no_target(resource: str) -> str:
    return (
        f"No scalable target registered for service namespace: {SAGEMAKER_NAMESPACE}, resource "
        f"ID: {resource}, scalable dimension: {dimension_of(resource)}"
    )
