"""CreateEndpoint, DescribeEndpoint, ListEndpoints, UpdateEndpoint, DeleteEndpoint and
UpdateEndpointWeightsAndCapacities."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shipyard.control.deployments import retain
from shipyard.control.endpoints import EndpointService
from shipyard.errors import ResourceNotFound
from shipyard.gateway.api.actions.data_capture import describe_data_capture
from shipyard.gateway.api.actions.listing import page
from shipyard.records import Endpoint, EndpointConfig, VariantSpec


def create_endpoint(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    endpoint = svc.create_endpoint(
        p["EndpointName"], p["EndpointConfigName"], deployment=p.get("DeploymentConfig")
    )
    svc.tagging.add(endpoint.arn, p.get("Tags"), checked=True)
    return {"EndpointArn": endpoint.arn}


def describe_endpoint(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    endpoint, counts = svc.describe_endpoint(p["EndpointName"])
    config = _config(svc, endpoint.config_name)
    images = _deployed_images(svc, config)
    serverless = {
        v.name: v.serverless.describe()
        for v in (config.variants if config is not None else ())
        if v.serverless is not None
    }
    specs = {v.name: v for v in (config.variants if config is not None else ())}
    variants: list[dict[str, Any]] = []
    shadows: list[dict[str, Any]] = []
    for state in endpoint.variants:
        entry: dict[str, Any] = {
            "VariantName": state.name,
            "CurrentWeight": state.desired_weight,
            "DesiredWeight": state.desired_weight,
        }
        if (spec := specs.get(state.name)) is not None:
            entry.update(_variant_settings(spec))
        if state.name in serverless:
            # No instance count: a serverless variant has instances only while it works.
            entry["CurrentServerlessConfig"] = serverless[state.name]
            entry["DesiredServerlessConfig"] = serverless[state.name]
        else:
            entry["CurrentInstanceCount"] = counts.get(state.name, 0)
            entry["DesiredInstanceCount"] = state.desired_instance_count
        if image := images.get(state.name):
            entry["DeployedImages"] = [
                {"SpecifiedImage": image, "ResolvedImage": image,
                 "ResolutionTime": endpoint.created}
            ]  # fmt: skip
        (shadows if state.shadow else variants).append(entry)
    out: dict[str, Any] = {
        "EndpointName": endpoint.name,
        "EndpointArn": endpoint.arn,
        "EndpointConfigName": svc.store.shown_config_name(endpoint.config_name),
        "ProductionVariants": variants,
        "EndpointStatus": endpoint.status.value,
        "CreationTime": endpoint.created,
        "LastModifiedTime": endpoint.modified,
    }
    if shadows:
        out["ShadowProductionVariants"] = shadows
    if endpoint.failure_reason:
        out["FailureReason"] = endpoint.failure_reason
    if capture := describe_data_capture(config):
        out["DataCaptureConfig"] = capture
    if endpoint.pending_config_name:
        out["PendingDeploymentSummary"] = _pending(svc, endpoint)
        share = float((endpoint.deployment or {}).get("share", 0.0))
        for entry in variants:  # the old fleet's share of the traffic now
            entry["CurrentWeight"] = entry["DesiredWeight"] * (1.0 - share)
    if endpoint.last_deployment:
        out["LastDeploymentConfig"] = endpoint.last_deployment
    return out


def _pending(svc: EndpointService, endpoint: Endpoint) -> dict[str, Any]:
    """PendingDeploymentSummary: the config being deployed, its variants' share of the
    traffic and the step the deployment is at."""
    deployment = endpoint.deployment or {}
    started = deployment.get("started")
    summary: dict[str, Any] = {
        "EndpointConfigName": svc.store.shown_config_name(endpoint.pending_config_name or ""),
        "StartTime": datetime.fromtimestamp(float(started), UTC) if started else endpoint.modified,
    }
    config = _config(svc, endpoint.pending_config_name or "")
    if config is None:
        return summary
    config = retain(config, endpoint.retained)  # as the update runs it
    share = float(deployment.get("share", 0.0))
    stage = deployment.get("stage", "Creating")
    since = deployment.get("since")
    status = {
        "Status": {"RollingBack": "Deleting"}.get(stage, stage),
        "StatusMessage": {
            "Creating": "Starting the new fleet.",
            "Baking": f"{share:.0%} of the traffic on the new fleet; watching its alarms.",
            "RollingBack": "An alarm fired: the traffic is back on the old fleet.",
        }.get(stage, stage),
        "StartTime": datetime.fromtimestamp(float(since), UTC) if since else summary["StartTime"],
    }
    summary["ProductionVariants"] = [
        {
            "VariantName": v.name,
            "CurrentWeight": v.weight * share,
            "DesiredWeight": v.weight,
            "DesiredInstanceCount": v.instance_count,
            "InstanceType": v.instance_type,
            "VariantStatus": [status],
        }
        for v in config.variants
        if not v.shadow
    ]
    return summary


def _config(svc: EndpointService, config_name: str) -> EndpointConfig | None:
    """The config the endpoint runs: kept while it does, should the user delete it
    (MetadataStore._retire), so it is described as it runs."""
    try:
        return svc.store.get_endpoint_config(config_name)
    except ResourceNotFound:
        return None


def _deployed_images(svc: EndpointService, config: EndpointConfig | None) -> dict[str, str]:
    """Variant name -> image of the models it runs (kept too, as its config)."""
    if config is None:
        return {}
    images = {}
    for variant in config.variants:
        if not variant.model_name:
            continue  # a variant of inference components
        try:
            images[variant.name] = svc.store.get_model(variant.model_name).image
        except ResourceNotFound:
            continue
    return images


def list_endpoints(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    items, token = page(
        svc.list_endpoints(),
        p,
        kind="Endpoints",
        name=lambda e: e.name,
        created=lambda e: e.created,
        modified=lambda e: e.modified,
        status=lambda e: e.status.value,
        sort_keys={
            "Name": lambda e: e.name,
            "CreationTime": lambda e: e.created,
            "Status": lambda e: e.status.value,
        },
    )
    out: dict[str, Any] = {"Endpoints": [_summary(e) for e in items]}
    if token:
        out["NextToken"] = token
    return out


def update_endpoint(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    endpoint = svc.update_endpoint(
        p["EndpointName"],
        p["EndpointConfigName"],
        deployment=p.get("DeploymentConfig"),
        retain_deployment=bool(p.get("RetainDeploymentConfig", False)),
        retain_variants=bool(p.get("RetainAllVariantProperties", False)),
        exclude_retained=[
            e.get("VariantPropertyType", "")
            for e in p.get("ExcludeRetainedVariantProperties") or []
        ],
    )
    return {"EndpointArn": endpoint.arn}


def update_weights_and_capacities(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, tuple[float | None, int | None]] = {}
    for item in p["DesiredWeightsAndCapacities"]:
        weight = item.get("DesiredWeight")
        count = item.get("DesiredInstanceCount")
        changes[item["VariantName"]] = (
            None if weight is None else float(weight),
            None if count is None else int(count),
        )
    endpoint = svc.update_weights_and_capacities(p["EndpointName"], changes)
    return {"EndpointArn": endpoint.arn}


def delete_endpoint(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete_endpoint(p["EndpointName"])
    return {}


def _variant_settings(spec: VariantSpec) -> dict[str, Any]:
    """ProductionVariantSummary's RoutingConfig and ManagedInstanceScaling, as configured."""
    settings: dict[str, Any] = {"RoutingConfig": {"RoutingStrategy": spec.routing_strategy.value}}
    if spec.managed_scaling is not None:
        low, high = spec.managed_scaling
        settings["ManagedInstanceScaling"] = {
            "Status": "ENABLED", "MinInstanceCount": low, "MaxInstanceCount": high,
        }  # fmt: skip
    return settings


def _summary(e: Endpoint) -> dict[str, Any]:
    return {
        "EndpointName": e.name,
        "EndpointArn": e.arn,
        "CreationTime": e.created,
        "LastModifiedTime": e.modified,
        "EndpointStatus": e.status.value,
    }


ACTIONS = {
    "CreateEndpoint": create_endpoint,
    "DescribeEndpoint": describe_endpoint,
    "ListEndpoints": list_endpoints,
    "UpdateEndpoint": update_endpoint,
    "DeleteEndpoint": delete_endpoint,
    "UpdateEndpointWeightsAndCapacities": update_weights_and_capacities,
}
