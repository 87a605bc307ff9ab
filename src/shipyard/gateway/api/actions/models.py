"""CreateModel, DescribeModel, ListModels, DeleteModel."""

from __future__ import annotations

from typing import Any

from shipyard.control.endpoints import EndpointService
from shipyard.errors import InvalidParameter
from shipyard.gateway.api.actions.listing import page
from shipyard.records import ContainerMode, ExecutionMode, Model
from shipyard.routing import priorities

# Multi-model settings the built-in runtime reads from the model's Environment.
_CACHE_KNOBS = (
    "SHIPYARD_MODEL_CACHE_BYTES",
    "SHIPYARD_MODEL_CACHE_MAX_MODELS",
    "SHIPYARD_MODEL_DISK_CACHE_BYTES",
)


def create_model(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    if p.get("PrimaryContainer") and p.get("Containers"):
        raise InvalidParameter(
            "PrimaryContainer and Containers are mutually exclusive: give one of them."
        )
    container = p.get("PrimaryContainer") or next(iter(p.get("Containers") or []), None)
    if not container:
        raise InvalidParameter("Either PrimaryContainer or Containers must be provided.")
    image = container.get("Image")
    if not image:
        raise InvalidParameter("PrimaryContainer.Image must be provided.")
    _check_mode(p, container)
    _check_containers(p)
    priorities.queue_rules(
        {str(k): str(v) for k, v in (container.get("Environment") or {}).items()}
    )  # refuses a bad admission value, naming it
    # None of the containers may run a command, set a variable or name a file this
    # gateway's auth: section does not allow.
    for n, other in enumerate(p.get("Containers") or [], start=1):
        svc.host_access.check_process(
            image=str(other.get("Image", "")),
            environment=other.get("Environment"),
            image_field=f"Containers.{n}.Image",
            environment_field=f"Containers.{n}.Environment",
        )
        svc.host_access.check_location(other.get("ModelDataUrl"), f"Containers.{n}.ModelDataUrl")
    model = svc.create_model(
        p["ModelName"],
        image=image,
        model_data_url=container.get("ModelDataUrl"),
        environment={str(k): str(v) for k, v in (container.get("Environment") or {}).items()},
        execution_role_arn=p.get("ExecutionRoleArn"),
        raw=p,
    )
    svc.tagging.add(model.arn, p.get("Tags"), checked=True)
    return {"ModelArn": model.arn}


def describe_model(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    model = svc.describe_model(p["ModelName"])
    out: dict[str, Any] = {
        "ModelName": model.name,
        "ModelArn": model.arn,
        "CreationTime": model.created,
        "EnableNetworkIsolation": bool(model.raw.get("EnableNetworkIsolation", False)),
    }
    for key in (
        "PrimaryContainer",
        "Containers",
        "InferenceExecutionConfig",
        "ExecutionRoleArn",
        "VpcConfig",
    ):
        if key in model.raw:
            out[key] = model.raw[key]
    if isinstance(out.get("PrimaryContainer"), dict):
        out["PrimaryContainer"] = {"Mode": ContainerMode.SINGLE_MODEL, **out["PrimaryContainer"]}
    if isinstance(out.get("Containers"), list):
        out["Containers"] = [{"Mode": ContainerMode.SINGLE_MODEL, **c} for c in out["Containers"]]
        out["InferenceExecutionConfig"] = {"Mode": model.execution_mode.value}
    return out


def list_models(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    items, token = page(
        svc.list_models(),
        p,
        kind="Models",
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


def _check_mode(p: dict[str, Any], container: dict[str, Any]) -> None:
    """Refuse a MultiModel container SageMaker would refuse, or shipyard could not serve."""
    multi = container.get("Mode") == ContainerMode.MULTI_MODEL
    if "MultiModelConfig" in container and not multi:
        raise InvalidParameter(
            "MultiModelConfig is only valid for a container whose Mode is MultiModel."
        )
    if not multi:
        return
    if len(p.get("Containers") or []) > 1:
        raise InvalidParameter(
            "Mode MultiModel is not supported for an inference pipeline: give one container."
        )
    prefix = container.get("ModelDataUrl")
    if not prefix:
        raise InvalidParameter(
            "ModelDataUrl must be provided when Mode is MultiModel: it is the prefix under "
            "which each request's TargetModel is found."
        )
    if not _is_prefix(prefix):
        raise InvalidParameter(
            f"ModelDataUrl {prefix!r} is not a valid multi-model prefix: give an s3://bucket/"
            "prefix/ URI, a file:/// URI or an absolute path."
        )
    environment = container.get("Environment") or {}
    for key in _CACHE_KNOBS:
        value = str(environment.get(key, "1")).strip()
        if not value.isdigit() or int(value) < 1:
            raise InvalidParameter(
                f"Environment {key} must be a whole number above 0, got {value!r}."
            )


def _check_containers(p: dict[str, Any]) -> None:
    """Refuse a multi-container model SageMaker would refuse: a container without an
    image, a hostname given twice (whatever its case, as hostnames are compared), a
    Direct model whose containers are not all named."""
    containers = p.get("Containers") or []
    mode = (p.get("InferenceExecutionConfig") or {}).get("Mode", ExecutionMode.SERIAL)
    if mode == ExecutionMode.DIRECT and not containers:
        raise InvalidParameter(
            "InferenceExecutionConfig.Mode Direct needs Containers: give each container a "
            "ContainerHostname."
        )
    seen: set[str] = set()
    for n, container in enumerate(containers, start=1):
        if not container.get("Image"):
            raise InvalidParameter(f"Containers.{n}.Image must be provided.")
        grouped = len(containers) > 1 or mode == ExecutionMode.DIRECT
        if grouped and container.get("Mode") == ContainerMode.MULTI_MODEL:
            raise InvalidParameter(
                f"Containers.{n}.Mode MultiModel is not supported for a multi-container "
                "model: give one container."
            )
        hostname = container.get("ContainerHostname")
        if not hostname:
            if mode == ExecutionMode.DIRECT:
                raise InvalidParameter(
                    f"Containers.{n}.ContainerHostname must be provided when "
                    "InferenceExecutionConfig.Mode is Direct: requests name the container "
                    "they are for by it."
                )
            continue
        if hostname.casefold() in seen:
            raise InvalidParameter(
                f"ContainerHostname {hostname!r} is given to more than one container; each "
                "container's hostname must be unique."
            )
        seen.add(hostname.casefold())


def _is_prefix(uri: str) -> bool:
    if uri.startswith("s3://"):
        return len(uri) > len("s3://") and not uri.startswith("s3:///")
    return uri.startswith(("file:///", "/"))


def _summary(m: Model) -> dict[str, Any]:
    return {"ModelName": m.name, "ModelArn": m.arn, "CreationTime": m.created}


ACTIONS = {
    "CreateModel": create_model,
    "DescribeModel": describe_model,
    "ListModels": list_models,
    "DeleteModel": delete_model,
}
