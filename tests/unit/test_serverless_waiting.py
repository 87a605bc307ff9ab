"""Requests waiting for a serverless cold start that another gateway made, and that
failed: those that began waiting by the time of the ask it was made for fail with its
reason; one that came later waits on, asks again, and is served by the next instance.
A real router and a small real server on loopback for the instance."""

from __future__ import annotations

import asyncio
import time

from shipyard.control.serverless import start_failed
from shipyard.errors import ModelError
from shipyard.metrics import Metrics
from shipyard.records import ServerlessConfig
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.serverless import ServerlessAdmission
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.unit.test_client import _serve as serve
from tests.unit.test_queued_calls import Recording, one_instance
from tests.unit.test_started_calls import Told


def _table(admission: ServerlessAdmission, *instances: Instance) -> EndpointRoute:
    """The endpoint's table as the publisher makes it for a serverless variant."""
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=1),
        instances=instances,
        metrics=Metrics().for_variant("e", "v1"),
        admission=admission,
    )
    return EndpointRoute("e", [variant])


def _at_rest() -> tuple[Router, ServerlessAdmission, list[int]]:
    """A router with a serverless variant at rest, and the asks for instances it makes."""
    asks: list[int] = []
    admission = ServerlessAdmission(
        "v1", ServerlessConfig(memory_mb=1024, max_concurrency=4), slots=1, demand=asks.append
    )
    router = Router(timeout_s=10.0)
    router.publish(_table(admission))
    return router, admission, asks


async def _until(check: object, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.005)


def test_only_requests_waiting_by_the_failed_ask_fail() -> None:
    async def main() -> None:
        router, admission, asks = _at_rest()

        def invoke(body: bytes) -> asyncio.Task[object]:
            route = router.routes["e"]
            return asyncio.create_task(router.invoke(route, route.variants[0], Call([], body)))

        early = invoke(b"early")
        await _until(lambda: len(asks) == 1)
        began_by = time.monotonic()  # the ask written for the early request
        await _until(lambda: time.monotonic() > began_by)  # the late one begins after it
        late = invoke(b"late")
        await _until(lambda: len(asks) == 2)
        later = invoke(b"later")
        await _until(lambda: len(asks) == 3)

        router.fail_waiting("e", "v1", lambda: start_failed("v1", "no weights"), began_by)
        try:
            await asyncio.wait_for(early, 5)
        except ModelError as exc:
            assert "failed to start: no weights" in str(exc)
        else:
            raise AssertionError("the request the cold start was for was served")
        await _until(lambda: len(asks) == 5)  # the late ones asked again
        # Still waiting: failed at any time before the instance below, they would raise
        # from the gather there, so no sleep is needed to see them not fail.
        assert not late.done() and not later.done()

        handler = Recording(0.0)
        server, port = await serve(handler)
        try:
            instance = Instance("i-1", "v1", f"http://127.0.0.1:{port}", concurrency=1)
            router.publish(_table(admission, instance))
            await asyncio.wait_for(asyncio.gather(late, later), 5)
            assert handler.bodies == [b"late", b"later"], "in the order they came"
            assert admission.active == 0
        finally:
            router.close()
            server.close()

    asyncio.run(main())


def test_without_a_time_every_waiting_request_fails() -> None:
    async def main() -> None:
        router, admission, asks = _at_rest()
        route = router.routes["e"]
        waiting = [
            asyncio.create_task(router.invoke(route, route.variants[0], Call([], b"%d" % n)))
            for n in range(2)
        ]
        await _until(lambda: len(asks) == 2)
        router.fail_waiting("e", "v1", lambda: start_failed("v1", "no weights"))
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert [type(r) for r in results] == [ModelError, ModelError]
        assert admission.active == 0
        router.close()

    asyncio.run(main())


def test_a_call_taken_on_callbacks_fails_with_the_models_reason() -> None:
    """A call held on callbacks (Router.start) in a variant an update made serverless:
    told the cold start's error itself, never the router's internal signal."""

    async def main() -> None:
        server_handler, server, router, route, variant = await one_instance(0.2)
        first, waiting = Told(), Told()
        router.start(route, variant, Call([], b"first"), first)
        router.start(route, variant, Call([], b"waiting"), waiting)
        router.fail_waiting("e", "v1", lambda: start_failed("v1", "no weights"), time.monotonic())
        _, _, error = await waiting.wait()
        assert isinstance(error, ModelError), error
        assert "failed to start: no weights" in str(error)
        assert (await first.wait())[2] is None
        router.close()
        server.close()

    asyncio.run(main())
