"""Session bookkeeping (routing/sessions.py): expiry, closing, and the endpoint a
session belongs to."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shipyard.errors import ModelError, RuntimeValidationError, Throttling
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.invocation import SESSION_TABLE_WAIT_S, Invocations
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.sessions import Sessions, key
from shipyard.routing.table import EndpointRoute, VariantRoute
from tests.conftest import wait_until_async
from tests.unit.test_client import _serve as serve
from tests.unit.test_queued_calls import Recording

ONE = Instance("i-1", "v", "http://127.0.0.1:9")
TWO = Instance("i-2", "v", "http://127.0.0.1:10")
BOTH = [[ONE, TWO]]


def _open(
    sessions: Sessions, endpoint: str, instance: Instance, answered: bytes | None = None
) -> str:
    """A session of ``endpoint`` opened on ``instance``, as the invocation opens one: the
    model's good answer to NEW_SESSION, with its New-Session-Id (``answered``) or none."""
    sessions.admit(endpoint)
    session_id, header = sessions.opened(endpoint, instance, answered)
    assert header.startswith(session_id.encode() + b"; Expires=")
    return session_id


def _on(sessions: Sessions, endpoint: str, sid: str, places: Any = BOTH) -> Instance | None:
    """The instance holding ``sid``, as the invocation finds it; raises as it does."""
    pin = sessions.where(endpoint, sid)
    if pin is None:
        raise RuntimeValidationError(f"Session {sid} is not valid: unknown here")
    return sessions.instance_for(pin, places)


def test_a_gateway_id_names_its_instance_and_botocore_takes_it() -> None:
    sessions = Sessions()
    first, second = _open(sessions, "e", ONE), _open(sessions, "e", TWO)
    assert first != second
    assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*", first) and len(first) <= 200
    assert _on(sessions, "e", first) is ONE
    assert _on(sessions, "e", second) is TWO
    # The same instance as another gateway's table has it (control/mirror.py) is found.
    mirrored = Instance("i-2", "v", "http://127.0.0.1:10")
    assert _on(sessions, "e", second, [[ONE, mirrored]]) is mirrored
    # Restarted in place, an instance takes a new address: its sessions are gone.
    restarted = Instance("i-2", "v", "http://127.0.0.1:11")
    assert _on(sessions, "e", second, [[ONE, restarted]]) is None


def test_a_models_id_and_expiry_are_the_sessions() -> None:
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    sid, header = sessions.opened("e", ONE, b"sess-1; Expires=1970-01-01T00:20:00Z")
    assert (sid, header) == ("sess-1", b"sess-1; Expires=1970-01-01T00:20:00Z")
    assert _on(sessions, "e", "sess-1") is ONE and sessions.count("e") == 1
    # Another endpoint's model may use the same id for a session of its own.
    assert sessions.where("f", "sess-1") is None
    sessions.opened("f", TWO, b"sess-1;Expires=1970-01-01T00:30:00+00:00")
    assert _on(sessions, "f", "sess-1") is TWO and _on(sessions, "e", "sess-1") is ONE
    # Without an expiry, the gateway's lifetime; a time with no zone is UTC.
    assert sessions.opened("e", ONE, b"sess-2")[1] == b"sess-2; Expires=1970-01-01T00:17:40Z"
    assert sessions.opened("e", ONE, b"sess-3; Expires=1970-01-01T00:16:41")[0] == "sess-3"
    now[0] = 1_200.0  # sess-1's expiry: over
    with pytest.raises(RuntimeValidationError, match="Session sess-1 is not valid"):
        _on(sessions, "e", "sess-1")
    with pytest.raises(RuntimeValidationError):
        _on(sessions, "e", "sess-3")  # given in the past
    for bad in (b"NEW_SESSION", b"two words", b"-x", b"a" * 257, b"; Expires=x", b"a--"):
        with pytest.raises(ModelError, match="not one"):
            sessions.opened("e", ONE, bad)


def test_a_gateway_session_expires_after_its_ttl_and_is_then_refused() -> None:
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    sid, header = sessions.opened("e", ONE, None)
    assert header == f"{sid}; Expires=1970-01-01T00:17:40Z".encode()
    now[0] += 59
    assert _on(sessions, "e", sid) is ONE
    assert sessions.count("e") == 1
    now[0] += 1
    with pytest.raises(RuntimeValidationError, match=f"Session {sid} is not valid"):
        _on(sessions, "e", sid)
    assert sessions.count("e") == 0


def test_a_closed_session_or_another_endpoints_is_refused() -> None:
    sessions = Sessions()
    sid = _open(sessions, "e", ONE)
    model = _open(sessions, "e", ONE, b"m-1")
    assert sessions.where("other", sid) is None and sessions.where("other", model) is None
    for s in (sid, model):
        sessions.close(s, "other", ONE)  # another endpoint's model cannot close it
        sessions.close(s, "e", TWO)  # nor another instance's
        assert _on(sessions, "e", s) is ONE
        sessions.close(s, "e", ONE)
        with pytest.raises(RuntimeValidationError):
            _on(sessions, "e", s)
    assert sessions.count("e") == 0


def test_ids_made_up_or_altered_or_signed_by_another_store_are_unknown() -> None:
    sessions = Sessions(key=b"k" * 32)
    sid = _open(sessions, "e", ONE)
    later = f"{int(sid[:8], 16) + 3600:08x}" + sid[8:]  # a longer life, unsigned
    other_store = Sessions(key=b"o" * 32)
    for bad in (later, "never-opened", "0" * len(sid), sid.upper() + "0", "zz" * 36, "",
                sid.upper()):  # fmt: skip
        assert sessions.where("e", bad) is None
    assert other_store.where("e", sid) is None
    # Every gateway of one store has its key (storage/secrets.py): any of them routes it.
    assert _on(Sessions(key=b"k" * 32), "e", sid) is ONE


def test_a_closed_session_is_refused_in_every_spelling_and_shared() -> None:
    """A gateway id has one spelling (lower-case hex, as made): a closed session cannot
    come back in upper case. Its close is queued for the store's other gateways, which
    learn it (routing/session_closes.py), by its key."""
    here, there = Sessions(key=b"k" * 32), Sessions(key=b"k" * 32)
    sid = _open(here, "e", ONE)
    here.close(sid, "e", ONE)
    here.close(sid, "e", ONE)  # told twice: shared once
    for spelling in (sid, sid.upper(), sid[:10].upper() + sid[10:]):
        with pytest.raises(RuntimeValidationError):
            _on(here, "e", spelling)
    assert here.closing == [(key("e", sid), float(int(sid[:8], 16)))]
    assert _on(there, "e", sid) is ONE
    there.learn(here.closing)
    with pytest.raises(RuntimeValidationError):
        _on(there, "e", sid)


def test_a_new_session_reaches_the_model_unchanged() -> None:
    """NEW_SESSION goes to the model as the client sent it: the model creates the
    session."""
    sessions = Sessions(key=b"k" * 32)
    invocations = Invocations(Router(timeout_s=5), sessions=sessions)
    call = _session_call("NEW_SESSION")
    assert invocations._session(_table(9), call) is True
    assert call.headers == [(b"X-Amzn-SageMaker-Session-Id", b"NEW_SESSION")]


def test_open_sessions_are_bounded_per_endpoint_and_expired_ones_make_room() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=10, max_open=3, clock=lambda: now[0])
    for n in range(3):
        _open(sessions, "e", ONE, f"s-{n}; Expires=1970-01-01T00:00:{5 + n:02}Z".encode())
    with pytest.raises(Throttling, match="3 open sessions"):
        sessions.admit("e")
    sessions.admit("f")  # each endpoint its own
    sessions.close("s-0", "e", ONE)  # a close makes room at once
    _open(sessions, "e", ONE, b"s-3; Expires=1970-01-01T00:00:05Z")
    with pytest.raises(Throttling):
        sessions.admit("e")
    now[0] = 6.5  # s-1 and s-3 expired
    sessions.admit("e")
    for n in (4, 5):
        _open(sessions, "e", ONE, f"s-{n}".encode())
    with pytest.raises(Throttling):
        sessions.admit("e")
    assert repr(sessions) == "Sessions(live=3, ttl_s=10, max_open=3)"


def test_a_models_expiry_is_cut_to_the_longest_a_session_may_last() -> None:
    """A model that names the last time there is holds its place for ``max_ttl_s``."""
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, max_ttl_s=3_600, max_open=1, clock=lambda: now[0])
    sid, header = sessions.opened("e", ONE, b"s-1; Expires=9999-12-31T23:59:59Z")
    assert header == b"s-1; Expires=1970-01-01T01:16:40Z"  # 1,000 + 3,600
    # A sooner expiry, or the gateway's lifetime, stand.
    assert sessions.opened("f", ONE, b"s-2; Expires=1970-01-01T00:20:00Z")[1].endswith(b"00:20:00Z")
    with pytest.raises(Throttling):
        sessions.admit("e")
    now[0] = 4_600.0
    with pytest.raises(RuntimeValidationError):
        _on(sessions, "e", sid)
    sessions.admit("e")


def test_a_withdrawn_endpoints_sessions_and_expired_ones_are_forgotten() -> None:
    """The table of an endpoint withdrawn (deleted, its fleet gone) takes its sessions
    with it; a NEW_SESSION of any endpoint forgets those expired, so what is kept follows
    the live sessions, also of endpoints no longer asked for new ones."""
    now = [0.0]
    sessions = Sessions(ttl_s=10, clock=lambda: now[0])
    router = Router(timeout_s=5)
    Invocations(router, sessions=sessions)
    router.publish(_table(9))
    for n in range(3):
        _open(sessions, "e", ONE, f"m-{n}".encode())
        _open(sessions, "e", TWO)
    _open(sessions, "f", ONE, b"stays; Expires=1970-01-01T01:00:00Z")
    assert repr(sessions).startswith("Sessions(live=7,")
    router.withdraw("e")
    assert repr(sessions).startswith("Sessions(live=1,") and sessions.count("e") == 0
    with pytest.raises(RuntimeValidationError, match="unknown here"):
        _on(sessions, "e", "m-0")
    # Sessions of an endpoint that opens no more: forgotten once expired.
    for n in range(5):
        _open(sessions, "g", ONE, f"g-{n}".encode())
    now[0] = 10.0
    sessions.admit("f")
    assert repr(sessions).startswith("Sessions(live=1,")
    # Sessions opened and closed by the thousand leave no trace behind them either.
    for _ in range(20_000):
        sid = _open(sessions, "f", ONE)
        sessions.close(sid, "f", ONE)
        now[0] += 0.0001
    assert len(sessions._expiries) < 5_000 and repr(sessions).startswith("Sessions(live=1,")


def test_a_model_cannot_take_another_instances_session() -> None:
    """An id the model answers that is a session live on another instance (or copy) is
    its error: the session stays. Its own instance may open it again, and once it has
    expired or closed any may."""
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, key=b"k" * 32, clock=lambda: now[0])
    _open(sessions, "e", ONE, b"m-1")
    own = _open(sessions, "e", ONE)
    for taken in (b"m-1", b"m-1; Expires=9999-12-31T23:59:59Z", own.encode()):
        with pytest.raises(ModelError, match="open on another instance"):
            sessions.opened("e", TWO, taken)
    assert _on(sessions, "e", "m-1") is ONE and _on(sessions, "e", own) is ONE
    assert sessions.opened("e", ONE, b"m-1")[0] == "m-1"  # its own instance again
    assert sessions.opened("f", TWO, b"m-1")[0] == "m-1"  # another endpoint's own
    sessions.close("m-1", "e", ONE)
    assert sessions.opened("e", TWO, b"m-1")[0] == "m-1"  # closed: free again
    assert _on(sessions, "e", "m-1") is TWO
    now[0] += 61
    assert sessions.opened("e", ONE, b"m-1")[0] == "m-1"  # expired: free again


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
        held = [await router.acquire(route, variant, Call([], b"")) for _ in range(2)]
        on = {flight.instance: flight for flight in held}  # both instances busy
        pinned = asyncio.create_task(
            router.acquire(route, variant, Call([], b"", session="s", pinned=x))
        )
        await asyncio.sleep(0)
        plain = asyncio.create_task(router.acquire(route, variant, Call([], b"")))
        await asyncio.sleep(0)
        on[y].close()
        assert (await asyncio.wait_for(plain, 1)).instance is y
        assert not pinned.done()
        on[x].close()
        assert (await asyncio.wait_for(pinned, 1)).instance is x

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

            def waits_for_a_table() -> bool:
                return len(router._next_table.get("e", ())) == 1

            router.publish(_table(coming=1))  # this gateway knows no instance yet
            waiting = asyncio.create_task(invocations.run(router.routes["e"], _session_call(sid)))
            await wait_until_async(waits_for_a_table, "the request waiting for a table")
            assert not waiting.done()
            router.publish(_table(port, coming=1))  # the next pass lists it
            answer = await asyncio.wait_for(waiting, 1)
            assert answer.body == b"hi" and handler.bodies == [b"hi"]

            # A table that still lacks it (another instance starting, say) is not the
            # end: the wait goes on until one lists it, within SESSION_TABLE_WAIT_S.
            # (A table published wakes every waiter and forgets them: one found waiting
            # again after it is the request that looked at it and waited on.)
            router.publish(_table(coming=2))
            waiting = asyncio.create_task(invocations.run(router.routes["e"], _session_call(sid)))
            await wait_until_async(waits_for_a_table, "the request waiting for a table")
            router.publish(_table(coming=1))
            assert not waits_for_a_table()
            await wait_until_async(waits_for_a_table, "the request waiting for the next one")
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


def test_a_new_session_gets_the_gateways_id_on_either_driver() -> None:
    """NEW_SESSION, awaited (``run``) or on callbacks (``start``, which shares the
    session in a task before telling the answer): a model that answers no id gets the
    gateway's, which names the instance it was sent to."""

    async def scenario() -> None:
        async with _instance() as (handler, port, router, invocations):
            router.publish(_table(port))
            route = router.routes["e"]
            taken = _session_call("NEW_SESSION")
            told: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            assert invocations.start(route, taken, lambda a, e: told.set_result((a, e)))
            answer, error = await asyncio.wait_for(told, 5)
            assert error is None and answer.body == b"hi"
            called = _session_call("NEW_SESSION")
            assert (await invocations.run(route, called)).body == b"hi"
            for call in (taken, called):
                assert call.session is not None and call.opened
                assert call.opened.startswith(call.session.encode() + b"; Expires=")
                # Its shadows (sent after the answer) are told the session's id.
                assert call.headers == [(b"X-Amzn-SageMaker-Session-Id", call.session.encode())]
                instance = route.variants[0].instances[0]
                assert _on(invocations.sessions, "e", call.session, [[instance]]) is instance
            assert invocations.sessions.count("e") == 2

    asyncio.run(scenario())
