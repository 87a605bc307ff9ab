"""Calls started with no task (ConnectionPool.start, Router.start), which ``request`` and
``invoke`` await, against small real servers on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from shipyard.errors import (
    ClientGone,
    InstanceFailed,
    ModelError,
    ResponseTooLarge,
    ServiceUnavailable,
    UpstreamError,
)
from shipyard.gateway.doors.endpoint import EndpointAccess
from shipyard.gateway.doors.runtime import RuntimeDoor
from shipyard.http.client import ConnectionPool
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.invocation import Invocations
from shipyard.routing.policies import Random
from shipyard.routing.router import Router
from shipyard.routing.strategies import OneModel
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.conftest import wait_until_async
from tests.unit.test_client import Odd
from tests.unit.test_client import _read_request as read_request
from tests.unit.test_client import _serve as serve

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def echo(*, close_after: int | None = None, delay_s: float = 0.0) -> tuple[Handler, list[int]]:
    """A keep-alive echo server's handler and its count of connections; with
    ``close_after``, a connection that has answered that many requests is closed when the
    next one comes (as a keep-alive timeout can cross a request)."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        answered = 0
        try:
            while close_after is None or answered < close_after:
                body = await read_request(reader)
                await asyncio.sleep(delay_s)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                answered += 1
            await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return handler, connections


def ends(handler: Handler) -> tuple[Handler, list[int]]:
    """``handler``, and a count of the connections it is done with: an echo's ends once
    its client closed the connection, so a wait on it stands for "closed" without a
    fixed sleep."""
    ended: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            ended.append(1)

    return counted, ended


class Told:
    """What on_answer (or a router's done) was told, and when."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[Any, ...]] = []
        self.event = asyncio.Event()

    def __call__(self, *outcome: Any) -> None:
        self.outcomes.append(outcome)
        self.event.set()

    async def wait(self) -> tuple[Any, ...]:
        await asyncio.wait_for(self.event.wait(), 10)
        return self.outcomes[-1]


async def warm(pool: ConnectionPool) -> None:
    """One request through ``request``: a connection left idle in the pool."""
    response = await pool.request(b"POST", b"/invocations", [], b"warm")
    assert response.status == 200


def test_start_connects_when_no_connection_is_idle_and_reuses_it() -> None:
    async def main() -> list[int]:
        handler, connections = echo()
        server, port = await serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        told = Told()
        pool.start(b"POST", b"/invocations", [], b"x", None, told)  # connects, in a task
        response, error = await told.wait()
        assert error is None and response.body == b"x" and pool.idle_count() == 1
        for n in range(3):
            told = Told()
            pool.start(b"POST", b"/invocations", [(b"X-N", b"1")], b"%d" % n, None, told)
            response, error = await told.wait()
            assert error is None and response.status == 200 and response.body == b"%d" % n
        pool.close()
        server.close()
        return connections

    assert len(asyncio.run(main())) == 1  # one connection carried all of them


def test_a_connection_closed_while_idle_is_tried_once_more_as_request_does() -> None:
    async def main() -> list[int]:
        handler, connections = echo(close_after=1)
        server, port = await serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        await warm(pool)
        told = Told()
        pool.start(b"POST", b"/invocations", [], b"again", None, told)
        response, error = await told.wait()
        assert error is None and response.body == b"again"
        pool.close()
        server.close()
        return connections

    assert len(asyncio.run(main())) == 2


def test_an_answer_cut_short_is_not_tried_again() -> None:
    odd = Odd()

    async def main() -> tuple[Any, ...]:
        server, port = await serve(odd.handler)
        pool = ConnectionPool("127.0.0.1", port)
        await warm(pool)
        told = Told()
        pool.start(b"POST", b"/invocations", [], b"cut", None, told)
        outcome = await told.wait()
        pool.close()
        server.close()
        return outcome

    response, error = asyncio.run(main())
    assert response is None and isinstance(error, UpstreamError) and error.sent
    assert odd.bodies == [b"warm", b"cut"]  # the model ran once


def test_an_answer_too_large_is_not_tried_again() -> None:
    async def main() -> tuple[Any, list[int]]:
        handler, connections = echo()
        server, port = await serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        await warm(pool)
        told = Told()
        pool.start(b"POST", b"/invocations", [], b"x" * 100, 10, told)
        outcome = await told.wait()
        pool.close()
        server.close()
        return outcome, connections

    (response, error), connections = asyncio.run(main())
    assert response is None and isinstance(error, ResponseTooLarge)
    assert len(connections) == 1


def test_an_abandoned_call_is_never_answered_and_its_connection_closed() -> None:
    async def main() -> tuple[Told, ConnectionPool]:
        handler, ended = ends(echo(delay_s=0.2)[0])
        server, port = await serve(handler)
        pool = ConnectionPool("127.0.0.1", port)
        await warm(pool)
        told = Told()
        abandon = pool.start(b"POST", b"/invocations", [], b"late", None, told)
        abandon()
        # The server answers 0.2 s on, then ends only once the connection is closed: a
        # connection kept open, idle or waiting for that answer, never gets there.
        await wait_until_async(lambda: ended, "the abandoned call's connection closed")
        server.close()
        return told, pool

    told, pool = asyncio.run(main())
    assert told.outcomes == []
    assert pool.idle_count() == 0  # closed, not handed back


class FirstOffered(OneModel):
    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        return instances[0] if instances else None


def table(*ports: int, timeout_s: float = 5.0) -> tuple[Router, EndpointRoute, VariantRoute]:
    instances = [
        Instance(f"i-{n}", "v1", f"http://127.0.0.1:{port}", concurrency=1)
        for n, port in enumerate(ports)
    ]
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=Random(max_in_flight=1),
        instances=instances,
        metrics=Metrics().for_variant("e", "v1"),
    )
    router = Router(timeout_s=timeout_s)
    route = EndpointRoute("e", [variant])
    router.publish(route)
    return router, route, variant


def test_a_started_call_is_counted_until_answered_and_taught_by_the_answer() -> None:
    async def main() -> None:
        handler, _ = echo(delay_s=0.05)
        server, port = await serve(handler)
        router, route, variant = table(port)
        (instance,) = variant.instances
        await warm(instance.pool)
        done = Told()
        router.start(route, variant, Call([], b"hi"), done)
        assert instance.in_flight == 1 and router.watched() == 1
        # Nothing else can take the instance meanwhile (one at a time), and none queues.
        with pytest.raises(ServiceUnavailable):
            router.start(route, variant, Call([], b"other"), Told())
        response, model_s, error = await done.wait()
        assert error is None and response.body == b"hi" and model_s > 0
        assert instance.in_flight == 0 and not router.watched()
        assert instance.latency_s > 0
        router.close()
        server.close()

    asyncio.run(main())


def test_a_started_call_past_the_deadline_is_invokes_timeout() -> None:
    async def main() -> None:
        handler, ended = ends(echo(delay_s=1.0)[0])
        server, port = await serve(handler)
        router, route, variant = table(port, timeout_s=0.2)
        (instance,) = variant.instances
        await warm(instance.pool)
        done = Told()
        router.start(route, variant, Call([], b"slow"), done)
        response, _, error = await done.wait()
        assert response is None and isinstance(error, ModelError)
        assert error.original_status_code == 504
        assert instance.in_flight == 0 and not router.watched()
        # The server writes its late answer a second on, then ends once the connection
        # is closed: one kept open for that answer never gets there.
        await wait_until_async(lambda: ended, "the expired call's connection closed")
        assert done.outcomes == [(None, 0.0, error)]
        router.close()
        server.close()

    asyncio.run(main())


def test_an_instance_that_dies_mid_call_is_invokes_error() -> None:
    async def main() -> None:
        async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            body = await read_request(reader)
            if body == b"warm":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                body = await read_request(reader)
            writer.transport.abort()  # the second request: no answer, connection reset

        server, port = await serve(dies)
        router, route, variant = table(port)
        (instance,) = variant.instances
        await warm(instance.pool)
        done = Told()
        router.start(route, variant, Call([], b"boom"), done)
        response, _, error = await done.wait()
        assert response is None and isinstance(error, InstanceFailed)
        assert instance.in_flight == 0 and not router.watched()
        router.close()
        server.close()

    asyncio.run(main())


def test_a_fault_while_starting_undoes_everything() -> None:
    class Faulty:
        def choose(self, instances: Any, call: Any) -> Any:
            return instances[0]

        def send(self, *args: Any) -> Any:
            raise RuntimeError("a fault in send")

    class Counting:
        starts_instances = False
        active = 0

        def admit(self) -> None:
            self.active += 1

        def leave(self) -> None:
            self.active -= 1

    async def main() -> None:
        router, route, variant = table(9)
        admission = Counting()
        variant.dispatch = Faulty()  # type: ignore[assignment]
        variant.admission = admission  # type: ignore[assignment]
        call = Call([], b"x")
        with pytest.raises(RuntimeError):
            router.start(route, variant, call, Told())
        assert variant.instances[0].in_flight == 0 and call.instance is None
        assert admission.active == 0 and not router.watched()

    asyncio.run(main())


def test_a_call_that_never_reached_its_instance_goes_to_another_without_a_second_admission() -> (
    None
):
    class Once:
        starts_instances = False
        active = 0
        admitted = 0

        def admit(self) -> None:
            self.active += 1
            self.admitted += 1

        def leave(self) -> None:
            self.active -= 1

    async def main() -> None:
        handler, _ = echo()
        server, port = await serve(handler)
        router, route, variant = table(port, port)
        first, second = variant.instances
        admission = Once()
        variant.admission = admission  # type: ignore[assignment]
        await warm(first.pool)
        # The first instance's pool reaches nothing once its idle connection fails.
        first.pool.port = 9
        first.pool.socket_path = None
        first.pool.close()
        # The first of those offered: ``start`` offers both, ``invoke`` then the other.
        variant.dispatch = FirstOffered(Random(max_in_flight=1))
        done = Told()
        router.start(route, variant, Call([], b"moved"), done)
        response, _, error = await done.wait()
        assert error is None and response.body == b"moved"
        assert not first.healthy and first.in_flight == 0 and second.in_flight == 0
        assert admission.admitted == 1 and admission.active == 0
        router.close()
        server.close()

    asyncio.run(main())


def test_the_door_answers_every_outcome_of_a_started_call() -> None:
    """A fault of its own, once the call reached its instance, is a 500 in the runtime's
    shape and counted; a client gone while waiting gets nothing and is not counted, as on
    the door's ASGI call; a call that never reached an instance is not the model's
    invocation, whatever it is answered."""
    router, route, variant = table(9)
    door = RuntimeDoor(
        access=EndpointAccess(invocations=Invocations(router), max_payload_bytes=1 << 20)
    )
    answers: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []

    def respond(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        answers.append((status, headers, body))

    unsent = Call([], b"x")
    unsent.variant = variant
    door._answer("e", unsent, respond, None, RuntimeError("a fault"))
    assert [status for status, _, _ in answers] == [500]
    assert variant.metrics.invocations.value == 0
    answers.clear()
    call = Call([], b"x")
    call.variant = variant
    (call.instance,) = variant.instances
    door._answer("e", call, respond, None, ClientGone())
    assert answers == []
    door._answer("e", call, respond, None, RuntimeError("a fault"))
    ((status, headers, body),) = answers
    assert status == 500 and (b"x-amzn-errortype", b"InternalFailure") in headers
    assert json.loads(body)["message"] == "Internal failure."
    assert variant.metrics.invocations.value == 1
    assert variant.metrics.errors_5xx.value == 1
