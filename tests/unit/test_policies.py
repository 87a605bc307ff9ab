"""Routing policies and the weighted variant split, over plain Instance objects."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from shipyard.errors import ModelNotReady, RuntimeValidationError, ServiceUnavailable
from shipyard.metrics import Metrics
from shipyard.records import RoutingStrategy
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests, Random, policy_for
from shipyard.routing.router import EndpointRoute, Router, VariantRoute


def _instances(*in_flight: int) -> list[Instance]:
    out = []
    for i, n in enumerate(in_flight):
        inst = Instance(f"i-{i}", "v", f"http://127.0.0.1:{9000 + i}")
        inst.in_flight = n
        out.append(inst)
    return out


def test_least_outstanding_picks_the_idle_instance() -> None:
    busy, idle, busier = _instances(3, 0, 5)
    assert LeastOutstandingRequests(max_in_flight=10).choose([busy, idle, busier]) is idle


def test_least_outstanding_breaks_ties_at_random() -> None:
    a, b, c = _instances(1, 1, 4)
    policy = LeastOutstandingRequests(max_in_flight=10, rng=random.Random(7))
    picks = Counter(policy.choose([a, b, c]).instance_id for _ in range(400))  # type: ignore[union-attr]
    assert set(picks) == {"i-0", "i-1"} and min(picks.values()) > 120


def test_policies_skip_unhealthy_and_full_instances() -> None:
    sick, full, ok = _instances(0, 2, 1)
    sick.healthy = False
    for policy in (LeastOutstandingRequests(max_in_flight=2), Random(max_in_flight=2)):
        assert all(policy.choose([sick, full, ok]) is ok for _ in range(20))
        assert policy.choose([sick, full]) is None
        assert policy.choose([]) is None


def test_random_spreads_evenly() -> None:
    instances = _instances(0, 0, 0, 0)
    policy = Random(max_in_flight=1, rng=random.Random(1))
    picks = Counter(policy.choose(instances).instance_id for _ in range(4000))  # type: ignore[union-attr]
    assert all(800 < n < 1200 for n in picks.values())


def test_policy_for_maps_routing_strategies() -> None:
    assert isinstance(policy_for(RoutingStrategy.RANDOM, max_in_flight=1), Random)
    lor = policy_for(RoutingStrategy.LEAST_OUTSTANDING_REQUESTS, max_in_flight=1)
    assert isinstance(lor, LeastOutstandingRequests)


def _route(*weights: float, instances: list[Instance] | None = None) -> EndpointRoute:
    metrics = Metrics()
    variants = [
        VariantRoute(
            f"v{i}",
            weight=w,
            policy=Random(max_in_flight=4),
            instances=instances if instances is not None else _instances(0),
            metrics=metrics.for_variant("e", f"v{i}"),
        )
        for i, w in enumerate(weights)
    ]
    return EndpointRoute("e", variants)


def test_variant_weights_split_traffic() -> None:
    route = _route(3.0, 1.0, 0.0)
    rng = random.Random(3)
    picks = Counter(route.pick_variant(rng).name for _ in range(8000))
    assert picks["v2"] == 0
    assert 0.72 < picks["v0"] / 8000 < 0.78


def test_all_zero_weights_split_evenly() -> None:
    route = _route(0.0, 0.0)
    rng = random.Random(5)
    picks = Counter(route.pick_variant(rng).name for _ in range(2000))
    assert 900 < picks["v0"] < 1100


def test_target_variant_overrides_and_unknown_variant_is_a_validation_error() -> None:
    router = Router(timeout_s=1)
    route = _route(1.0, 0.0)
    assert router.variant_for(route, "v1").name == "v1"
    with pytest.raises(RuntimeValidationError, match="nope"):
        router.variant_for(route, "nope")


def test_no_ready_instance_is_429_and_all_full_is_503() -> None:
    router = Router(timeout_s=1)
    sick = _instances(0)
    sick[0].healthy = False
    route = _route(1.0, instances=sick)
    with pytest.raises(ModelNotReady):
        asyncio.run(router.invoke(route, route.variants[0], [], b"{}"))
    full = _route(1.0, instances=_instances(4))
    with pytest.raises(ServiceUnavailable):
        asyncio.run(router.invoke(full, full.variants[0], [], b"{}"))
