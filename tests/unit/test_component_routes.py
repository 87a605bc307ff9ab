"""Routes of inference components: found by name, never by weight, and followed across
table swaps by their component, not by the variant that hosts them."""

from __future__ import annotations

import asyncio

import pytest

from shipyard.errors import RuntimeValidationError, ServiceUnavailable
from shipyard.metrics import Metrics
from shipyard.routing.instance import Instance
from shipyard.routing.invocation import Invocations
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute

METRICS = Metrics()


def _copies(component: str, n: int) -> VariantRoute:
    return VariantRoute(
        "AllTraffic",
        weight=0.0,
        policy=LeastOutstandingRequests(max_in_flight=1),
        instances=[
            Instance(f"{component}-{i}", "AllTraffic", f"http://127.0.0.1:{9100 + i}")
            for i in range(n)
        ],
        metrics=METRICS.for_variant("e", component),
        component=component,
    )


def _table(**components: int) -> EndpointRoute:
    host = VariantRoute(
        "AllTraffic",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=1),
        instances=[],
        metrics=METRICS.for_variant("e", "AllTraffic"),
    )
    return EndpointRoute(
        "e", [host], components=[_copies(name, n) for name, n in components.items()]
    )


def test_a_component_is_found_by_its_name_with_sagemakers_errors_otherwise() -> None:
    route = _table(a=1, b=2)
    assert Invocations.component(route, "b").instances[1].instance_id == "b-1"
    with pytest.raises(RuntimeValidationError, match="Inference Component Name header is required"):
        Invocations.component(route, None)
    with pytest.raises(RuntimeValidationError, match="Inference Component zz does not exist"):
        Invocations.component(route, "zz")
    plain = EndpointRoute("p", [_copies("x", 1)])
    with pytest.raises(RuntimeValidationError, match="not allowed for endpoints"):
        Invocations.component(plain, "x")


def test_a_swap_keeps_a_request_with_its_component() -> None:
    router = Router(timeout_s=5)
    old = _table(a=1, b=1)
    router.publish(old)
    new = _table(a=2, b=1)
    router.publish(new)
    assert router.current(old, old.components["a"]) is new.components["a"]
    router.publish(_table(b=1))
    with pytest.raises(ServiceUnavailable, match="Inference component a of e is gone"):
        router.current(new, new.components["a"])


def test_requests_waiting_for_a_component_move_to_its_next_table() -> None:
    async def scenario() -> None:
        router = Router(timeout_s=5)
        old = _table(a=1)
        router.publish(old)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        old.components["a"].waiters.append(waiter)
        new = _table(a=1)
        router.publish(new)
        # Moved, then given a turn: the new table may have room.
        assert waiter.done()
        assert not old.components["a"].waiters

    asyncio.run(scenario())
