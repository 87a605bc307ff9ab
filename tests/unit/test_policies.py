"""Routing policies and the weighted variant split, over plain Instance objects."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from shipyard.errors import ModelNotReady, RuntimeValidationError, ServiceUnavailable
from shipyard.http.client import Response, in_task
from shipyard.metrics import Metrics
from shipyard.records import RoutingStrategy
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests, Random, policy_for
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.conftest import wait_until_async


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
        # One instance alone: taken when it can, refused when sick or full.
        assert policy.choose([ok]) is ok
        assert policy.choose([sick]) is None
        assert policy.choose([full]) is None


def test_random_spreads_evenly() -> None:
    instances = _instances(0, 0, 0, 0)
    policy = Random(max_in_flight=1, rng=random.Random(1))
    picks = Counter(policy.choose(instances).instance_id for _ in range(4000))  # type: ignore[union-attr]
    assert all(800 < n < 1200 for n in picks.values())


def test_least_outstanding_pipelines_one_more_request_to_fast_instances() -> None:
    fast, slow = _instances(1, 1)
    for inst, latency in ((fast, 0.0002), (slow, 0.3)):
        inst.concurrency = 1
        inst.service_s = latency
    policy = LeastOutstandingRequests(max_in_flight=8)
    assert policy.choose([slow, fast]) is fast
    fast.in_flight = 2
    assert policy.choose([slow, fast]) is None
    fast.observe(1.0)  # the averages move 1/8 of the way
    assert fast.latency_s == pytest.approx(1.0 / 8)
    assert fast.service_s == pytest.approx(0.0002 + (1.0 - 0.0002) / 8)


def test_no_request_is_pipelined_behind_a_streamed_answer() -> None:
    """A streamed answer may last long, and its time is in no average."""
    (fast,) = _instances(1)
    fast.concurrency = 1
    fast.service_s = 0.0002
    fast.streams = 1
    policy = LeastOutstandingRequests(max_in_flight=8)
    assert policy.choose([fast]) is None
    fast.streams = 0
    assert policy.choose([fast]) is fast


def test_a_queue_at_the_instance_does_not_count_as_a_slow_model() -> None:
    """An answer that waited behind another on the instance took twice the model's time:
    its service time is half its latency, so pipelining goes on for a fast model."""
    (fast,) = _instances(0)
    fast.concurrency = 1
    for _ in range(64):
        fast.observe(0.0016, ahead=1)  # 1.6 ms of latency, one request ahead of it
    assert fast.latency_s == pytest.approx(0.0016, rel=0.01)
    assert fast.service_s == pytest.approx(0.0008, rel=0.01)
    fast.in_flight = 1
    assert LeastOutstandingRequests(max_in_flight=8).choose([fast]) is fast


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
    router.publish(route)
    with pytest.raises(ModelNotReady):
        asyncio.run(router.invoke(route, route.variants[0], Call([], b"{}")))
    full = _route(1.0, instances=_instances(4))
    router.publish(full)
    with pytest.raises(ServiceUnavailable):
        asyncio.run(router.invoke(full, full.variants[0], Call([], b"{}")))


class FakePool:
    """Stands in for an instance's connection pool: each request waits for a release."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.gates: list[asyncio.Future[None]] = []

    async def request(self, *args: object, **kwargs: object) -> Response:
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        self.log.append(self.name)
        return Response(200, [], self.name.encode())

    def finish_one(self) -> None:
        next(g for g in self.gates if not g.done()).set_result(None)

    def start(self, *args: Any, **kwargs: Any) -> Callable[[], None]:
        """As ConnectionPool.start: ``request``'s outcome told to its callback."""
        on_answer = args[5]
        return in_task(self.request(*args[:4]), on_answer)

    def close(self) -> None:
        pass


def _held(instance: Instance) -> int:
    """Requests that reached ``instance`` and are not answered yet."""
    pool: FakePool = instance.pool  # type: ignore[assignment]
    return sum(not gate.done() for gate in pool.gates)


def _lor_route(n: int, log: list[str], *, max_in_flight: int = 4) -> EndpointRoute:
    instances = _instances(*([0] * n))
    for inst in instances:
        inst.concurrency = 1
        inst.service_s = 0.3  # a slow model: no pipelining
        inst.pool = FakePool(inst.instance_id, log)  # type: ignore[assignment]
    variant = VariantRoute(
        "v",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=max_in_flight),
        instances=instances,
        metrics=Metrics().for_variant("e", "v"),
    )
    return EndpointRoute("e", [variant])


def test_least_outstanding_holds_requests_at_the_gateway_until_an_instance_is_free() -> None:
    """Two single-request instances, five requests: two are sent, three wait in FIFO order
    and each goes to whichever instance answers first, never behind a busy one."""

    async def main() -> None:
        log: list[str] = []
        router = Router(timeout_s=5)
        route = _lor_route(2, log)
        router.publish(route)
        variant = route.variants[0]
        a, b = variant.instances
        tasks = []
        for i in range(5):
            tasks.append(
                asyncio.create_task(router.invoke(route, variant, Call([], str(i).encode())))
            )
            placed = i + 1  # sent or queued before the next one arrives: FIFO order is known
            await wait_until_async(
                lambda: _held(a) + _held(b) + len(variant.waiters) == placed,  # noqa: B023
                f"request {i} sent or queued",
            )
        assert (a.in_flight, b.in_flight, len(variant.waiters)) == (1, 1, 3)
        for answered in range(1, 5):  # instance i-1 keeps answering; i-0 stays busy throughout
            b.pool.finish_one()  # type: ignore[attr-defined]
            # The answer is in, and the next queued request (if any) has reached i-1.
            next_on_b = 1 if answered < 4 else 0
            await wait_until_async(
                lambda: len(log) == answered and _held(b) == next_on_b,  # noqa: B023
                f"answer {answered} from i-1",
            )
        assert a.in_flight == 1 and len(variant.waiters) == 0
        assert log == ["i-1", "i-1", "i-1", "i-1"]
        a.pool.finish_one()  # type: ignore[attr-defined]
        results = await asyncio.gather(*tasks)
        assert sorted(r.body for r, _ in results) == [b"i-0"] + [b"i-1"] * 4

    asyncio.run(main())


def test_the_gateway_queue_is_bounded_and_then_answers_503() -> None:
    async def main() -> None:
        router = Router(timeout_s=5)
        route = _lor_route(1, [], max_in_flight=2)  # queue limit: 2 per instance
        router.publish(route)
        variant = route.variants[0]
        tasks = [
            asyncio.create_task(router.invoke(route, variant, Call([], b"x"))) for _ in range(3)
        ]
        [instance] = variant.instances
        await wait_until_async(
            lambda: _held(instance) == 1 and len(variant.waiters) == 2, "one sent, two queued"
        )
        with pytest.raises(ServiceUnavailable):
            await router.invoke(route, variant, Call([], b"x"))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert not variant.waiters

    asyncio.run(main())


def test_a_request_waiting_past_the_timeout_is_the_gateways_overload() -> None:
    """It never reached the model: a 503 boto3 retries, not the model's ModelError."""

    async def main() -> None:
        router = Router(timeout_s=0.05)
        route = _lor_route(1, [])
        router.publish(route)
        variant = route.variants[0]
        busy = asyncio.create_task(router.invoke(route, variant, Call([], b"x")))
        [instance] = variant.instances
        await wait_until_async(lambda: _held(instance) == 1, "the first request on the instance")
        with pytest.raises(ServiceUnavailable, match="was free to take the request"):
            await router.invoke(route, variant, Call([], b"y"))
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)

    asyncio.run(main())


def _republished(
    route: EndpointRoute, *, extra: Sequence[Instance] = (), coming: int = 0
) -> EndpointRoute:
    """The next table of ``route``'s endpoint: the same instances plus ``extra``."""
    [variant] = route.variants
    return EndpointRoute(
        route.name,
        [
            VariantRoute(
                variant.name,
                weight=1.0,
                policy=variant.policy,
                instances=[*variant.instances, *extra],
                metrics=variant.metrics,
                coming=coming,
            )
        ],
    )


def test_an_answer_after_a_table_swap_gives_the_turn_to_the_requests_waiting_in_the_new_table() -> (
    None
):
    """Requests queued when a table is swapped move to the new table's queue; an answer from
    a request taken on the old table must wake them there, or they sleep beside an idle
    instance until their timeout."""

    async def main() -> None:
        log: list[str] = []
        router = Router(timeout_s=5)
        route = _lor_route(1, log)
        router.publish(route)
        [instance] = route.variants[0].instances
        tasks = [
            asyncio.create_task(router.invoke(route, route.variants[0], Call([], b"x")))
            for _ in range(3)
        ]
        await wait_until_async(
            lambda: _held(instance) == 1 and len(route.variants[0].waiters) == 2,
            "one sent, two queued",
        )
        swapped = _republished(route)
        router.publish(swapped)
        await wait_until_async(lambda: len(swapped.variants[0].waiters) == 2, "queued anew")
        for answered in range(1, 4):
            instance.pool.finish_one()  # type: ignore[attr-defined]
            await wait_until_async(lambda: len(log) == answered, f"answer {answered}")  # noqa: B023
        results = await asyncio.gather(*tasks)
        assert [r.status for r, _ in results] == [200, 200, 200]

    asyncio.run(main())


def test_requests_wait_for_instances_being_started_instead_of_503() -> None:
    """RANDOM holds nothing at the gateway, except while more instances are starting: a
    request that finds every instance full then waits and goes to the new one."""

    async def main() -> None:
        log: list[str] = []
        router = Router(timeout_s=5)
        first, second = _instances(0, 0)
        for inst in (first, second):
            inst.pool = FakePool(inst.instance_id, log)  # type: ignore[assignment]
        full = EndpointRoute(
            "e",
            [
                VariantRoute(
                    "v",
                    weight=1.0,
                    policy=Random(max_in_flight=1),
                    instances=[first],
                    metrics=Metrics().for_variant("e", "v"),
                )
            ],
        )
        router.publish(full)
        busy = asyncio.create_task(router.invoke(full, full.variants[0], Call([], b"x")))
        await wait_until_async(lambda: _held(first) == 1, "the first instance is full")
        with pytest.raises(ServiceUnavailable):
            await router.invoke(full, full.variants[0], Call([], b"x"))

        scaling = _republished(full, coming=1)
        router.publish(scaling)
        waiting = asyncio.create_task(router.invoke(scaling, scaling.variants[0], Call([], b"y")))
        await wait_until_async(lambda: len(scaling.variants[0].waiters) == 1, "it waits")

        scaled = _republished(scaling, extra=[second])
        router.publish(scaled)
        await wait_until_async(lambda: _held(second) == 1, "sent to the new instance")
        second.pool.finish_one()  # type: ignore[attr-defined]
        first.pool.finish_one()  # type: ignore[attr-defined]
        (answer, _), (other, _) = await asyncio.gather(waiting, busy)
        assert (answer.body, other.body) == (b"i-1", b"i-0")

    asyncio.run(main())
