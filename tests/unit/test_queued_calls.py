"""Calls started with no task that find every instance busy (Router.start): they wait in
the variant's queue as ``invoke``'s requests do, in the same order, and each is sent from
the callback that gives an instance back. Against small real servers on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

from shipyard.errors import ClientGone, ModelError, ServiceUnavailable
from shipyard.metrics import Metrics
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Call, Router
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.unit.test_client import _read_request as read_request
from tests.unit.test_client import _serve as serve
from tests.unit.test_started_calls import Told, warm


class Recording:
    """A keep-alive server answering one request at a time with its body, after
    ``delay_s``; ``bodies`` in the order they arrived."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.bodies: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_request(reader)
                self.bodies.append(body)
                await asyncio.sleep(self.delay_s)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def lor_table(
    *ports: int, timeout_s: float = 5.0, max_in_flight: int = 4, name: str = "e"
) -> tuple[Router, EndpointRoute, VariantRoute]:
    router = Router(timeout_s=timeout_s)
    route, variant = lor_route(*ports, max_in_flight=max_in_flight, name=name)
    router.publish(route)
    return router, route, variant


def lor_route(
    *ports: int, max_in_flight: int = 4, name: str = "e"
) -> tuple[EndpointRoute, VariantRoute]:
    """One variant under LEAST_OUTSTANDING_REQUESTS over instances that work on one request
    at a time, with no pipelining: a second request waits at the gateway."""
    instances = [
        Instance(f"i-{port}", "v1", f"http://127.0.0.1:{port}", concurrency=1) for port in ports
    ]
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=max_in_flight, pipeline_below_s=0.0),
        instances=instances,
        metrics=Metrics().for_variant(name, "v1"),
    )
    return EndpointRoute(name, [variant]), variant


async def one_instance(
    delay_s: float = 0.05, **options: Any
) -> tuple[Recording, asyncio.Server, Router, EndpointRoute, VariantRoute]:
    """A recording server behind an LOR table (``options``: lor_table's), its pool warm
    and its record empty."""
    handler = Recording(delay_s)
    server, port = await serve(handler)
    router, route, variant = lor_table(port, **options)
    await warm(variant.instances[0].pool)
    handler.bodies.clear()
    return handler, server, router, route, variant


class Gone:
    """A client's disconnect watch (Call.watch_gone) that the test fires."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.unwatched = 0

    def __call__(self, callback: Any) -> Any:
        self.callbacks.append(callback)

        def unwatch() -> None:
            self.unwatched += 1

        return unwatch

    def fire(self) -> None:
        for callback in self.callbacks:
            callback()


def test_calls_that_find_the_instance_busy_wait_and_go_in_order_from_the_answers() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance()
        (instance,) = variant.instances
        told = [Told() for _ in range(4)]
        for n, done in enumerate(told):
            assert router.start(route, variant, Call([], b"call-%d" % n), done)
        # One sent, three waiting in the variant's queue: the instance takes one at a time.
        assert instance.in_flight == 1 and len(variant.waiters) == 3
        for n, done in enumerate(told):
            response, model_s, error = await done.wait()
            assert error is None and response.body == b"call-%d" % n and model_s > 0
            assert instance.in_flight <= 1
        assert server_handler.bodies == [b"call-%d" % n for n in range(4)]
        assert instance.in_flight == 0 and not variant.waiters and not router._deadlines._live
        router.close()
        server.close()

    asyncio.run(main())


def test_a_waiting_invoke_keeps_its_place_ahead_of_later_started_calls() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance()
        (instance,) = variant.instances
        first = Told()
        assert router.start(route, variant, Call([], b"first"), first)
        invoked = asyncio.ensure_future(router.invoke(route, variant, Call([], b"invoked")))
        await asyncio.sleep(0)  # the invoke is in the queue now
        assert len(variant.waiters) == 1
        last = Told()
        assert router.start(route, variant, Call([], b"last"), last)
        assert (await invoked)[0].body == b"invoked"
        assert (await last.wait())[0].body == b"last"
        assert server_handler.bodies == [b"first", b"invoked", b"last"]
        router.close()
        server.close()

    asyncio.run(main())


def test_a_waiting_call_whose_client_left_is_never_sent() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance()
        (instance,) = variant.instances
        first = Told()
        assert router.start(route, variant, Call([], b"first"), first)
        gone, left = Gone(), Told()
        assert router.start(route, variant, Call([], b"left", watch_gone=gone), left)
        assert len(variant.waiters) == 1
        gone.fire()
        response, _, error = await left.wait()
        assert response is None and isinstance(error, ClientGone)
        assert not variant.waiters and gone.unwatched == 1
        await first.wait()
        await asyncio.sleep(0.2)  # nothing more reaches the instance
        assert server_handler.bodies == [b"first"]
        assert instance.in_flight == 0 and not router._deadlines._live
        # Once its turn came, a call stops watching its client.
        again = Gone()
        assert router.start(route, variant, Call([], b"again", watch_gone=again), Told())
        assert again.unwatched == 0
        router.close()
        server.close()

    asyncio.run(main())


def test_a_call_that_waits_past_the_deadline_is_invokes_timeout_and_never_sent() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(1.0, timeout_s=0.3)
        (instance,) = variant.instances
        # The first call holds the instance for a second, under a deadline of its own.
        first = asyncio.ensure_future(router.invoke(route, variant, Call([], b"first"), 5.0))
        await asyncio.sleep(0.05)
        waiting = Told()
        assert router.start(route, variant, Call([], b"waiting"), waiting)
        response, _, error = await waiting.wait()
        assert response is None and isinstance(error, ModelError)
        assert error.original_status_code == 504 and not variant.waiters
        assert (await first)[0].body == b"first"
        await asyncio.sleep(0.1)
        assert server_handler.bodies == [b"first"]
        assert instance.in_flight == 0 and not router._deadlines._live
        router.close()
        server.close()

    asyncio.run(main())


def test_the_deadline_runs_from_when_the_call_came_not_from_its_turn() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.4, timeout_s=0.5)
        first = asyncio.ensure_future(router.invoke(route, variant, Call([], b"first"), 5.0))
        await asyncio.sleep(0)
        second = Told()
        assert router.start(route, variant, Call([], b"second"), second)
        assert (await first)[0].body == b"first"
        # Sent 0.4 s after it came, answered 0.4 s later: past its 0.5 s, which from its
        # turn it would not be.
        response, _, error = await second.wait()
        assert response is None and isinstance(error, ModelError)
        assert server_handler.bodies == [b"first", b"second"]
        router.close()
        server.close()

    asyncio.run(main())


def test_a_full_queue_or_no_instance_ready_leaves_the_call_to_invoke() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2, max_in_flight=2)
        (instance,) = variant.instances
        assert variant.queue_limit == 2
        told = [Told() for _ in range(3)]
        for n, done in enumerate(told):
            assert router.start(route, variant, Call([], b"%d" % n), done)
        # The queue is full: ``start`` does nothing, and ``invoke`` refuses.
        assert not router.start(route, variant, Call([], b"more"), Told())
        assert len(variant.waiters) == 2
        try:
            await router.invoke(route, variant, Call([], b"more"))
        except ServiceUnavailable:
            pass
        else:
            raise AssertionError("a full queue took one more")
        for done in told:
            assert (await done.wait())[2] is None
        instance.healthy = False
        assert not router.start(route, variant, Call([], b"none ready"), Told())
        assert not variant.waiters
        router.close()
        server.close()

    asyncio.run(main())


def test_waiting_calls_fail_with_the_variant() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2)
        (instance,) = variant.instances
        first, waiting = Told(), Told()
        assert router.start(route, variant, Call([], b"first"), first)
        assert router.start(route, variant, Call([], b"waiting"), waiting)
        router.fail_waiting("e", "v1", lambda: ServiceUnavailable("cold start failed"))
        response, _, error = await waiting.wait()
        assert response is None and isinstance(error, ServiceUnavailable)
        assert len(router._deadlines._live) == 1  # the first call's, still in flight
        assert (await first.wait())[2] is None
        assert instance.in_flight == 0 and not router._deadlines._live
        router.close()
        server.close()

    asyncio.run(main())


def test_waiting_calls_move_to_a_new_table_and_go_to_its_instances() -> None:
    async def main() -> None:
        busy, fresh = Recording(delay_s=1.0), Recording(delay_s=0.0)
        busy_server, busy_port = await serve(busy)
        fresh_server, fresh_port = await serve(fresh)
        router, route, variant = lor_table(busy_port)
        await warm(variant.instances[0].pool)
        first = Told()
        assert router.start(route, variant, Call([], b"first"), first)
        waiting = [Told() for _ in range(2)]
        for n, done in enumerate(waiting):
            assert router.start(route, variant, Call([], b"moved-%d" % n), done)
        # The reconciler publishes a table with one more instance: the waiting calls
        # move to it and go to the instance that is free, without waiting for the busy one.
        new_route, new_variant = lor_route(busy_port, fresh_port)
        new_variant.instances[0] = variant.instances[0]  # the same instance, still busy
        await warm(new_variant.instances[1].pool)
        fresh.bodies.clear()
        router.publish(new_route)
        for n, done in enumerate(waiting):
            response, _, error = await asyncio.wait_for(done.wait(), 0.9)
            assert error is None and response.body == b"moved-%d" % n
        assert fresh.bodies == [b"moved-0", b"moved-1"]
        assert not variant.waiters and not new_variant.waiters
        assert (await first.wait())[2] is None
        router.close()
        busy_server.close()
        fresh_server.close()

    asyncio.run(main())


def test_a_waiting_call_on_an_endpoint_withdrawn_is_unavailable() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2)
        first, waiting = Told(), Told()
        assert router.start(route, variant, Call([], b"first"), first)
        assert router.start(route, variant, Call([], b"waiting"), waiting)
        router.withdraw("e")
        response, _, error = await waiting.wait()
        assert response is None and isinstance(error, ServiceUnavailable)
        assert "being deleted" in str(error)
        await first.wait()
        router.close()
        server.close()

    asyncio.run(main())
