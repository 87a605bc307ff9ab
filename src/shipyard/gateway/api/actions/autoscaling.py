"""Application Auto Scaling's actions (``AnyScaleFrontendService.*``), for SageMaker
variants only: ServiceNamespace ``sagemaker`` and ScalableDimension
``sagemaker:variant:DesiredInstanceCount``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shipyard.autoscaling.scaling import STEP_SCALING, ScalingService
from shipyard.errors import InvalidParameter
from shipyard.gateway.api.actions.listing import offset, token
from shipyard.records import (
    COMPONENT_COPIES,
    SAGEMAKER_NAMESPACE,
    VARIANT_INSTANCES,
    ScalableTarget,
    ScalingActivity,
    ScalingPolicy,
    dimension_of,
)

T = TypeVar("T")

_MAX_RESULTS = 50


def _scope(p: dict[str, Any], *, dimension_required: bool = True) -> None:
    namespace = p.get("ServiceNamespace")
    if namespace != SAGEMAKER_NAMESPACE:
        raise InvalidParameter(
            f"Unsupported service namespace {namespace}: shipyard scales SageMaker "
            f"variants only (ServiceNamespace {SAGEMAKER_NAMESPACE})."
        )
    dimension = p.get("ScalableDimension")
    if dimension is None and not dimension_required:
        return
    if dimension not in (VARIANT_INSTANCES, COMPONENT_COPIES):
        raise InvalidParameter(
            f"Unsupported scalable dimension {dimension}: shipyard scales {VARIANT_INSTANCES} "
            f"and {COMPONENT_COPIES} only."
        )
    resource = p.get("ResourceId")
    if resource is not None and dimension_of(resource) != dimension:
        raise InvalidParameter(
            f"Scalable dimension {dimension} does not go with resource ID {resource}: "
            f"{VARIANT_INSTANCES} scales endpoint/<endpoint>/variant/<variant>, "
            f"{COMPONENT_COPIES} scales inference-component/<name>."
        )


def _page(items: Sequence[T], p: dict[str, Any]) -> tuple[list[T], str | None]:
    start = offset(p.get("NextToken"))
    size = int(p.get("MaxResults", _MAX_RESULTS))
    if not 1 <= size <= 50:  # AWS's documented range; botocore's model has none
        raise InvalidParameter(f"MaxResults {size} is not between 1 and 50.")
    window = list(items[start : start + size])
    return window, token(start + size) if start + size < len(items) else None


_R = TypeVar("_R", ScalableTarget, ScalingPolicy, ScalingActivity)


def _of_dimension(items: Sequence[_R], p: dict[str, Any]) -> Sequence[_R]:
    """Those of ``items`` on the ScalableDimension asked for (all when none is)."""
    dimension = p.get("ScalableDimension")
    if dimension is None:
        return items
    return [i for i in items if dimension_of(i.resource_id) == dimension]


def _listed(key: str, items: list[dict[str, Any]], next_token: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {key: items}
    if next_token is not None:
        out["NextToken"] = next_token
    return out


def register_scalable_target(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p)
    target = svc.register_target(
        p["ResourceId"],
        min_capacity=p.get("MinCapacity"),
        max_capacity=p.get("MaxCapacity"),
        role_arn=p.get("RoleARN"),
        suspended=p.get("SuspendedState"),
    )
    return {"ScalableTargetARN": target.arn}


def describe_scalable_targets(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p, dimension_required=False)
    window, next_token = _page(_of_dimension(svc.describe_targets(p.get("ResourceIds")), p), p)
    return _listed("ScalableTargets", [_target(t) for t in window], next_token)


def deregister_scalable_target(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p)
    svc.deregister_target(p["ResourceId"])
    return {}


def put_scaling_policy(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p)
    kind = p.get("PolicyType", STEP_SCALING)  # AWS's default when it is left out
    policy = svc.put_policy(
        p["PolicyName"],
        p["ResourceId"],
        kind,
        p.get(
            "StepScalingPolicyConfiguration"
            if kind == STEP_SCALING
            else "TargetTrackingScalingPolicyConfiguration"
        ),
    )
    return {"PolicyARN": policy.arn, "Alarms": _alarms(svc, policy)}


def describe_scaling_policies(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p, dimension_required=False)
    policies = svc.describe_policies(p.get("ResourceId"), p.get("PolicyNames"))
    window, next_token = _page(_of_dimension(policies, p), p)
    return _listed("ScalingPolicies", [_policy(svc, x) for x in window], next_token)


def delete_scaling_policy(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p)
    svc.delete_policy(p["PolicyName"], p["ResourceId"])
    return {}


def describe_scaling_activities(svc: ScalingService, p: dict[str, Any]) -> dict[str, Any]:
    _scope(p, dimension_required=False)
    activities = svc.describe_activities(p.get("ResourceId"))
    window, next_token = _page(_of_dimension(activities, p), p)
    return _listed("ScalingActivities", [_activity(a) for a in window], next_token)


def _target(t: ScalableTarget) -> dict[str, Any]:
    return {
        "ServiceNamespace": SAGEMAKER_NAMESPACE,
        "ResourceId": t.resource_id,
        "ScalableDimension": t.dimension,
        "MinCapacity": t.min_capacity,
        "MaxCapacity": t.max_capacity,
        "RoleARN": t.role_arn,
        "CreationTime": t.created,
        "SuspendedState": {
            "DynamicScalingInSuspended": t.suspended.get("DynamicScalingInSuspended", False),
            "DynamicScalingOutSuspended": t.suspended.get("DynamicScalingOutSuspended", False),
            "ScheduledScalingSuspended": t.suspended.get("ScheduledScalingSuspended", False),
        },
        "ScalableTargetARN": t.arn,
    }


def _policy(svc: ScalingService, x: ScalingPolicy) -> dict[str, Any]:
    kind = x.policy_type
    return {
        "PolicyARN": x.arn,
        "PolicyName": x.name,
        "ServiceNamespace": SAGEMAKER_NAMESPACE,
        "ResourceId": x.resource_id,
        "ScalableDimension": dimension_of(x.resource_id),
        "PolicyType": kind,
        f"{kind if kind == STEP_SCALING else 'TargetTrackingScaling'}PolicyConfiguration": x.config,
        "Alarms": _alarms(svc, x),
        "CreationTime": x.created,
    }


def _alarms(svc: ScalingService, x: ScalingPolicy) -> list[dict[str, str]]:
    """The CloudWatch alarms whose actions name the policy."""
    return [{"AlarmName": name, "AlarmARN": arn} for name, arn in svc.alarms_naming(x.arn)]


def _activity(a: ScalingActivity) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ActivityId": a.activity_id,
        "ServiceNamespace": SAGEMAKER_NAMESPACE,
        "ResourceId": a.resource_id,
        "ScalableDimension": dimension_of(a.resource_id),
        "Description": a.description,
        "Cause": a.cause,
        "StartTime": a.started,
        "StatusCode": a.status.value,
    }
    if a.ended is not None:
        out["EndTime"] = a.ended
    if a.status_message:
        out["StatusMessage"] = a.status_message
    return out


ACTIONS: dict[str, Callable[[ScalingService, dict[str, Any]], dict[str, Any]]] = {
    "RegisterScalableTarget": register_scalable_target,
    "DescribeScalableTargets": describe_scalable_targets,
    "DeregisterScalableTarget": deregister_scalable_target,
    "PutScalingPolicy": put_scaling_policy,
    "DescribeScalingPolicies": describe_scaling_policies,
    "DeleteScalingPolicy": delete_scaling_policy,
    "DescribeScalingActivities": describe_scaling_activities,
}
