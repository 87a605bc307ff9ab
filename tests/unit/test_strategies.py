"""The router follows the strategies a variant gives it (routing/strategies.py): a new
kind of variant is a new Dispatch or Admission, with no change to the router."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from shipyard.errors import ModelNotReady, Throttling
from shipyard.http.client import OnAnswer, Response, in_task
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.policies import Random
from shipyard.routing.router import Router
from shipyard.routing.strategies import UNLIMITED, OneModel
from shipyard.routing.table import EndpointRoute, VariantRoute


class Sticky:
    """Dispatch that sends a call to the instance its first header names, answers in
    place of the instance, and asks once for another instance on a 507."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.unreached: list[str] = []

    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        wanted = call.headers[0][1].decode()
        return next((i for i in instances if i.instance_id == wanted and i.healthy), None)

    def send(
        self, instance: Instance, call: Call, max_body: int | None, on_answer: OnAnswer
    ) -> Callable[[], None]:
        self.sent.append(instance.instance_id)

        async def answer() -> Response:
            status = 507 if call.body == b"too big" and len(self.sent) == 1 else 200
            return Response(status, [], instance.instance_id.encode())

        return in_task(answer(), on_answer)

    def learn(self, instance: Instance, call: Call, response: Response) -> bool:
        if response.status == 507:
            call.headers[0] = (b"x-to", b"i-1")
            return True
        return False

    def unreachable(self, instance: Instance, call: Call) -> None:
        self.unreached.append(instance.instance_id)


class AtMostOne:
    """Admission of one request at a time; counts what it is asked."""

    starts_instances = False

    def __init__(self) -> None:
        self.active = 0
        self.waits = 0

    def admit(self) -> None:
        if self.active:
            raise Throttling("one at a time")
        self.active += 1

    def leave(self) -> None:
        self.active -= 1

    def waiting(self, variant: VariantRoute) -> None:
        self.waits += 1


def _route(n: int = 2) -> tuple[Router, EndpointRoute, VariantRoute]:
    instances = [Instance(f"i-{i}", "v", f"http://127.0.0.1:{9000 + i}") for i in range(n)]
    variant = VariantRoute(
        "v",
        weight=1.0,
        policy=Random(max_in_flight=4),
        instances=instances,
        metrics=Metrics().for_variant("e", "v"),
    )
    router = Router(timeout_s=0.2)
    route = EndpointRoute("e", [variant])
    router.publish(route)
    return router, route, variant


def test_a_variant_without_strategies_of_its_own_serves_one_model_without_limit() -> None:
    _, _, variant = _route()
    assert isinstance(variant.dispatch, OneModel) and variant.dispatch.policy is variant.policy
    assert variant.admission is UNLIMITED


def test_the_router_places_admits_and_retries_by_the_variants_strategies() -> None:
    router, route, variant = _route()
    sticky, one = Sticky(), AtMostOne()
    variant.dispatch, variant.admission = sticky, one

    async def scenario() -> None:
        answer, _ = await router.invoke(route, variant, Call([(b"x-to", b"i-1")], b"x"))
        assert answer.body == b"i-1" and sticky.sent == ["i-1"]
        sticky.sent.clear()
        # Refused by i-0 (507): the strategy asks for another, and the router tries i-1.
        answer, _ = await router.invoke(route, variant, Call([(b"x-to", b"i-0")], b"too big"))
        assert answer.body == b"i-1" and sticky.sent == ["i-0", "i-1"]
        assert one.active == 0 and all(i.in_flight == 0 for i in variant.instances)
        # Admission refuses a second request while one is in.
        one.active = 1
        with pytest.raises(Throttling):
            await router.invoke(route, variant, Call([(b"x-to", b"i-0")], b"x"))
        one.active = 0
        # No instance the strategy would take is healthy: not ready, and never sent.
        for instance in variant.instances:
            instance.healthy = False
        with pytest.raises(ModelNotReady):
            await router.invoke(route, variant, Call([(b"x-to", b"i-0")], b"x"))
        assert one.active == 0

    asyncio.run(scenario())
