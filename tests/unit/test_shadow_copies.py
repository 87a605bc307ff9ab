"""The gateway's side of shadow copies sent together (routing/shadow.py): the real router,
connection pool and copier against an HTTP server on loopback that stands in for an
instance, so the exchanges themselves can be seen and held. The built-in runtime's side
is in tests/runtime/test_runtime_copies.py, and both together in tests/e2e/test_shadow.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httptools
from prometheus_client import CollectorRegistry, Counter

from shipyard.contract import pack_outcomes, unpack_copies
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.shadow import PendingCopies, ShadowCopier
from shipyard.routing.table import EndpointRoute, VariantRoute


class _Head:
    """A request's path and Content-Length, from httptools' callbacks."""

    def __init__(self) -> None:
        self.path = ""
        self.length = 0

    def on_url(self, url: bytes) -> None:
        self.path = url.decode()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-length":
            self.length = int(value)


OUTCOMES = {b"bad": (400, 0.001), b"broken": (503, 0.001), b"slow": (200, 99.0)}
"""What the stand-in answers for a copy with this body, (200, 0.001) for any other:
``slow`` was answered, but past the invocation timeout."""


class StandIn:
    """An instance on loopback: answers ``/invocations`` 200 and ``/copies`` with each
    copy's outcome (OUTCOMES), or 404 when ``knows_copies`` is False (a runtime from
    before the route); with ``drop``, closes the connection instead of answering
    ``/copies``. Records each exchange's path and copies; ``/copies`` waits for ``hold``."""

    def __init__(self, *, knows_copies: bool = True, drop: bool = False) -> None:
        self.knows_copies = knows_copies
        self.drop = drop
        self.exchanges: list[tuple[str, int]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the pool closed the connection
            parsed = _Head()
            httptools.HttpRequestParser(parsed).feed_data(head)
            body = await reader.readexactly(parsed.length)
            path = parsed.path
            if path == "/copies" and self.knows_copies:
                copies = unpack_copies(body)
                self.exchanges.append((path, len(copies)))
                await self.hold.wait()
                if self.drop:
                    writer.close()
                    return
                outcomes = [OUTCOMES.get(copy, (200, 0.001)) for _, copy in copies]
                status, answer = 200, pack_outcomes(outcomes)
            elif path == "/copies":
                self.exchanges.append((path, 0))
                status, answer = 404, b"Not Found"
            else:
                self.exchanges.append((path, 1))
                status, answer = 200, body
            writer.write(
                b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(answer), answer)
            )
            await writer.drain()


@asynccontextmanager
async def copier_for(
    *stand_ins: StandIn,
) -> AsyncIterator[tuple[ShadowCopier, EndpointRoute, VariantRoute]]:
    """A copier whose endpoint has a shadow with one instance per stand-in."""
    servers = [await asyncio.start_server(s.serve, "127.0.0.1", 0) for s in stand_ins]
    instances = [
        Instance(
            f"i-{n}",
            "shadow",
            f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
            takes_copies=True,
        )
        for n, server in enumerate(servers)
    ]
    metrics = Metrics()
    production = VariantRoute(
        "prod",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=4),
        instances=[],
        metrics=metrics.for_variant("e", "prod"),
    )
    shadow = VariantRoute(
        "shadow",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=4),
        instances=instances,
        metrics=metrics.for_variant("e", "shadow"),
        shadow=True,
    )
    pending = PendingCopies()
    router = Router(timeout_s=10, copies_pending=pending.of)  # as the app builds them
    route = EndpointRoute("e", [production, shadow])
    router.publish(route)
    dropped = Counter("dropped", "copies dropped", ["e", "v"], registry=CollectorRegistry())
    copier = ShadowCopier(router=router, max_pending=64, dropped=dropped, pending=pending)
    try:
        yield copier, route, shadow
    finally:
        await copier.close()
        for instance in instances:
            instance.pool.close()
        for server in servers:
            server.close()
    # Whatever happened, no copy is left counted as pending nor queued.
    assert copier._pending == {} and copier._queues == {}


async def answered(shadow: VariantRoute, count: int) -> None:
    while shadow.metrics.invocations.value < count:
        await asyncio.sleep(0.01)


async def exchanges(stand_in: StandIn, count: int) -> None:
    while len(stand_in.exchanges) < count:
        await asyncio.sleep(0.01)


async def first_exchange_held(
    stand_in: StandIn, copier: ShadowCopier, route: EndpointRoute, shadow: VariantRoute
) -> None:
    """One copy sent, and its exchange held by the stand-in until ``hold`` is set."""
    stand_in.hold.clear()
    copier.send(route, [shadow], Call([], b"first"))
    await asyncio.wait_for(exchanges(stand_in, 1), 5)


async def exchanges_on(first: StandIn, second: StandIn, count: int) -> None:
    while len(first.exchanges) + len(second.exchanges) < count:
        await asyncio.sleep(0.01)


def test_copies_made_during_an_exchange_go_together_in_the_next() -> None:
    async def scenario() -> None:
        stand_in = StandIn()
        async with copier_for(stand_in) as (copier, route, shadow):
            await first_exchange_held(stand_in, copier, route, shadow)
            for n in range(5):  # while the first exchange is held
                copier.send(route, [shadow], Call([(b"Content-Type", b"text/plain")], b"%d" % n))
            # The shadow's concurrency is its copies, not its one exchange in flight.
            assert ("e", "shadow", 6) in set(copier.router.in_flight())
            stand_in.hold.set()
            await asyncio.wait_for(answered(shadow, 6), 5)
            # Every copy answered, so every exchange made: none went while the first was held.
            assert stand_in.exchanges == [("/copies", 1), ("/copies", 5)]
            assert ("e", "shadow", 0) in set(copier.router.in_flight())
            assert shadow.metrics.errors_5xx.value == 0
            assert len(shadow.metrics.latency.pending_model) == 6

    asyncio.run(scenario())


def test_each_copy_is_counted_by_its_own_outcome() -> None:
    async def scenario() -> None:
        stand_in = StandIn()
        async with copier_for(stand_in) as (copier, route, shadow):
            await first_exchange_held(stand_in, copier, route, shadow)
            for body in (b"bad", b"ok", b"broken", b"slow", b"bad"):
                copier.send(route, [shadow], Call([], body))
            stand_in.hold.set()
            await asyncio.wait_for(answered(shadow, 6), 5)
            metrics = shadow.metrics
            assert (metrics.errors_4xx.value, metrics.errors_5xx.value) == (2, 2)
            # Past the invocation timeout is a timeout, as production counts it: no latency.
            latencies = metrics.latency.pending_model
            assert len(latencies) == 5 and max(latencies) < 10

    asyncio.run(scenario())


def test_copies_of_a_failed_exchange_are_errors_and_no_longer_pending() -> None:
    async def scenario() -> None:
        stand_in = StandIn(drop=True)
        async with copier_for(stand_in) as (copier, route, shadow):
            for n in range(3):
                copier.send(route, [shadow], Call([], b"%d" % n))
            await asyncio.wait_for(answered(shadow, 3), 5)
            assert shadow.metrics.errors_5xx.value == 3

    asyncio.run(scenario())


def test_copies_queued_or_in_flight_when_the_gateway_stops_are_let_go() -> None:
    async def scenario() -> None:
        stand_in = StandIn()
        async with copier_for(stand_in) as (copier, route, shadow):
            await first_exchange_held(stand_in, copier, route, shadow)
            for n in range(4):
                copier.send(route, [shadow], Call([], b"%d" % n))
            assert copier._pending == {("e", "shadow"): 5}
        # copier_for closed the copier and checked nothing is left pending.

    asyncio.run(scenario())


def test_a_shadow_with_two_instances_has_an_exchange_in_flight_on_each() -> None:
    async def scenario() -> None:
        first, second = StandIn(), StandIn()
        async with copier_for(first, second) as (copier, route, shadow):
            first.hold.clear()
            second.hold.clear()
            copier.send(route, [shadow], Call([], b"a"))
            await asyncio.wait_for(exchanges_on(first, second, 1), 5)  # "a", held
            copier.send(route, [shadow], Call([], b"b"))  # goes to the other instance
            await asyncio.wait_for(exchanges_on(first, second, 2), 5)
            first.hold.set()
            second.hold.set()
            await asyncio.wait_for(answered(shadow, 2), 5)
            assert first.exchanges == second.exchanges == [("/copies", 1)]

    asyncio.run(scenario())


def test_an_instance_without_the_route_gets_its_copies_one_by_one() -> None:
    async def scenario() -> None:
        stand_in = StandIn(knows_copies=False)
        async with copier_for(stand_in) as (copier, route, shadow):
            for n in range(3):
                copier.send(route, [shadow], Call([], b"%d" % n))
            await asyncio.wait_for(answered(shadow, 3), 5)
            assert stand_in.exchanges == [("/copies", 0)] + [("/invocations", 1)] * 3
            assert not shadow.instances[0].takes_copies
            copier.send(route, [shadow], Call([], b"later"))
            await asyncio.wait_for(answered(shadow, 4), 5)
            assert stand_in.exchanges[-1] == ("/invocations", 1)
            assert shadow.metrics.errors_4xx.value == shadow.metrics.errors_5xx.value == 0

    asyncio.run(scenario())
