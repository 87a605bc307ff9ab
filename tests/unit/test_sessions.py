"""Session bookkeeping (routing/sessions.py): expiry, closing, and the endpoint a
session belongs to."""

from __future__ import annotations

import asyncio

import pytest

from shipyard.errors import RuntimeValidationError
from shipyard.metrics import Metrics
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Call, Router
from shipyard.routing.sessions import Sessions
from shipyard.routing.table import EndpointRoute, VariantRoute

ONE = Instance("i-1", "v", "http://127.0.0.1:9")


def test_a_session_expires_after_its_ttl_and_is_then_refused() -> None:
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    opened = sessions.open("s1", "e", ONE)
    assert opened.header("s1") == b"s1; Expires=1970-01-01T00:17:40Z"
    now[0] += 59
    assert sessions.instance_for("e", "s1") is ONE
    now[0] += 1
    with pytest.raises(RuntimeValidationError, match="Session s1 is not valid"):
        sessions.instance_for("e", "s1")


def test_a_closed_session_or_another_endpoints_is_refused() -> None:
    sessions = Sessions()
    sessions.open("s1", "e", ONE)
    with pytest.raises(RuntimeValidationError):
        sessions.instance_for("other", "s1")
    sessions.close("s1", "other")  # another endpoint's model cannot close it
    assert sessions.instance_for("e", "s1") is ONE
    sessions.close("s1", "e")
    with pytest.raises(RuntimeValidationError):
        sessions.instance_for("e", "s1")


def test_expired_sessions_are_forgotten_as_new_ones_open() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=10, clock=lambda: now[0])
    for n in range(100):
        sessions.open(f"s{n}", "e", ONE)
    now[0] = 20
    sessions.open("fresh", "e", ONE)
    assert repr(sessions) == "Sessions(live=1, ttl_s=10)"


def test_a_request_waiting_for_its_sessions_instance_takes_no_other_turn() -> None:
    """A session's request waits for its own instance; an instance freed meanwhile goes
    to the requests without a session, as LEAST_OUTSTANDING_REQUESTS would route them."""

    async def scenario() -> None:
        x = Instance("x", "v", "http://127.0.0.1:9")
        y = Instance("y", "v", "http://127.0.0.1:10")
        variant = VariantRoute(
            "v",
            weight=1.0,
            policy=LeastOutstandingRequests(max_in_flight=1),
            instances=[x, y],
            metrics=Metrics().for_variant("e", "v"),
        )
        route = EndpointRoute("e", [variant])
        router = Router(timeout_s=5)
        router.publish(route)
        for _ in range(2):  # both instances busy
            await router._take(route, variant, Call([], b""), [], True)
        pinned = asyncio.create_task(
            router._take(route, variant, Call([], b"", session="s", pinned=x), [], True)
        )
        await asyncio.sleep(0)
        plain = asyncio.create_task(router._take(route, variant, Call([], b""), [], False))
        await asyncio.sleep(0)
        router._give_back(route, variant, y)
        assert (await asyncio.wait_for(plain, 1))[1] is y
        assert not pinned.done()
        router._give_back(route, variant, x)
        assert (await asyncio.wait_for(pinned, 1))[1] is x

    asyncio.run(scenario())
