"""CreateEndpointConfig, DescribeEndpointConfig, ListEndpointConfigs, DeleteEndpointConfig."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shipyard.control.endpoints import EndpointService
from shipyard.errors import InvalidParameter
from shipyard.gateway.api.actions.data_capture import check_data_capture
from shipyard.gateway.api.actions.listing import page
from shipyard.records import (
    AsyncConfig,
    EndpointConfig,
    RoutingStrategy,
    ServerlessConfig,
    VariantSpec,
)


def create_endpoint_config(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    if "DataCaptureConfig" in p:
        check_data_capture(p["DataCaptureConfig"], svc.host_access)
    variants = [_variant(v) for v in p["ProductionVariants"]]
    # Shadow variants are ProductionVariants in every field, checked the same way.
    variants += [replace(_variant(v), shadow=True) for v in p.get("ShadowProductionVariants", [])]
    async_config = _async_config(p["AsyncInferenceConfig"]) if "AsyncInferenceConfig" in p else None
    config = svc.create_endpoint_config(
        p["EndpointConfigName"], variants, raw=p, async_config=async_config
    )
    svc.tagging.add(config.arn, p.get("Tags"), checked=True)
    return {"EndpointConfigArn": config.arn}


_INCLUDE = {"SUCCESS_NOTIFICATION_TOPIC": "success", "ERROR_NOTIFICATION_TOPIC": "error"}


def _async_config(c: dict[str, Any]) -> AsyncConfig:
    output = c["OutputConfig"]
    path = output.get("S3OutputPath")
    if not path:
        raise InvalidParameter("AsyncInferenceConfig.OutputConfig.S3OutputPath is required.")
    notify = output.get("NotificationConfig") or {}
    include = notify.get("IncludeInferenceResponseIn") or []
    unknown = [i for i in include if i not in _INCLUDE]
    if unknown:
        raise InvalidParameter(
            f"IncludeInferenceResponseIn: {unknown} are not SUCCESS_NOTIFICATION_TOPIC or "
            "ERROR_NOTIFICATION_TOPIC."
        )
    return AsyncConfig(
        output_path=path,
        failure_path=output.get("S3FailurePath") or path,
        success_topic=notify.get("SuccessTopic") or None,
        error_topic=notify.get("ErrorTopic") or None,
        include_response_in=tuple(dict.fromkeys(_INCLUDE[i] for i in include)),
        max_concurrent_per_instance=int(
            (c.get("ClientConfig") or {}).get("MaxConcurrentInvocationsPerInstance", 1)
        ),
    )


def _variant(v: dict[str, Any]) -> VariantSpec:
    # botocore's model makes ModelName and InitialInstanceCount optional (inference
    # components and serverless variants go without), so a request that passed
    # validation may still lack what an instance-based variant needs.
    # Members that ask for what is not done here are refused before (gateway/api/unsupported.py).
    name = v["VariantName"]
    model_name = v.get("ModelName")
    if "ServerlessConfig" in v:
        if model_name is None:
            raise InvalidParameter(
                f"ModelName is required for serverless production variant {name}."
            )
        return VariantSpec(
            name=name,
            model_name=model_name,
            instance_type="",
            instance_count=0,
            weight=float(v.get("InitialVariantWeight", 1.0)),
            routing_strategy=_routing_strategy(v),
            serverless=_serverless(name, v),
        )
    count = v.get("InitialInstanceCount")
    if count is None:
        raise InvalidParameter(f"InitialInstanceCount is required for production variant {name}.")
    if model_name is None and "InstanceType" not in v:
        raise InvalidParameter(
            f"Production variant {name} names no model: a variant that hosts inference "
            "components needs an InstanceType."
        )
    return VariantSpec(
        name=name,
        model_name=model_name or "",
        instance_type=v.get("InstanceType", "ml.m5.large"),
        instance_count=int(count),
        weight=float(v.get("InitialVariantWeight", 1.0)),
        routing_strategy=_routing_strategy(v),
        managed_scaling=_managed_scaling(name, v, int(count)),
    )


def _managed_scaling(name: str, v: dict[str, Any], count: int) -> tuple[int, int] | None:
    """ManagedInstanceScaling, when ENABLED: (MinInstanceCount, MaxInstanceCount)."""
    c = v.get("ManagedInstanceScaling")
    if not c or c.get("Status", "DISABLED") != "ENABLED":
        return None
    if v.get("ModelName") is not None:
        raise InvalidParameter(
            f"Production variant {name}: ManagedInstanceScaling is for variants that host "
            "inference components (no ModelName)."
        )
    least, most = int(c.get("MinInstanceCount", 1)), int(c.get("MaxInstanceCount", count))
    if least > most or not least <= count <= most:
        raise InvalidParameter(
            f"Production variant {name}: ManagedInstanceScaling needs MinInstanceCount "
            f"({least}) <= InitialInstanceCount ({count}) <= MaxInstanceCount ({most})."
        )
    return least, most


def _serverless(name: str, v: dict[str, Any]) -> ServerlessConfig:
    """ServerlessConfig, checked as SageMaker checks it."""
    for field in ("InstanceType", "InitialInstanceCount"):
        if field in v:
            raise InvalidParameter(
                f"Production variant {name} has a ServerlessConfig, so it cannot also "
                f"specify {field}."
            )
    c = v["ServerlessConfig"]
    memory, concurrency = int(c["MemorySizeInMB"]), int(c["MaxConcurrency"])
    if memory not in _SERVERLESS_MEMORY:
        raise InvalidParameter(
            f"ServerlessConfig.MemorySizeInMB of production variant {name} is {memory}; it "
            f"must be one of {', '.join(map(str, _SERVERLESS_MEMORY))}."
        )
    if not 1 <= concurrency <= 200:
        raise InvalidParameter(
            f"ServerlessConfig.MaxConcurrency of production variant {name} is {concurrency}; "
            "it must be from 1 to 200."
        )
    provisioned = c.get("ProvisionedConcurrency")
    if provisioned is not None and not 1 <= int(provisioned) <= concurrency:
        raise InvalidParameter(
            f"ServerlessConfig.ProvisionedConcurrency of production variant {name} is "
            f"{provisioned}; it must be from 1 to MaxConcurrency ({concurrency})."
        )
    return ServerlessConfig(
        memory_mb=memory,
        max_concurrency=concurrency,
        provisioned_concurrency=None if provisioned is None else int(provisioned),
    )


_SERVERLESS_MEMORY = (1024, 2048, 3072, 4096, 5120, 6144)


def _routing_strategy(v: dict[str, Any]) -> RoutingStrategy:
    strategy = (v.get("RoutingConfig") or {}).get("RoutingStrategy", RoutingStrategy.RANDOM)
    try:
        return RoutingStrategy(strategy)
    except ValueError:
        supported = " or ".join(RoutingStrategy)
        raise InvalidParameter(
            f"RoutingStrategy {strategy} is not supported by this gateway; use {supported}."
        ) from None


def describe_endpoint_config(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    config = svc.describe_endpoint_config(p["EndpointConfigName"])
    out: dict[str, Any] = {
        "EndpointConfigName": config.name,
        "EndpointConfigArn": config.arn,
        "ProductionVariants": _echo(config.production_variants, config.raw["ProductionVariants"]),
        "CreationTime": config.created,
    }
    if config.shadow_variants:
        out["ShadowProductionVariants"] = _echo(
            config.shadow_variants, config.raw["ShadowProductionVariants"]
        )
    for key in ("DataCaptureConfig", "KmsKeyId", "AsyncInferenceConfig", "ExecutionRoleArn"):
        if key in config.raw:
            out[key] = config.raw[key]
    return out


def _echo(specs: tuple[VariantSpec, ...], raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "InitialVariantWeight": spec.weight} for spec, r in zip(specs, raw, strict=True)]


def list_endpoint_configs(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    items, token = page(
        svc.list_endpoint_configs(),
        p,
        kind="EndpointConfigs",
        name=lambda c: c.name,
        created=lambda c: c.created,
        sort_keys={"Name": lambda c: c.name, "CreationTime": lambda c: c.created},
    )
    out: dict[str, Any] = {"EndpointConfigs": [_summary(c) for c in items]}
    if token:
        out["NextToken"] = token
    return out


def delete_endpoint_config(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete_endpoint_config(p["EndpointConfigName"])
    return {}


def _summary(c: EndpointConfig) -> dict[str, Any]:
    return {
        "EndpointConfigName": c.name,
        "EndpointConfigArn": c.arn,
        "CreationTime": c.created,
    }


ACTIONS = {
    "CreateEndpointConfig": create_endpoint_config,
    "DescribeEndpointConfig": describe_endpoint_config,
    "ListEndpointConfigs": list_endpoint_configs,
    "DeleteEndpointConfig": delete_endpoint_config,
}
