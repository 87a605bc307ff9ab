"""Carrying out a stack's plan on a running gateway, endpoints waited for.

Creations come first, then endpoint changes (waited for until InService), then
deletions, so an endpoint always has a config and a model under it: old versions go only
once every endpoint has moved off them, and a failed update leaves the previous version
serving and in place for the next attempt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from shipyard.cli.client import Gateway, translated
from shipyard.cli.stack import DIMENSION, NAMESPACE, Plan, policy_name, scaling_calls
from shipyard.errors import GatewayError

_POLL_PERIOD_S = 0.25

EndpointProgress = Callable[[str, str], None]
"""Told (endpoint, what it is doing) while endpoints are created, updated or deleted."""


def converge(
    gateway: Gateway, plan: Plan, *, on_progress: EndpointProgress, timeout_s: float
) -> None:
    """Carry out ``plan``: creations first, then endpoints (waited for), then deletions."""
    if plan.sections is not None:
        gateway.put_stack_config(plan.sections)
    _remove_scaling(gateway, plan)
    _create_versions(gateway, plan)
    _put_alarms(gateway, plan)
    _change_endpoints(gateway, plan, timeout_s)
    _wait_endpoints(gateway, {e: c for e, c, _ in plan.endpoints}, on_progress, timeout_s)
    _apply_components(gateway, plan, on_progress, timeout_s)
    _put_scaling(gateway, plan)
    _delete(gateway, plan, on_progress, timeout_s)
    _remove_alarms(gateway, plan)


def _put_alarms(gateway: Gateway, plan: Plan) -> None:
    """Alarms first: an endpoint's DeploymentConfig may name them."""
    cloudwatch = gateway.client("cloudwatch")
    for name, body in plan.alarms:
        with translated(gateway.url, about=f"alarm {name}"):
            cloudwatch.put_metric_alarm(AlarmName=name, **body)
            cloudwatch.tag_resource(ResourceARN=_alarm_arn(cloudwatch, name), Tags=body["Tags"])


def _alarm_arn(cloudwatch: Any, name: str) -> str:
    return str(cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"][0]["AlarmArn"])


def _remove_alarms(gateway: Gateway, plan: Plan) -> None:
    if plan.alarms_removed:
        with translated(gateway.url, about="alarms"):
            gateway.client("cloudwatch").delete_alarms(AlarmNames=plan.alarms_removed)


def _remove_scaling(gateway: Gateway, plan: Plan) -> None:
    scaling = gateway.client("application-autoscaling")
    for rid in plan.scaling_removed:
        with translated(gateway.url, about=rid):
            scaling.delete_scaling_policy(
                PolicyName=policy_name(plan.stack),
                ServiceNamespace=NAMESPACE,
                ResourceId=rid,
                ScalableDimension=DIMENSION,
            )
            scaling.deregister_scalable_target(
                ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
            )


def _create_versions(gateway: Gateway, plan: Plan) -> None:
    sm = gateway.sagemaker
    for name, body, tags in plan.models:
        with translated(gateway.url, about=f"model {name}"):
            sm.create_model(ModelName=name, **body, Tags=tags)
    for name, body, tags in plan.configs:
        with translated(gateway.url, about=f"endpoint config {name}"):
            sm.create_endpoint_config(EndpointConfigName=name, **body, Tags=tags)


def _change_endpoints(gateway: Gateway, plan: Plan, timeout_s: float) -> None:
    sm = gateway.sagemaker
    for name, config, create_tags in plan.endpoints:
        with translated(gateway.url, about=f"endpoint {name}"):
            deployment = (
                {"DeploymentConfig": plan.deployments[name]} if name in plan.deployments else {}
            )
            if create_tags is not None:
                sm.create_endpoint(
                    EndpointName=name, EndpointConfigName=config, Tags=create_tags, **deployment
                )
            else:
                _wait_settled(gateway, name, timeout_s)
                sm.update_endpoint(EndpointName=name, EndpointConfigName=config, **deployment)
    for arn, tags, stale in plan.endpoint_tags:
        with translated(gateway.url, about=arn):
            sm.add_tags(ResourceArn=arn, Tags=tags)
            if stale:
                sm.delete_tags(ResourceArn=arn, TagKeys=stale)


def _apply_components(
    gateway: Gateway, plan: Plan, on_progress: EndpointProgress, timeout_s: float
) -> None:
    """Create and update the plan's inference components, waited for until InService."""
    sm = gateway.sagemaker
    for name, body, tags in plan.components:
        with translated(gateway.url, about=f"inference component {name}"):
            sm.create_inference_component(InferenceComponentName=name, **body, Tags=tags)
    for name, body, arn, tags in plan.components_updated:
        with translated(gateway.url, about=f"inference component {name}"):
            update = {k: body[k] for k in ("Specification", "RuntimeConfig") if k in body}
            sm.update_inference_component(InferenceComponentName=name, **update)
            sm.add_tags(ResourceArn=arn, Tags=tags)
    names = [name for name, *_ in plan.components] + [n for n, *_ in plan.components_updated]
    deadline = time.monotonic() + timeout_s
    waiting = set(names)
    while waiting:
        for name in sorted(waiting):
            with translated(gateway.url, about=f"inference component {name}"):
                described = sm.describe_inference_component(InferenceComponentName=name)
            status = described["InferenceComponentStatus"]
            on_progress(name, status)
            if status == "InService":
                waiting.discard(name)
            elif status == "Failed":
                reason = described.get("FailureReason", "no reason given")
                raise GatewayError(f"inference component {name}: Failed: {reason}")
        if waiting and time.monotonic() > deadline:
            names_left = ", ".join(sorted(waiting))
            raise GatewayError(f"inference component(s) {names_left} not InService in time")
        if waiting:
            time.sleep(_POLL_PERIOD_S)


def _put_scaling(gateway: Gateway, plan: Plan) -> None:
    scaling = gateway.client("application-autoscaling")
    for rid, body in plan.scaling:
        (_, target), (_, policy) = scaling_calls(plan.stack, rid, body)
        with translated(gateway.url, about=rid):
            scaling.register_scalable_target(**target)
            scaling.put_scaling_policy(**policy)


def _delete(gateway: Gateway, plan: Plan, on_progress: EndpointProgress, timeout_s: float) -> None:
    """Endpoints (waited for until gone), then the configs and models under them."""
    sm = gateway.sagemaker

    def adapter_first(name: str) -> bool:
        try:
            described = sm.describe_inference_component(InferenceComponentName=name)
        except ClientError:
            return True  # gone already, or the delete below says why
        return "BaseInferenceComponentName" not in described["Specification"]

    # Adapters before the components they run in, which cannot go while they are there.
    for name in sorted(plan.components_removed, key=adapter_first):
        with translated(gateway.url, about=f"inference component {name}"):
            sm.delete_inference_component(InferenceComponentName=name)
    _wait_components_gone(gateway, plan.components_removed, on_progress, timeout_s)
    for name in plan.endpoints_removed:
        with translated(gateway.url, about=f"endpoint {name}"):
            sm.delete_endpoint(EndpointName=name)
    _wait_deleted(gateway, plan.endpoints_removed, on_progress, timeout_s)
    for name in plan.configs_removed:
        with translated(gateway.url, about=f"endpoint config {name}"):
            sm.delete_endpoint_config(EndpointConfigName=name)
    for name in plan.models_removed:
        with translated(gateway.url, about=f"model {name}"):
            sm.delete_model(ModelName=name)


def _wait_endpoints(
    gateway: Gateway, targets: dict[str, str], on_progress: EndpointProgress, timeout_s: float
) -> None:
    """Until every endpoint serves its target config; a failure ends the apply."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(targets)
    while waiting:
        for name, config in list(waiting.items()):
            with translated(gateway.url, about=f"endpoint {name}"):
                described = gateway.sagemaker.describe_endpoint(EndpointName=name)
            status = described["EndpointStatus"]
            pending = described.get("PendingDeploymentSummary")
            on_progress(name, status)
            if status == "InService" and described["EndpointConfigName"] == config:
                del waiting[name]
            elif status == "Failed" or (status == "InService" and not pending):
                reason = described.get("FailureReason", "no reason given")
                raise GatewayError(f"endpoint {name}: {status}: {reason}")
        if waiting and time.monotonic() > deadline:
            names = ", ".join(sorted(waiting))
            raise GatewayError(f"endpoint(s) {names} not InService within {timeout_s:g} s")
        if waiting:
            time.sleep(_POLL_PERIOD_S)


def _wait_settled(gateway: Gateway, name: str, timeout_s: float) -> None:
    """Until the endpoint takes an UpdateEndpoint: a scaling step may be under way."""
    deadline = time.monotonic() + timeout_s
    while True:
        described = gateway.sagemaker.describe_endpoint(EndpointName=name)
        if described["EndpointStatus"] in ("InService", "Failed"):
            return
        if time.monotonic() > deadline:
            raise GatewayError(f"endpoint {name}: still {described['EndpointStatus']}")
        time.sleep(_POLL_PERIOD_S)


def _wait_components_gone(
    gateway: Gateway, names: list[str], on_progress: EndpointProgress, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = set(names)
    while waiting:
        for name in sorted(waiting):
            try:
                with translated(gateway.url, about=name):
                    gateway.sagemaker.describe_inference_component(InferenceComponentName=name)
            except GatewayError as exc:
                if "Could not find" not in str(exc):
                    raise
                on_progress(name, "Deleted")
                waiting.discard(name)
        if waiting and time.monotonic() > deadline:
            left = ", ".join(sorted(waiting))
            raise GatewayError(f"inference component(s) {left} not deleted in time")
        if waiting:
            time.sleep(_POLL_PERIOD_S)


def _wait_deleted(
    gateway: Gateway, names: list[str], on_progress: EndpointProgress, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = set(names)
    while waiting:
        for name in sorted(waiting):
            try:
                with translated(gateway.url, about=name):
                    described = gateway.sagemaker.describe_endpoint(EndpointName=name)
                on_progress(name, described["EndpointStatus"])
            except GatewayError as exc:
                if "Could not find" not in str(exc):
                    raise
                on_progress(name, "Deleted")
                waiting.discard(name)
        if waiting and time.monotonic() > deadline:
            raise GatewayError(f"endpoint(s) {', '.join(sorted(waiting))} not deleted in time")
        if waiting:
            time.sleep(_POLL_PERIOD_S)
