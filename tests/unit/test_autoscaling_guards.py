"""The autoscaler's guards (DESIGN 3.1): PutScalingPolicy refuses a TargetValue or step
adjustments Application Auto Scaling refuses, one target that cannot be evaluated never
stops the others in the same pass, and a real-time variant never scales below one
instance whatever MinCapacity it kept from an asynchronous config.

The autoscaler and the service run on small fakes of their published seams (the scaling
store, the endpoint service and the metric reader): what is tested is their arithmetic
and their order, not the store."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from shipyard.autoscaling.autoscaler import Autoscaler, MetricReader
from shipyard.autoscaling.scaling import STEP_SCALING, TARGET_TRACKING, ScalingService, check_steps
from shipyard.errors import InvalidParameter, ResourceNotFound
from shipyard.metrics import Metrics
from shipyard.records import (
    AsyncConfig,
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    RoutingStrategy,
    ScalableTarget,
    ScalingPolicy,
    VariantSpec,
    VariantState,
)
from shipyard.routing.router import Router

WHEN = datetime(2024, 1, 1, tzinfo=UTC)
PER_INSTANCE = {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}


def rid(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/v1"


def target(endpoint: str, low: int = 1, high: int = 4) -> ScalableTarget:
    return ScalableTarget(
        resource_id=rid(endpoint), endpoint=endpoint, variant="v1", arn=f"arn:{endpoint}",
        min_capacity=low, max_capacity=high, role_arn="role", created=WHEN,
    )  # fmt: skip


def tracking(endpoint: str, goal: float) -> ScalingPolicy:
    config = {"TargetValue": goal, "PredefinedMetricSpecification": PER_INSTANCE,
              "ScaleInCooldown": 0, "ScaleOutCooldown": 0}  # fmt: skip
    return ScalingPolicy("p", rid(endpoint), f"arn:p:{endpoint}", TARGET_TRACKING, config, WHEN)


class FakeScalingStore:
    def __init__(self, targets: list[ScalableTarget], policies: list[ScalingPolicy]) -> None:
        self.targets = {t.resource_id: t for t in targets}
        self.policies = policies

    def list_targets(self) -> list[ScalableTarget]:
        return list(self.targets.values())

    def get_target(self, resource: str) -> ScalableTarget | None:
        return self.targets.get(resource)

    def list_policies(self, resource: str | None = None) -> list[ScalingPolicy]:
        return [p for p in self.policies if resource in (None, p.resource_id)]

    def put_policy(self, policy: ScalingPolicy) -> ScalingPolicy:
        self.policies.append(policy)
        return policy


class FakeMetadata:
    def __init__(self, counts: dict[str, int], asynchronous: set[str]) -> None:
        self.endpoints = {
            name: Endpoint(name=name, arn=f"arn:{name}", config_name=name,
                           status=EndpointStatus.IN_SERVICE, failure_reason=None, created=WHEN,
                           modified=WHEN, variants=(VariantState("v1", 1.0, count),))
            for name, count in counts.items()
        }  # fmt: skip
        self.asynchronous = asynchronous

    def list_endpoints(self) -> list[Endpoint]:
        return list(self.endpoints.values())

    def get_endpoint(self, name: str) -> Endpoint:
        if name not in self.endpoints:
            raise ResourceNotFound(f"Could not find endpoint {name}.")
        return self.endpoints[name]

    def get_endpoint_config(self, name: str) -> EndpointConfig:
        variant = VariantSpec("v1", "m", "ml.m5.large", 1, 1.0, RoutingStrategy.RANDOM)
        queue = AsyncConfig("file:///out", "file:///failed")
        return EndpointConfig(
            name=name, arn=f"arn:{name}", variants=(variant,), created=WHEN,
            async_config=queue if name in self.asynchronous else None,
        )  # fmt: skip


class FakeEndpoints:
    """The endpoint service's seam the autoscaler steps through: the steps it was asked."""

    def __init__(self, counts: dict[str, int], asynchronous: frozenset[str] = frozenset()) -> None:
        self.store = FakeMetadata(counts, set(asynchronous))
        self.steps: dict[str, int] = {}
        self.max_instances_per_variant = 10

    def update_weights_and_capacities(
        self, name: str, changes: dict[str, tuple[float | None, int | None]], *, also: Any
    ) -> None:
        ((_, count),) = changes.values()
        assert count is not None
        self.steps[name] = count


class FixedReader(MetricReader):
    """Each endpoint's metric value as given; an exception given is raised."""

    def __init__(self, values: dict[str, float | Exception]) -> None:
        super().__init__(
            metrics=Metrics(), router=Router(timeout_s=5.0), healthy=lambda endpoint: {"v1": 1},
            backlogs={}, window_s=60.0, period_s=5.0,
        )  # fmt: skip
        self.values = values

    def value(self, metric: str, endpoint: str, variant: str) -> float | None:
        found = self.values.get(endpoint)
        if isinstance(found, Exception):
            raise found
        return found


def autoscaler(
    targets: list[ScalableTarget],
    policies: list[ScalingPolicy],
    endpoints: FakeEndpoints,
    values: dict[str, float | Exception],
) -> Autoscaler:
    return Autoscaler(
        store=FakeScalingStore(targets, policies),  # type: ignore[arg-type]
        endpoints=endpoints,  # type: ignore[arg-type]
        reader=FixedReader(values),
        period_s=5.0,
    )


def service(targets: list[ScalableTarget]) -> ScalingService:
    return ScalingService(
        store=FakeScalingStore(targets, []),  # type: ignore[arg-type]
        endpoints=FakeEndpoints({t.endpoint: 1 for t in targets}),  # type: ignore[arg-type]
        wake=lambda: None,
        region="us-east-1",
        account_id="123456789012",
    )


# -- TargetValue -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "goal", [5e-324, 1e-200, 2.0**-361, 1e300, 2.0**361, float("inf"), float("nan")]
)
def test_a_target_value_whose_use_cannot_be_computed_is_refused(goal: float) -> None:
    scaling = service([target("a")])
    config = {"TargetValue": goal, "PredefinedMetricSpecification": PER_INSTANCE}
    with pytest.raises(InvalidParameter, match="TargetValue"):
        scaling.put_policy("p", rid("a"), TARGET_TRACKING, config)


@pytest.mark.parametrize("goal", [2.0**-360, 1e-6, 0.5, 1000.0, 2.0**360])
def test_a_target_value_within_application_auto_scalings_range_is_taken(goal: float) -> None:
    scaling = service([target("a")])
    config = {"TargetValue": goal, "PredefinedMetricSpecification": PER_INSTANCE}
    assert scaling.put_policy("p", rid("a"), TARGET_TRACKING, config).config == config


def test_a_stored_policy_with_a_tiny_target_value_asks_for_nothing() -> None:
    """A policy stored before its TargetValue was checked: its quotient is infinite, so it
    asks for nothing, and the pass goes on to the next target."""
    endpoints = FakeEndpoints({"a": 1, "b": 1})
    scaler = autoscaler(
        [target("a"), target("b")],
        [tracking("a", 5e-324), tracking("b", 10.0)],
        endpoints,
        {"a": 100.0, "b": 30.0},
    )
    asyncio.run(scaler.evaluate())
    assert endpoints.steps == {"b": 3}


def test_one_target_that_fails_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoints = FakeEndpoints({"a": 1, "b": 1})
    scaler = autoscaler(
        [target("a"), target("b")],
        [tracking("a", 10.0), tracking("b", 10.0)],
        endpoints,
        {"a": RuntimeError("metric unreadable"), "b": 30.0},
    )
    with caplog.at_level(logging.ERROR, logger="shipyard.autoscaling.autoscaler"):
        asyncio.run(scaler.evaluate())
    assert endpoints.steps == {"b": 3}
    assert any(rid("a") in r.getMessage() for r in caplog.records)


# -- a real-time variant keeps one instance ---------------------------------------------


def test_a_real_time_variant_never_scales_below_one_whatever_its_min_capacity() -> None:
    """Registered with MinCapacity 0 while the endpoint was asynchronous, then moved to a
    real-time config by UpdateEndpoint: a policy asking for none leaves it at one, and a
    variant found at zero is brought back to one (even one whose MaxCapacity is 0)."""
    endpoints = FakeEndpoints({"idle": 1, "empty": 0, "capped": 1})
    scaler = autoscaler(
        [target("idle", low=0), target("empty", low=0), target("capped", low=0, high=0)],
        [tracking("idle", 10.0)],
        endpoints,
        {"idle": 0.0},
    )
    asyncio.run(scaler.evaluate())
    assert endpoints.steps == {"empty": 1}


def test_an_asynchronous_variant_still_scales_to_zero() -> None:
    endpoints = FakeEndpoints({"queue": 1}, asynchronous=frozenset({"queue"}))
    scaler = autoscaler([target("queue", low=0)], [tracking("queue", 10.0)], endpoints, {})
    scaler.reader.values = {"queue": 0.0}  # type: ignore[attr-defined]
    asyncio.run(scaler.evaluate())
    assert endpoints.steps == {"queue": 0}


def test_a_step_policy_keeps_a_real_time_variant_at_one() -> None:
    step = {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 0}
    config = {"AdjustmentType": "ExactCapacity", "Cooldown": 0, "StepAdjustments": [step]}
    policy = ScalingPolicy("s", rid("rt"), "arn:s", STEP_SCALING, config, WHEN)
    endpoints = FakeEndpoints({"rt": 2})
    scaler = autoscaler([target("rt", low=0)], [policy], endpoints, {})
    scaler.run_step_policy("arn:s", "alarm", "ALARM", 5.0, 1.0)
    assert endpoints.steps == {"rt": 1}


# -- step adjustments --------------------------------------------------------------------


def steps(*bounds: tuple[float | None, float | None]) -> dict[str, Any]:
    adjustments = []
    for low, high in bounds:
        step: dict[str, Any] = {"ScalingAdjustment": 1}
        if low is not None:
            step["MetricIntervalLowerBound"] = low
        if high is not None:
            step["MetricIntervalUpperBound"] = high
        adjustments.append(step)
    return {"AdjustmentType": "ChangeInCapacity", "StepAdjustments": adjustments}


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (steps((None, None)), "both"),
        (steps((0, 10), (10, None), (None, 0), (None, None)), "both"),
        (steps((0, 5), (6, None)), "gap"),
        (steps((None, -5), (0, None)), "gap"),
        (steps((0, 5), (4, None)), "overlap"),
        (steps((-10, 0), (0, None)), "null lower bound"),
        (steps((0, 10)), "null upper bound"),
        (steps((None, 0), (0, 10)), "null upper bound"),
    ],
)
def test_step_adjustments_application_auto_scaling_refuses_are_refused(
    config: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidParameter, match=words):
        check_steps(config)


@pytest.mark.parametrize(
    "config",
    [
        steps((0, None)),
        steps((None, 0)),
        steps((None, 0), (0, 10), (10, None)),
        steps((None, -5), (-5, 0)),
        steps((5, 10), (10, None)),
        steps((-10, -5), (None, -10)),
    ],
)
def test_step_adjustments_without_gap_or_open_end_are_taken(config: dict[str, Any]) -> None:
    check_steps(config)
