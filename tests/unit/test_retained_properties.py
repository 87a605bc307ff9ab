"""What UpdateEndpoint with RetainAllVariantProperties keeps of each variant
(control/endpoints.py ``_retained``, control/deployments.py ``retain``)."""

from __future__ import annotations

from datetime import UTC, datetime

from shipyard.control.deployments import retain
from shipyard.control.endpoints import _retained
from shipyard.records import (
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    RoutingStrategy,
    ServerlessConfig,
    VariantSpec,
    VariantState,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _endpoint(*states: VariantState) -> Endpoint:
    return Endpoint("e", "arn:e", "old", EndpointStatus.IN_SERVICE, None, NOW, NOW, states)


def _config(*variants: VariantSpec) -> EndpointConfig:
    return EndpointConfig("new", "arn:new", variants, NOW)


def _variant(name: str, count: int, weight: float = 1.0, **kw: object) -> VariantSpec:
    return VariantSpec(name, "m", "ml.m5.large", count, weight, RoutingStrategy.RANDOM, **kw)  # type: ignore[arg-type]


def test_a_scaled_variant_keeps_its_count_and_weight_and_a_new_one_takes_the_configs() -> None:
    endpoint = _endpoint(VariantState("a", 0.5, 4))
    config = _config(_variant("a", 1), _variant("b", 2, 3.0))
    kept = retain(config, _retained(endpoint, set(), config, ()))
    assert [(v.name, v.instance_count, v.weight) for v in kept.variants] == [
        ("a", 4, 0.5),
        ("b", 2, 3.0),
    ]
    only_weight = retain(config, _retained(endpoint, set(), config, ["DesiredInstanceCount"]))
    assert (only_weight.variants[0].instance_count, only_weight.variants[0].weight) == (1, 0.5)


def test_a_variant_serverless_before_or_after_keeps_no_instance_count() -> None:
    """A serverless variant's count is 0: kept, an instance variant would have none."""
    endpoint = _endpoint(VariantState("a", 1.0, 0))
    to_instances = _config(_variant("a", 2))
    kept = retain(to_instances, _retained(endpoint, {"a"}, to_instances, ()))
    assert kept.variants[0].instance_count == 2
    serverless = ServerlessConfig(memory_mb=1024, max_concurrency=4)
    to_serverless = _config(_variant("a", 0, serverless=serverless))
    scaled = _endpoint(VariantState("a", 1.0, 3))
    kept = retain(to_serverless, _retained(scaled, set(), to_serverless, ()))
    assert kept.variants[0].instance_count == 0
