"""Router: variant by weight → policy → stream over pooled connections.

The router holds an in-memory routing table that the reconciler publishes; the data path
reads only that table, never the store.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from shipyard.errors import ModelError, ModelNotReady, RuntimeValidationError, ServiceUnavailable
from shipyard.metrics import VariantMetrics
from shipyard.records import AsyncConfig
from shipyard.routing.client import Response, UpstreamError
from shipyard.routing.instance import Instance
from shipyard.routing.policies import Policy

if TYPE_CHECKING:
    from shipyard.routing.multimodel import MultiModelRoute


class VariantRoute:
    """One production variant's instances, its weight and its policy.

    ``waiters`` is the variant's FIFO queue of requests held at the gateway until an
    instance can take them (policies with ``queues``); it is handed from one published
    table to the next, so a swap never strands a waiting request. ``multi_model`` is set
    when the variant serves a ``Mode: MultiModel`` model; its requests then go through
    routing.multimodel.invoke_model instead of Router.invoke.
    """

    __slots__ = (
        "name",
        "weight",
        "policy",
        "instances",
        "metrics",
        "waiters",
        "queue_limit",
        "multi_model",
    )

    def __init__(
        self,
        name: str,
        *,
        weight: float,
        policy: Policy,
        instances: Sequence[Instance],
        metrics: VariantMetrics,
        multi_model: MultiModelRoute | None = None,
    ) -> None:
        self.name = name
        self.weight = weight
        self.policy = policy
        self.instances = list(instances)
        self.metrics = metrics
        self.multi_model = multi_model
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.queue_limit = policy.max_in_flight * len(instances) if policy.queues else 0

    def __repr__(self) -> str:
        return f"VariantRoute({self.name!r}, weight={self.weight}, instances={self.instances})"

    def release(self) -> None:
        """An instance answered: give the oldest waiting request its turn."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


class EndpointRoute:
    """The routing table of one endpoint: its variants and their weights."""

    __slots__ = ("name", "variants", "by_name", "async_config", "_cumulative", "_total")

    def __init__(
        self,
        name: str,
        variants: Sequence[VariantRoute],
        *,
        async_config: AsyncConfig | None = None,
    ) -> None:
        self.name = name
        self.async_config = async_config
        """Set for an asynchronous endpoint, whose requests come from the queue."""
        self.variants = list(variants)
        self.by_name = {v.name: v for v in self.variants}
        weights = [max(v.weight, 0.0) for v in self.variants]
        if sum(weights) <= 0:
            weights = [1.0] * len(self.variants)  # all weights zero: split evenly
        self._cumulative = list(itertools.accumulate(weights))
        self._total = self._cumulative[-1] if self._cumulative else 0.0

    def __repr__(self) -> str:
        return f"EndpointRoute({self.name!r}, variants={[v.name for v in self.variants]})"

    def pick_variant(self, rng: random.Random) -> VariantRoute:
        if len(self.variants) == 1:
            return self.variants[0]
        return self.variants[bisect.bisect_right(self._cumulative, rng.random() * self._total)]

    def instances(self) -> list[Instance]:
        return [i for v in self.variants for i in v.instances]


class Router:
    """Sends each invocation to one instance of one variant and returns its response."""

    def __init__(self, *, timeout_s: float, rng: random.Random | None = None) -> None:
        self.timeout_s = timeout_s
        self.routes: dict[str, EndpointRoute] = {}
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"Router(endpoints={sorted(self.routes)})"

    def publish(self, route: EndpointRoute) -> EndpointRoute | None:
        """Swap in a new table for one endpoint; returns the one it replaced.

        Requests waiting in the old table's queues move to the new one and get a turn
        now: the new table may have more, or other, instances.
        """
        old = self.routes.get(route.name)
        self.routes[route.name] = route
        if old is not None:
            for variant in old.variants:
                successor = route.by_name.get(variant.name)
                if successor is not None and successor is not variant:
                    successor.waiters.extend(variant.waiters)
                    variant.waiters.clear()
                variant.wake_all()
            for variant in route.variants:
                variant.wake_all()
        return old

    def withdraw(self, name: str) -> EndpointRoute | None:
        old = self.routes.pop(name, None)
        if old is not None:
            for variant in old.variants:
                variant.wake_all()
        return old

    def variant_for(self, route: EndpointRoute, target: str | None) -> VariantRoute:
        if target is None:
            return route.pick_variant(self._rng)
        variant = route.by_name.get(target)
        if variant is None:
            raise RuntimeValidationError(
                f"Endpoint {route.name} does not have a production variant named {target}."
            )
        return variant

    async def invoke(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes],
        *,
        content_length: int | None = None,
    ) -> tuple[Response, float]:
        """Send one invocation; return the instance's response and the model latency (s).

        A connection that fails before the request could reach the instance is retried on
        another instance; once it may have reached one it is not, since invocations need
        not be idempotent.
        """
        tried: list[Instance] = []
        try:
            async with asyncio.timeout(self.timeout_s):
                turn = not variant.waiters  # first come, first served
                while True:
                    variant = self.current(route, variant)
                    instance = self._choose(variant, tried, turn=turn)
                    if instance is None:
                        # Woken but beaten to the instance: keep our place at the front.
                        await self._wait(variant, front=turn)
                        turn = True
                        continue
                    instance.in_flight += 1
                    started = time.perf_counter()
                    try:
                        response = await instance.pool.request(
                            b"POST", b"/invocations", headers, body, content_length=content_length
                        )
                        model_s = time.perf_counter() - started
                        instance.observe(model_s)
                        return response, model_s
                    except UpstreamError as exc:
                        if exc.sent or not isinstance(body, bytes):
                            raise ServiceUnavailable(
                                f"The instance serving {route.name} failed during the request: "
                                f"{exc}"
                            ) from exc
                        instance.healthy = False  # the reconciler re-checks and restores it
                        tried.append(instance)
                    finally:
                        instance.in_flight -= 1
                        variant.release()
        except TimeoutError:
            raise ModelError(
                f"Your invocation timed out while waiting for a response from "
                f"{variant.name} after {self.timeout_s:g} s.",
                original_status_code=504,
                original_message="timed out",
            ) from None

    def current(self, route: EndpointRoute, variant: VariantRoute) -> VariantRoute:
        """The variant to use now: after a wait the routing table may have been swapped."""
        current = self.routes.get(route.name)
        if current is None:
            raise ServiceUnavailable(f"Endpoint {route.name} is being deleted.")
        if current is route:
            return variant
        return current.by_name.get(variant.name) or current.pick_variant(self._rng)

    def _choose(
        self, variant: VariantRoute, tried: list[Instance], *, turn: bool
    ) -> Instance | None:
        """An instance for the request, or None to wait in the variant's queue."""
        candidates = variant.instances
        if tried:
            candidates = [i for i in candidates if i not in tried]
        if turn:
            instance = variant.policy.choose(candidates)
            if instance is not None:
                return instance
            if not any(i.healthy for i in candidates):
                raise ModelNotReady(f"No instance of variant {variant.name} is ready yet.")
        if not variant.policy.queues or len(variant.waiters) >= variant.queue_limit:
            raise ServiceUnavailable(
                f"Every instance of variant {variant.name} is at capacity; retry later."
            )
        return None

    async def _wait(self, variant: VariantRoute, *, front: bool = False) -> None:
        waiter = asyncio.get_running_loop().create_future()
        if front:
            variant.waiters.appendleft(waiter)
        else:
            variant.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                variant.release()  # our turn came as we gave up: pass it on
            else:
                waiter.cancel()
            raise

    def close(self) -> None:
        for route in self.routes.values():
            for instance in route.instances():
                instance.pool.close()
