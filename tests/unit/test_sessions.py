"""Session bookkeeping (routing/sessions.py): expiry, closing, and the endpoint a
session belongs to."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shipyard.errors import RuntimeValidationError
from shipyard.metrics import Metrics
from shipyard.routing.instance import Instance
from shipyard.routing.invocation import SESSION_TABLE_WAIT_S, Invocations
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Call, Router
from shipyard.routing.sessions import Sessions
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.unit.test_client import _serve as serve
from tests.unit.test_queued_calls import Recording

ONE = Instance("i-1", "v", "http://127.0.0.1:9")
TWO = Instance("i-2", "v", "http://127.0.0.1:10")
BOTH = [[ONE, TWO]]


def _open(sessions: Sessions, endpoint: str, instance: Instance) -> str:
    """A session of ``endpoint`` opened on ``instance``, as the router and the
    invocation open one: NEW_SESSION, the instance chosen, the model's good answer."""
    call = Call([(b"X-Amzn-SageMaker-Session-Id", b"NEW_SESSION")], b"", opening=sessions)
    sessions.assign(call, endpoint, instance)
    assert call.session is not None
    assert call.headers == [(b"X-Amzn-SageMaker-Session-Id", call.session.encode())]
    sessions.opened(call.session, endpoint)
    return call.session


def test_an_id_names_its_instance_and_botocore_takes_it() -> None:
    sessions = Sessions()
    first, second = _open(sessions, "e", ONE), _open(sessions, "e", TWO)
    assert first != second
    assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*", first) and len(first) <= 200
    assert sessions.instance_for("e", first, BOTH) is ONE
    assert sessions.instance_for("e", second, BOTH) is TWO
    # The same instance as another gateway's table has it (control/mirror.py) is found.
    mirrored = Instance("i-2", "v", "http://127.0.0.1:10")
    assert sessions.instance_for("e", second, [[ONE, mirrored]]) is mirrored
    # Restarted in place, an instance takes a new address: its sessions are gone.
    restarted = Instance("i-2", "v", "http://127.0.0.1:11")
    assert sessions.instance_for("e", second, [[ONE, restarted]]) is None


def test_a_session_expires_after_its_ttl_and_is_then_refused() -> None:
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    call = Call([(b"x-amzn-sagemaker-session-id", b"NEW_SESSION")], b"", opening=sessions)
    sessions.assign(call, "e", ONE)
    assert call.session is not None
    assert sessions.opened(call.session, "e") == (
        f"{call.session}; Expires=1970-01-01T00:17:40Z".encode()
    )
    now[0] += 59
    assert sessions.instance_for("e", call.session, BOTH) is ONE
    assert sessions.count("e") == 1
    now[0] += 1
    with pytest.raises(RuntimeValidationError, match=f"Session {call.session} is not valid"):
        sessions.instance_for("e", call.session, BOTH)
    assert sessions.count("e") == 0


def test_a_closed_session_or_another_endpoints_is_refused() -> None:
    sessions = Sessions()
    sid = _open(sessions, "e", ONE)
    with pytest.raises(RuntimeValidationError):
        sessions.instance_for("other", sid, BOTH)
    sessions.close(sid, "other", ONE)  # another endpoint's model cannot close it
    sessions.close(sid, "e", TWO)  # nor another instance's
    assert sessions.instance_for("e", sid, BOTH) is ONE
    sessions.close(sid, "e", ONE)
    with pytest.raises(RuntimeValidationError):
        sessions.instance_for("e", sid, BOTH)
    assert sessions.count("e") == 0


def test_ids_made_up_or_altered_or_signed_by_another_store_are_refused() -> None:
    sessions = Sessions(key=b"k" * 32)
    sid = _open(sessions, "e", ONE)
    later = f"{int(sid[:8], 16) + 3600:08x}" + sid[8:]  # a longer life, unsigned
    other_store = Sessions(key=b"o" * 32)
    for bad in (
        later,
        "never-opened",
        "0" * len(sid),
        sid.upper() + "0",
        "zz" * 36,
        "",
        sid.upper(),
    ):
        with pytest.raises(RuntimeValidationError):
            sessions.instance_for("e", bad, BOTH)
    with pytest.raises(RuntimeValidationError):
        other_store.instance_for("e", sid, BOTH)
    # Every gateway of one store has its key (storage/secrets.py): any of them routes it.
    assert Sessions(key=b"k" * 32).instance_for("e", sid, BOTH) is ONE


def test_a_closed_session_is_refused_in_every_spelling_and_shared() -> None:
    """An id has one spelling (lower-case hex, as made): a closed session cannot come
    back in upper case. Its close is queued for the store's other gateways, which learn
    it (routing/session_closes.py)."""
    here, there = Sessions(key=b"k" * 32), Sessions(key=b"k" * 32)
    sid = _open(here, "e", ONE)
    here.close(sid, "e", ONE)
    here.close(sid, "e", ONE)  # told twice: shared once
    for spelling in (sid, sid.upper(), sid[:10].upper() + sid[10:]):
        with pytest.raises(RuntimeValidationError):
            here.instance_for("e", spelling, BOTH)
    assert here.closing == [(sid, float(int(sid[:8], 16)))]
    assert there.instance_for("e", sid, BOTH) is ONE
    there.learn(here.closing)
    with pytest.raises(RuntimeValidationError):
        there.instance_for("e", sid, BOTH)


def test_a_new_sessions_header_names_no_session_until_its_instance_is_chosen() -> None:
    """Between reading NEW_SESSION and choosing an instance, the request carries an id
    of no session: a shadow's copy of a call refused before that is not asked to open
    one."""
    sessions = Sessions(key=b"k" * 32)
    invocations = Invocations(Router(timeout_s=5), sessions=sessions)
    call = _session_call("NEW_SESSION")
    assert invocations._session(_table(9), call) is True
    [(_, value)] = call.headers
    assert value != b"NEW_SESSION" and len(value) == len(_open(sessions, "e", ONE))
    with pytest.raises(RuntimeValidationError):  # no gateway made it
        sessions.instance_for("e", value.decode(), BOTH)


def test_expired_sessions_are_forgotten_as_new_ones_open() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=10, clock=lambda: now[0])
    for _ in range(100):
        _open(sessions, "e", ONE)
    closed = _open(sessions, "e", ONE)
    sessions.close(closed, "e", ONE)
    now[0] = 20
    _open(sessions, "e", ONE)
    assert repr(sessions) == "Sessions(live=1, ttl_s=10)"
    assert not sessions._closed


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


def _table(*ports: int, coming: int = 0) -> EndpointRoute:
    instances = [Instance(f"i-{p}", "v1", f"http://127.0.0.1:{p}") for p in ports]
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=4),
        instances=instances,
        metrics=Metrics().for_variant("e", "v1"),
        coming=coming,
    )
    return EndpointRoute("e", [variant])


@contextlib.asynccontextmanager
async def _instance() -> AsyncIterator[tuple[Recording, int, Router, Invocations]]:
    """A server answering at once on loopback (its port), and a router (30 s timeout)
    with invocations whose sessions are signed with a fixed key."""
    handler = Recording(delay_s=0.0)
    server, port = await serve(handler)
    try:
        router = Router(timeout_s=30)
        yield handler, port, router, Invocations(router, sessions=Sessions(key=b"k" * 32))
    finally:
        server.close()


def _session_call(session: str) -> Call:
    return Call([(b"X-Amzn-SageMaker-Session-Id", session.encode())], b"hi")


def test_a_session_whose_instance_the_table_lacks_waits_for_the_next_table() -> None:
    """A gateway following another's fleet may not list yet the instance a session was
    opened on elsewhere: the request waits for the next table and goes to it there; an
    instance still missing then, or missing from a table that expects none, is gone."""

    async def scenario() -> None:
        async with _instance() as (handler, port, router, invocations):
            held = _table(port).variants[0].instances[0]
            sid = _open(invocations.sessions, "e", held)

            router.publish(_table(coming=1))  # this gateway knows no instance yet
            waiting = asyncio.create_task(invocations.run(router.routes["e"], _session_call(sid)))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            router.publish(_table(port, coming=1))  # the next pass lists it
            answer = await asyncio.wait_for(waiting, 1)
            assert answer.body == b"hi" and handler.bodies == [b"hi"]

            # A table that still lacks it (another instance starting, say) is not the
            # end: the wait goes on until one lists it, within SESSION_TABLE_WAIT_S.
            router.publish(_table(coming=2))
            waiting = asyncio.create_task(invocations.run(router.routes["e"], _session_call(sid)))
            await asyncio.sleep(0.05)
            router.publish(_table(coming=1))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            router.publish(_table(port, coming=1))
            assert (await asyncio.wait_for(waiting, 1)).body == b"hi"

            # The instance gone from a table that expects others: refused after the wait.
            router.publish(_table(coming=1))
            started = asyncio.get_running_loop().time()
            with pytest.raises(RuntimeValidationError, match="is not valid"):
                await invocations.run(router.routes["e"], _session_call(sid))
            waited = asyncio.get_running_loop().time() - started
            assert SESSION_TABLE_WAIT_S - 0.1 <= waited < SESSION_TABLE_WAIT_S + 5  # not the 30 s

            # From a table that expects no instance: refused at once.
            router.publish(_table())
            with pytest.raises(RuntimeValidationError, match="is not valid"):
                await asyncio.wait_for(invocations.run(router.routes["e"], _session_call(sid)), 0.5)
            assert not router._next_table

    asyncio.run(scenario())


def test_a_new_sessions_id_names_the_instance_it_was_sent_to() -> None:
    """NEW_SESSION: the id the model gets is made once the router has chosen its
    instance, on the taken path as on ``run``'s, and names that instance."""

    async def scenario() -> None:
        async with _instance() as (_, port, router, invocations):
            router.publish(_table(port))
            route = router.routes["e"]
            call = _session_call("NEW_SESSION")
            answer = await invocations.run(route, call)
            assert answer.body == b"hi" and call.session is not None and call.opened
            assert call.headers == [(b"X-Amzn-SageMaker-Session-Id", call.session.encode())]
            instance = route.variants[0].instances[0]
            assert invocations.sessions.instance_for("e", call.session, [[instance]]) is instance

            taken = _session_call("NEW_SESSION")
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            assert invocations.start(route, taken, lambda a, e: done.set_result((a, e)))
            answer, error = await asyncio.wait_for(done, 1)
            assert error is None and taken.session is not None and taken.opened
            assert taken.opened.startswith(taken.session.encode() + b"; Expires=")
            assert invocations.sessions.instance_for("e", taken.session, [[instance]]) is instance
            assert invocations.sessions.count("e") == 2

    asyncio.run(scenario())
