"""CreateModel, DescribeModel, ListModels, DeleteModel."""

from __future__ import annotations

from typing import Any

from shipyard.control.endpoints import EndpointService
from shipyard.errors import InvalidParameter
from shipyard.gateway.actions.listing import page
from shipyard.records import Model


def create_model(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    container = p.get("PrimaryContainer") or next(iter(p.get("Containers") or []), None)
    if not container:
        raise InvalidParameter("Either PrimaryContainer or Containers must be provided.")
    image = container.get("Image")
    if not image:
        raise InvalidParameter("PrimaryContainer.Image must be provided.")
    model = svc.create_model(
        p["ModelName"],
        image=image,
        model_data_url=container.get("ModelDataUrl"),
        environment={str(k): str(v) for k, v in (container.get("Environment") or {}).items()},
        execution_role_arn=p.get("ExecutionRoleArn"),
        raw=p,
    )
    return {"ModelArn": model.arn}


def describe_model(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    model = svc.describe_model(p["ModelName"])
    out: dict[str, Any] = {
        "ModelName": model.name,
        "ModelArn": model.arn,
        "CreationTime": model.created,
        "EnableNetworkIsolation": bool(model.raw.get("EnableNetworkIsolation", False)),
    }
    for key in ("PrimaryContainer", "Containers", "ExecutionRoleArn", "VpcConfig"):
        if key in model.raw:
            out[key] = model.raw[key]
    return out


def list_models(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    items, token = page(
        svc.list_models(),
        p,
        name=lambda m: m.name,
        created=lambda m: m.created,
        sort_keys={"Name": lambda m: m.name, "CreationTime": lambda m: m.created},
    )
    out: dict[str, Any] = {"Models": [_summary(m) for m in items]}
    if token:
        out["NextToken"] = token
    return out


def delete_model(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete_model(p["ModelName"])
    return {}


def _summary(m: Model) -> dict[str, Any]:
    return {"ModelName": m.name, "ModelArn": m.arn, "CreationTime": m.created}


ACTIONS = {
    "CreateModel": create_model,
    "DescribeModel": describe_model,
    "ListModels": list_models,
    "DeleteModel": delete_model,
}
