"""Calls whose client disconnects (Call.watch_gone) before they are answered: one still
waiting leaves its queue, one already sent has its exchange abandoned (the connection to
the instance closed) and its instance given back once; both are told ClientGone and
counted in ``shipyard_cancelled_requests_total`` by stage. One watch per call, kept
until it ends. Against small real servers on loopback."""

from __future__ import annotations

import asyncio

from shipyard.cloudwatch.recorder import SAGEMAKER, Readings
from shipyard.errors import ClientGone
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.conftest import wait_until_async
from tests.unit.test_client import _read_request as read_request
from tests.unit.test_client import _serve as serve
from tests.unit.test_queued_calls import Gone, counted
from tests.unit.test_started_calls import Told, warm


class Holding:
    """A keep-alive server that answers each request with its body at once, except one
    whose body starts with ``hold``: that one it never answers, and notes in ``closed``
    when the gateway closes its connection."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.closed = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_request(reader)
                self.bodies.append(body)
                if body.startswith(b"hold"):
                    await reader.read()  # nothing more comes: until the connection ends
                    self.closed.set()
                    break
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        writer.close()


async def one_instance() -> tuple[Holding, asyncio.Server, Metrics, Router, EndpointRoute]:
    """A holding server behind a table of one instance that the router sends one request
    at a time (a second waits at the gateway), its pool warm and its record empty. The
    instance says it works on two at once (handler threads): a handler that can be told
    its client left, so a running request is watched."""
    handler = Holding()
    server, port = await serve(handler)
    metrics = Metrics()
    instance = Instance(f"i-{port}", "v1", f"http://127.0.0.1:{port}", concurrency=2)
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=1, pipeline_below_s=0.0),
        instances=[instance],
        metrics=metrics.for_variant("e", "v1"),
    )
    route = EndpointRoute("e", [variant])
    router = Router(timeout_s=10.0)
    router.publish(route)
    await warm(instance.pool)
    handler.bodies.clear()
    return handler, server, metrics, router, route


def cancelled(metrics: Metrics, stage: str) -> float:
    labels = {"endpoint": "e", "variant": "v1", "priority": "1", "stage": stage}
    return metrics.registry.get_sample_value("shipyard_cancelled_requests_total", labels) or 0.0


def test_a_sent_call_whose_client_left_is_abandoned_and_its_instance_given_back_once() -> None:
    async def main() -> None:
        handler, server, metrics, router, route = await one_instance()
        (variant,) = route.variants
        (instance,) = variant.instances
        admission = counted(router, variant)
        gone, left = Gone(), Told()
        router.start(route, variant, Call([], b"hold", watch_gone=gone), left)
        await wait_until_async(lambda: handler.bodies == [b"hold"], "the call at the instance")
        assert instance.in_flight == 1
        assert len(gone.callbacks) == 1 and gone.unwatched == 0  # watched while it runs
        gone.fire()
        response, _, error = await left.wait()
        assert response is None and isinstance(error, ClientGone)
        assert instance.in_flight == 0 and admission.active == 0 and not router.watched()
        assert gone.unwatched == 1
        await asyncio.wait_for(handler.closed.wait(), 10)  # the instance was told
        assert cancelled(metrics, "running") == 1 and cancelled(metrics, "queued") == 0
        # A second disconnect of the same client changes nothing: told, given back and
        # counted once.
        gone.fire()
        assert len(left.outcomes) == 1 and instance.in_flight == 0
        assert cancelled(metrics, "running") == 1
        # The instance is free for the next call.
        after = Told()
        router.start(route, variant, Call([], b"after"), after)
        assert (await after.wait())[0].body == b"after"
        router.close()
        server.close()

    asyncio.run(main())


def test_a_waiting_call_whose_client_left_is_counted_as_cancelled_queued() -> None:
    async def main() -> None:
        handler, server, metrics, router, route = await one_instance()
        (variant,) = route.variants
        first_gone, first = Gone(), Told()
        router.start(route, variant, Call([], b"hold", watch_gone=first_gone), first)
        gone, left = Gone(), Told()
        router.start(route, variant, Call([], b"left", watch_gone=gone), left)
        assert len(variant.waiters) == 1
        gone.fire()
        assert isinstance((await left.wait())[2], ClientGone)
        assert len(gone.callbacks) == 1 and gone.unwatched == 1
        assert cancelled(metrics, "queued") == 1 and cancelled(metrics, "running") == 0
        first_gone.fire()
        assert isinstance((await first.wait())[2], ClientGone)
        assert cancelled(metrics, "queued") == 1 and cancelled(metrics, "running") == 1
        assert b"left" not in handler.bodies
        router.close()
        server.close()

    asyncio.run(main())


def test_a_call_sent_at_once_watches_its_client_once_until_it_is_answered() -> None:
    async def main() -> None:
        handler, server, metrics, router, route = await one_instance()
        (variant,) = route.variants
        gone, answered = Gone(), Told()
        router.start(route, variant, Call([], b"quick", watch_gone=gone), answered)
        assert len(gone.callbacks) == 1 and gone.unwatched == 0
        assert (await answered.wait())[0].body == b"quick"
        assert gone.unwatched == 1
        gone.fire()  # a disconnect after the answer: nothing to cancel
        assert len(answered.outcomes) == 1
        assert cancelled(metrics, "running") == 0 and cancelled(metrics, "queued") == 0
        router.close()
        server.close()

    asyncio.run(main())


def test_a_call_held_for_its_driver_leaves_its_client_to_the_driver() -> None:
    async def main() -> None:
        handler, server, metrics, router, route = await one_instance()
        (variant,) = route.variants
        gone = Gone()
        flight = await router.acquire(route, variant, Call([], b"held", watch_gone=gone))
        assert flight.instance is not None and flight.instance.in_flight == 1
        assert gone.callbacks == []
        flight.close()
        assert flight.instance.in_flight == 0
        router.close()
        server.close()

    asyncio.run(main())


def test_cancellations_are_recorded_for_cloudwatch_as_cancelled_requests() -> None:
    metrics = Metrics()
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=1),
        instances=[],
        metrics=metrics.for_variant("e", "v1"),
    )
    router = Router(timeout_s=1.0)
    router.publish(EndpointRoute("e", [variant]))
    readings = Readings(metrics, router, {})
    variant.metrics.cancelled(1, "queued")
    variant.metrics.cancelled(1, "running")
    variant.metrics.cancelled(1, "running")
    found = [r for r in readings.take() if r[1] == "CancelledRequests"]
    assert len(found) == 1
    namespace, _, dimensions, stats = found[0]
    assert namespace == SAGEMAKER
    assert dimensions == (("EndpointName", "e"), ("VariantName", "v1"))
    assert stats.count == 3 and stats.sum == 3
    # Only what was cancelled since the last tick: nothing now.
    assert not [r for r in readings.take() if r[1] == "CancelledRequests"]
