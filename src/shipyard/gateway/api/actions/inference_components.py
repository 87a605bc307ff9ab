"""CreateInferenceComponent, DescribeInferenceComponent, ListInferenceComponents,
UpdateInferenceComponent, UpdateInferenceComponentRuntimeConfig,
DeleteInferenceComponent."""

from __future__ import annotations

from typing import Any

from shipyard.control.components import ComponentService
from shipyard.errors import InvalidParameter, ResourceNotFound
from shipyard.gateway.api.actions.listing import page
from shipyard.records import ComponentSpec, ComputeRequirements, InferenceComponent


def create_inference_component(svc: ComponentService, p: dict[str, Any]) -> dict[str, Any]:
    raw = _one_specification(p)
    if raw is None:
        raise InvalidParameter("Specification is required.")
    spec = _spec(raw)
    copies = _copies(p.get("RuntimeConfig"))
    if copies is None:
        if spec.base is None:
            raise InvalidParameter(
                "RuntimeConfig is required for an inference component that is not an "
                "adapter (BaseInferenceComponentName)."
            )
        copies = 0
    component = svc.create(
        p["InferenceComponentName"],
        endpoint=p["EndpointName"],
        variant=p.get("VariantName"),
        spec=spec,
        copies=copies,
        raw=raw,
    )
    svc.tagging.add(component.arn, p.get("Tags"), checked=True)
    return {"InferenceComponentArn": component.arn}


def describe_inference_component(svc: ComponentService, p: dict[str, Any]) -> dict[str, Any]:
    c = svc.describe(p["InferenceComponentName"])
    # An adapter runs in its base's copies: those are its copies.
    copies = c if c.spec.base is None else _base_or_self(svc, c)
    out: dict[str, Any] = {
        "InferenceComponentName": c.name,
        "InferenceComponentArn": c.arn,
        "EndpointName": c.endpoint,
        "EndpointArn": svc.arn("endpoint", c.endpoint),
        "VariantName": c.variant,
        "Specification": _describe_spec(c),
        "RuntimeConfig": {
            "DesiredCopyCount": copies.copies,
            "CurrentCopyCount": svc.current(copies),
        },
        "CreationTime": c.created,
        "LastModifiedTime": c.modified,
        "InferenceComponentStatus": c.status.value,
    }
    if c.failure_reason:
        out["FailureReason"] = c.failure_reason
    return out


def _base_or_self(svc: ComponentService, c: InferenceComponent) -> InferenceComponent:
    try:
        return svc.describe(c.spec.base or c.name)
    except ResourceNotFound:
        return c


def list_inference_components(svc: ComponentService, p: dict[str, Any]) -> dict[str, Any]:
    found = svc.list()
    if endpoint := p.get("EndpointNameEquals"):
        found = [c for c in found if c.endpoint == endpoint]
    if variant := p.get("VariantNameEquals"):
        found = [c for c in found if c.variant == variant]
    items, token = page(
        found,
        p,
        kind="InferenceComponents",
        name=lambda c: c.name,
        created=lambda c: c.created,
        modified=lambda c: c.modified,
        status=lambda c: c.status.value,
        sort_keys={
            "Name": lambda c: c.name,
            "CreationTime": lambda c: c.created,
            "Status": lambda c: c.status.value,
        },
    )
    out: dict[str, Any] = {"InferenceComponents": [_summary(svc, c) for c in items]}
    if token:
        out["NextToken"] = token
    return out


def update_inference_component(svc: ComponentService, p: dict[str, Any]) -> dict[str, Any]:
    raw = _one_specification(p)
    copies = _copies(p.get("RuntimeConfig"))
    if raw is None and copies is None:
        raise InvalidParameter("Give a Specification or a RuntimeConfig to update.")
    component = svc.update(
        p["InferenceComponentName"],
        spec=None if raw is None else _spec(raw),
        raw=raw,
        copies=copies,
    )
    return {"InferenceComponentArn": component.arn}


def update_inference_component_runtime_config(
    svc: ComponentService, p: dict[str, Any]
) -> dict[str, Any]:
    copies = _copies(p["DesiredRuntimeConfig"])
    assert copies is not None  # CopyCount is required by the service model
    component = svc.update_copies(p["InferenceComponentName"], copies)
    return {"InferenceComponentArn": component.arn}


def delete_inference_component(svc: ComponentService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete(p["InferenceComponentName"])
    return {}


def _one_specification(p: dict[str, Any]) -> dict[str, Any] | None:
    """Specification, or the one item of Specifications (a list botocore's model allows
    for components of several instance types, which shipyard does not place)."""
    several = p.get("Specifications")
    if several is not None:
        if "Specification" in p or len(several) != 1:
            raise InvalidParameter(
                "Give one Specification: components placed on several instance types "
                "(Specifications) are not supported by this gateway."
            )
        return dict(several[0])
    spec = p.get("Specification")
    return None if spec is None else dict(spec)


def _copies(runtime: dict[str, Any] | None) -> int | None:
    if runtime is None:
        return None
    return int(runtime["CopyCount"])


def _spec(raw: dict[str, Any]) -> ComponentSpec:
    container = raw.get("Container") or {}
    needs = raw.get("ComputeResourceRequirements")
    startup = raw.get("StartupParameters") or {}
    return ComponentSpec(
        model_name=raw.get("ModelName"),
        image=container.get("Image"),
        artifact_url=container.get("ArtifactUrl"),
        environment=dict(container.get("Environment") or {}),
        requirements=None
        if needs is None
        else ComputeRequirements(
            min_memory_mb=int(needs["MinMemoryRequiredInMb"]),
            cpus=float(needs.get("NumberOfCpuCoresRequired", 0.0)),
            max_memory_mb=None
            if needs.get("MaxMemoryRequiredInMb") is None
            else int(needs["MaxMemoryRequiredInMb"]),
            accelerators=float(needs.get("NumberOfAcceleratorDevicesRequired", 0.0)),
        ),
        base=raw.get("BaseInferenceComponentName"),
        startup_timeout_s=startup.get("ContainerStartupHealthCheckTimeoutInSeconds"),
    )


def _describe_spec(c: InferenceComponent) -> dict[str, Any]:
    """InferenceComponentSpecificationSummary: the Specification as given, its
    Container's Image reported as DeployedImage."""
    out = {k: v for k, v in c.raw.items() if k != "Container"}
    container = c.raw.get("Container")
    if container:
        summary = {k: v for k, v in container.items() if k != "Image"}
        if "Image" in container:
            summary["DeployedImage"] = {
                "SpecifiedImage": container["Image"],
                "ResolvedImage": container["Image"],
            }
        out["Container"] = summary
    return out


def _summary(svc: ComponentService, c: InferenceComponent) -> dict[str, Any]:
    return {
        "InferenceComponentName": c.name,
        "InferenceComponentArn": c.arn,
        "EndpointName": c.endpoint,
        "EndpointArn": svc.arn("endpoint", c.endpoint),
        "VariantName": c.variant,
        "InferenceComponentStatus": c.status.value,
        "CreationTime": c.created,
        "LastModifiedTime": c.modified,
    }


ACTIONS = {
    "CreateInferenceComponent": create_inference_component,
    "DescribeInferenceComponent": describe_inference_component,
    "ListInferenceComponents": list_inference_components,
    "UpdateInferenceComponent": update_inference_component,
    "UpdateInferenceComponentRuntimeConfig": update_inference_component_runtime_config,
    "DeleteInferenceComponent": delete_inference_component,
}
