"""Routes of inference components: found by name, never by weight, and followed across
table swaps by their component, not by the variant that hosts them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from shipyard.backends.base import InstanceSpec
from shipyard.control.publishing import RoutePublisher
from shipyard.errors import RuntimeValidationError, ServiceUnavailable
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import AdapterOf, ComponentCopies, Fleet, Slot
from shipyard.records import EndpointConfig, RoutingStrategy, VariantSpec
from shipyard.routing.call import Call
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


class _Waiting:
    """A request in a queue that only records its turn."""

    turned = False
    rank = 0

    def done(self) -> bool:
        return self.turned

    def turn(self) -> None:
        self.turned = True


def test_requests_waiting_for_a_component_move_to_its_next_table() -> None:
    async def scenario() -> None:
        router = Router(timeout_s=5)
        old = _table(a=1)
        router.publish(old)
        waiter = _Waiting()
        old.components["a"].waiters.join(waiter)
        new = _table(a=1)
        router.publish(new)
        # Moved, then given a turn: the new table may have room.
        assert waiter.turned
        assert not old.components["a"].waiters

    asyncio.run(scenario())


def test_an_adapter_and_its_base_wait_in_one_queue_for_their_shared_copies() -> None:
    """A copy freed by a request of the base serves a request of its adapter waiting
    (and the reverse): they share the copies, so they share the queue."""

    async def scenario() -> None:
        router = Router(timeout_s=5)
        publisher = RoutePublisher(
            router=router, metrics=Metrics(), max_in_flight=1, model_routing="lru"
        )
        variant = VariantSpec(
            "AllTraffic", "", "ml.m5.large", 1, 1.0, RoutingStrategy.LEAST_OUTSTANDING_REQUESTS
        )
        config = EndpointConfig("e", "arn:e", (variant,), datetime.now(UTC))
        copy = Instance("e-base-1", "base", "http://127.0.0.1:9")
        slot = Slot(spec=InstanceSpec("e-base-1", ""), variant="base", instance=copy)
        fleet = Fleet(
            endpoint="e",
            config=config,
            slots={"AllTraffic": [], "base": [slot]},
            weights={"AllTraffic": 1.0},
            components={"base": ComponentCopies("AllTraffic", 1, token="t")},
            adapters={"ten": AdapterOf("base", "file:///ten", 1)},
        )
        publisher.publish(fleet)
        route = router.routes["e"]
        base, adapter = route.components["base"], route.components["ten"]
        assert adapter.waiters is base.waiters
        assert adapter.instances == [copy]
        held = await router.acquire(route, base, Call([], b""))  # the copy is busy
        waiting = asyncio.create_task(router.acquire(route, adapter, Call([], b"")))
        await asyncio.sleep(0)
        assert not waiting.done()
        held.close()
        assert (await asyncio.wait_for(waiting, 1)).instance is copy

    asyncio.run(scenario())
