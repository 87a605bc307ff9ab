"""Calls started with no task that find every instance busy (Router.start): they wait in
the variant's queue as ``invoke``'s requests do, in the same order, and each is sent from
the callback that gives an instance back. Against small real servers on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shipyard.errors import ClientGone, ModelError, ModelNotReady, ServiceUnavailable
from shipyard.http.client import Response, in_task
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.conftest import wait_until_async
from tests.unit.test_client import _read_request as read_request
from tests.unit.test_client import _serve as serve
from tests.unit.test_started_calls import Told, warm


class Recording:
    """A keep-alive server answering one request at a time with its body, after
    ``delay_s`` (a body ``warm`` at once); ``bodies`` in the order they arrived."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.bodies: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_request(reader)
                self.bodies.append(body)
                if body != b"warm":
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


async def busy_and_fresh() -> tuple[
    Recording, Recording, list[asyncio.Server], Router, EndpointRoute, VariantRoute
]:
    """Two recording servers, one slow (3 s) and one quick; an LOR table over the slow
    one, its pool warm."""
    busy, fresh = Recording(delay_s=3.0), Recording(delay_s=0.0)
    busy_server, busy_port = await serve(busy)
    fresh_server, _ = await serve(fresh)
    router, route, variant = lor_table(busy_port)
    await warm(variant.instances[0].pool)
    return busy, fresh, [busy_server, fresh_server], router, route, variant


class Counting:
    """An admission that counts the calls it let in and has not seen leave."""

    starts_instances = False

    def __init__(self) -> None:
        self.active = 0
        self.admitted = 0

    def admit(self) -> None:
        self.active += 1
        self.admitted += 1

    def leave(self) -> None:
        self.active -= 1

    def waiting(self, variant: Any) -> None:
        pass


def counted(router: Router, variant: VariantRoute) -> Counting:
    """A counting admission set on ``variant``."""
    admission = Counting()
    variant.admission = admission  # type: ignore[assignment]
    return admission


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
        admission = counted(router, variant)
        told = [Told() for _ in range(4)]
        for n, done in enumerate(told):
            router.start(route, variant, Call([], b"call-%d" % n), done)
        # One sent, three waiting in the variant's queue: the instance takes one at a time.
        assert instance.in_flight == 1 and len(variant.waiters) == 3
        assert admission.active == 4
        for n, done in enumerate(told):
            response, model_s, error = await done.wait()
            assert error is None and response.body == b"call-%d" % n and model_s > 0
        assert server_handler.bodies == [b"call-%d" % n for n in range(4)]
        assert instance.in_flight == 0 and not variant.waiters and not router.watched()
        assert admission.active == 0 and admission.admitted == 4
        router.close()
        server.close()

    asyncio.run(main())


def test_a_waiting_invoke_keeps_its_place_ahead_of_later_started_calls() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance()
        (instance,) = variant.instances
        first = Told()
        router.start(route, variant, Call([], b"first"), first)
        invoked = asyncio.ensure_future(router.invoke(route, variant, Call([], b"invoked")))
        await asyncio.sleep(0)  # the invoke is in the queue now
        assert len(variant.waiters) == 1
        last = Told()
        router.start(route, variant, Call([], b"last"), last)
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
        router.start(route, variant, Call([], b"first"), first)
        gone, left = Gone(), Told()
        router.start(route, variant, Call([], b"left", watch_gone=gone), left)
        assert len(variant.waiters) == 1
        gone.fire()
        response, _, error = await left.wait()
        assert response is None and isinstance(error, ClientGone)
        assert not variant.waiters and gone.unwatched == 1
        # A sentinel queued last: had the call that left stayed in the queue, it would
        # reach the instance ahead of the sentinel.
        sentinel = Told()
        router.start(route, variant, Call([], b"sentinel"), sentinel)
        assert (await first.wait())[2] is None
        assert (await sentinel.wait())[0].body == b"sentinel"
        assert server_handler.bodies == [b"first", b"sentinel"]
        assert instance.in_flight == 0 and not router.watched()
        # Once its turn came, a call stops watching its client.
        busy, again, answered = Told(), Gone(), Told()
        router.start(route, variant, Call([], b"busy"), busy)
        router.start(route, variant, Call([], b"again", watch_gone=again), answered)
        assert len(again.callbacks) == 1 and again.unwatched == 0
        await busy.wait()
        assert again.unwatched == 1
        assert (await answered.wait())[0].body == b"again"
        router.close()
        server.close()

    asyncio.run(main())


def test_a_call_that_waits_past_the_deadline_is_invokes_timeout_and_never_sent() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(1.0, timeout_s=0.3)
        (instance,) = variant.instances
        # The first call holds the instance for a second, under a deadline of its own.
        first = asyncio.ensure_future(router.invoke(route, variant, Call([], b"first"), 5.0))
        await wait_until_async(lambda: instance.in_flight == 1, "the first call sent")
        waiting = Told()
        router.start(route, variant, Call([], b"waiting"), waiting)
        response, _, error = await waiting.wait()
        # Never sent: no instance was free all that time, the gateway's overload (a 503
        # boto3 retries), not the model's timeout.
        assert response is None and isinstance(error, ServiceUnavailable)
        assert "was free to take the request" in error.message and not variant.waiters
        # A sentinel queued last (answered at once, under a deadline of its own): had the
        # expired call stayed in the queue, it would reach the instance ahead of it.
        server_handler.delay_s = 0.0
        sentinel = asyncio.ensure_future(router.invoke(route, variant, Call([], b"sentinel"), 5.0))
        assert (await first)[0].body == b"first"
        assert (await asyncio.wait_for(sentinel, 5))[0].body == b"sentinel"
        assert server_handler.bodies == [b"first", b"sentinel"]
        assert instance.in_flight == 0 and not router.watched()
        router.close()
        server.close()

    asyncio.run(main())


def test_the_deadline_runs_from_when_the_call_came_not_from_its_turn() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.6, timeout_s=0.9)
        first = asyncio.ensure_future(router.invoke(route, variant, Call([], b"first"), 5.0))
        await asyncio.sleep(0)
        second = Told()
        router.start(route, variant, Call([], b"second"), second)
        assert (await first)[0].body == b"first"
        # Sent 0.6 s after it came, answered 0.6 s later: past its 0.9 s, which from its
        # turn it would not be.
        response, _, error = await second.wait()
        assert response is None and isinstance(error, ModelError)
        assert server_handler.bodies == [b"first", b"second"]
        router.close()
        server.close()

    asyncio.run(main())


def test_a_full_queue_or_no_instance_ready_refuses_the_call_at_once() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2, max_in_flight=2)
        (instance,) = variant.instances
        assert variant.queue_limit == 2
        told = [Told() for _ in range(3)]
        for n, done in enumerate(told):
            router.start(route, variant, Call([], b"%d" % n), done)
        # The queue is full: ``start`` refuses, as ``invoke`` does, leaving nothing.
        with pytest.raises(ServiceUnavailable):
            router.start(route, variant, Call([], b"more"), Told())
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
        with pytest.raises(ModelNotReady):
            router.start(route, variant, Call([], b"none ready"), Told())
        assert not variant.waiters
        router.close()
        server.close()

    asyncio.run(main())


def test_waiting_calls_fail_with_the_variant() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2)
        (instance,) = variant.instances
        first, waiting = Told(), Told()
        router.start(route, variant, Call([], b"first"), first)
        router.start(route, variant, Call([], b"waiting"), waiting)
        router.fail_waiting("e", "v1", lambda: ServiceUnavailable("cold start failed"))
        response, _, error = await waiting.wait()
        assert response is None and isinstance(error, ServiceUnavailable)
        assert router.watched() == 1  # the first call's, still in flight
        assert (await first.wait())[2] is None
        assert instance.in_flight == 0 and not router.watched()
        router.close()
        server.close()

    asyncio.run(main())


def test_waiting_calls_move_to_a_new_table_and_go_to_its_instances() -> None:
    async def main() -> None:
        busy, fresh, servers, router, route, variant = await busy_and_fresh()
        busy_port, fresh_port = (server.sockets[0].getsockname()[1] for server in servers)
        first = Told()
        router.start(route, variant, Call([], b"first"), first)
        waiting = [Told() for _ in range(2)]
        for n, done in enumerate(waiting):
            router.start(route, variant, Call([], b"moved-%d" % n), done)
        # The reconciler publishes a table with one more instance: the waiting calls
        # move to it and go to the instance that is free, without waiting for the busy one.
        new_route, new_variant = lor_route(busy_port, fresh_port)
        new_variant.instances[0] = variant.instances[0]  # the same instance, still busy
        await warm(new_variant.instances[1].pool)
        fresh.bodies.clear()
        router.publish(new_route)
        for n, done in enumerate(waiting):
            response, _, error = await asyncio.wait_for(done.wait(), 2.0)
            assert error is None and response.body == b"moved-%d" % n
        assert fresh.bodies == [b"moved-0", b"moved-1"]
        assert not variant.waiters and not new_variant.waiters
        assert (await first.wait())[2] is None
        router.close()
        for server in servers:
            server.close()

    asyncio.run(main())


def test_a_waiting_call_on_an_endpoint_withdrawn_is_unavailable() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2)
        first, waiting = Told(), Told()
        router.start(route, variant, Call([], b"first"), first)
        router.start(route, variant, Call([], b"waiting"), waiting)
        router.withdraw("e")
        response, _, error = await waiting.wait()
        assert response is None and isinstance(error, ServiceUnavailable)
        assert "being deleted" in str(error)
        await first.wait()
        assert list(router.in_flight()) == [] and not router.watched()
        router.close()
        server.close()

    asyncio.run(main())


def test_a_waiting_call_keeps_the_admission_it_came_by_across_a_swap_of_tables() -> None:
    async def main() -> None:
        busy, fresh, servers, router, route, variant = await busy_and_fresh()
        busy_port, fresh_port = (server.sockets[0].getsockname()[1] for server in servers)
        first_admission = counted(router, variant)
        first = Told()
        router.start(route, variant, Call([], b"first"), first)
        moved = Told()
        router.start(route, variant, Call([], b"moved"), moved)
        # The successor counts its own (a serverless variant's MaxConcurrency): the call
        # it never admitted must not leave it.
        new_route, new_variant = lor_route(busy_port, fresh_port)
        new_variant.instances[0] = variant.instances[0]
        second_admission = Counting()
        new_variant.admission = second_admission  # type: ignore[assignment]
        await warm(new_variant.instances[1].pool)
        router.publish(new_route)
        response, _, error = await asyncio.wait_for(moved.wait(), 2.0)
        assert error is None and response.body == b"moved"
        assert first_admission.active == 1  # the first call's, still at the busy instance
        assert second_admission.active == 0 and second_admission.admitted == 0
        router.close()
        for server in servers:
            server.close()

    asyncio.run(main())


class Failing:
    """OneModel's dispatch, whose ``send`` raises for the bodies in ``refuse``."""

    def __init__(self, dispatch: Any, refuse: set[bytes]) -> None:
        self.dispatch = dispatch
        self.refuse = refuse

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatch, name)

    def send(self, instance: Any, call: Call, max_body: Any, on_answer: Any) -> Any:
        if call.body in self.refuse:
            raise RuntimeError("a fault in send")
        return self.dispatch.send(instance, call, max_body, on_answer)


class Awaiting:
    """OneModel's dispatch, whose ``send`` awaits something first (as an adapter's
    registration does), in a task of its own."""

    def __init__(self, dispatch: Any) -> None:
        self.dispatch = dispatch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatch, name)

    def send(self, instance: Any, call: Call, max_body: Any, on_answer: Any) -> Any:
        async def later() -> Response:
            await asyncio.sleep(0.01)
            return await instance.pool.request(b"POST", call.path, call.headers, call.body)

        return in_task(later(), on_answer)


def test_a_fault_sending_a_waiting_call_is_that_calls_and_the_turn_goes_on() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance()
        (instance,) = variant.instances
        admission = counted(router, variant)
        variant.dispatch = Failing(variant.dispatch, {b"faulty"})  # type: ignore[assignment]
        told = {body: Told() for body in (b"first", b"faulty", b"last")}
        for body, done in told.items():
            router.start(route, variant, Call([], body), done)
        first = await told[b"first"].wait()
        assert first[2] is None and first[0].body == b"first"
        faulty = await told[b"faulty"].wait()
        assert faulty[0] is None and isinstance(faulty[2], RuntimeError)
        last = await told[b"last"].wait()
        assert last[2] is None and last[0].body == b"last"
        assert [len(done.outcomes) for done in told.values()] == [1, 1, 1]
        assert server_handler.bodies == [b"first", b"last"]
        assert admission.active == 0 and instance.in_flight == 0
        assert not variant.waiters and not router.watched()
        router.close()
        server.close()

    asyncio.run(main())


def test_a_waiting_call_whose_dispatch_awaits_is_answered_from_its_task() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance()
        admission = counted(router, variant)
        variant.dispatch = Awaiting(variant.dispatch)  # type: ignore[assignment]
        first, awaits = Told(), Told()
        router.start(route, variant, Call([], b"first"), first)
        router.start(route, variant, Call([], b"awaits"), awaits)
        assert (await first.wait())[2] is None
        response, model_s, error = await awaits.wait()
        assert error is None and response.body == b"awaits" and model_s > 0
        assert admission.active == 0 and admission.admitted == 2
        assert server_handler.bodies == [b"first", b"awaits"]
        assert variant.instances[0].in_flight == 0 and not router.watched()
        router.close()
        server.close()

    asyncio.run(main())


def test_calls_sent_from_expiries_keep_one_sweep_of_the_deadlines() -> None:
    """An expired call gives its instance to a waiting one, which adds a deadline from
    inside the sweep: the sweeps stay one every resolution, not one more each time."""

    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(10.0, timeout_s=0.2)
        deadlines = router._deadlines
        sweeps: list[float] = []
        sweep = deadlines._sweep

        def counting_sweep() -> None:
            sweeps.append(asyncio.get_running_loop().time())
            sweep()

        deadlines._sweep = counting_sweep  # type: ignore[method-assign]
        # An expired call's connection is closed: enough idle ones for every call.
        pool = variant.instances[0].pool
        await asyncio.gather(*(warm(pool) for _ in range(12)))
        server_handler.bodies.clear()
        told: list[Told] = []
        started = asyncio.get_running_loop().time()
        for n in range(12):  # a call every 0.1 s, each outliving its 0.2 s
            told.append(Told())
            router.start(route, variant, Call([], b"%d" % n), told[-1])
            await asyncio.sleep(0.1)
        for done in told:
            assert isinstance((await done.wait())[2], ModelError)
        elapsed = asyncio.get_running_loop().time() - started
        # One sweep every 0.1 s while deadlines are live, and some slack.
        assert len(sweeps) <= elapsed / deadlines.resolution_s + 3, (len(sweeps), elapsed)
        assert len(server_handler.bodies) >= 2  # calls were sent from the expiries
        router.close()
        server.close()

    asyncio.run(main())


def test_a_streamed_exchange_counts_on_its_instance_until_it_is_left() -> None:
    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.0)
        (instance,) = variant.instances
        async with router.stream(route, variant, Call([], b"streamed")) as exchange:
            assert instance.streams == 1 and instance.in_flight == 1
            assert b"".join([c async for c in exchange.response.chunks()]) == b"streamed"
        assert instance.streams == 0 and instance.in_flight == 0
        router.close()
        server.close()

    asyncio.run(main())
