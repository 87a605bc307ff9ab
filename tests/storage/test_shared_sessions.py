"""What the gateways of one store share about sessions, on SQLite and on PostgreSQL: the
key their ids are signed with (storage/secrets.py), made once, the same for every gateway
also when several ask for the first time at once; the sessions closed, and where the
sessions under a model's own id live (storage/sessions.py)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shipyard.errors import ModelError
from shipyard.routing.instance import Instance
from shipyard.routing.session_closes import SessionCloses
from shipyard.routing.sessions import Sessions, key
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.secrets import shared_secret
from shipyard.storage.sessions import ClosedSessions, SessionPins


def _stores(url: str, n: int) -> list[MetadataStore]:
    stores = [MetadataStore(url) for _ in range(n)]
    stores[0].migrate()
    return stores


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_every_gateway_of_a_store_reads_one_key_made_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    stores = _stores(url, 4)
    try:
        with ThreadPoolExecutor(4) as pool:  # four gateways asking first, at once
            keys = list(pool.map(lambda s: shared_secret(s.engine, "sessions"), stores))
        assert len(set(keys)) == 1 and len(keys[0]) == 32
        assert shared_secret(stores[0].engine, "sessions") == keys[0]  # and later
        assert shared_secret(stores[1].engine, "other") not in (keys[0], b"")
        fresh = MetadataStore(f"sqlite:///{tmp_path / 'other.db'}")
        fresh.migrate()
        assert shared_secret(fresh.engine, "sessions") != keys[0]  # another store's own
        fresh.close()
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_closed_sessions_are_read_by_every_gateway_until_they_expire(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """storage/sessions.py, with the exchange loop of routing/session_closes.py: a
    gateway shares the closes its models answered, another learns them, a gateway
    starting later learns those not expired, and expired ones are purged."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    a_store, b_store = _stores(url, 2)
    now = [1_000.0]
    try:
        a = Sessions(key=b"k" * 32, clock=lambda: now[0])
        b = Sessions(key=b"k" * 32, clock=lambda: now[0])
        a.closing += [("s1", 1_500.0), ("s2", 1_010.0)]
        a_loop = SessionCloses(a, ClosedSessions(a_store.engine), period_s=1, clock=lambda: now[0])
        b_loop = SessionCloses(b, ClosedSessions(b_store.engine), period_s=1, clock=lambda: now[0])
        asyncio.run(a_loop.exchange())
        assert not a.closing
        asyncio.run(b_loop.exchange())
        assert b._closed == {"s1": 1_500.0, "s2": 1_010.0}
        a.closing.append(("s3", 1_600.0))
        asyncio.run(a_loop.exchange())
        asyncio.run(b_loop.exchange())
        assert set(b._closed) == {"s1", "s2", "s3"}

        now[0] = 1_100.0  # s2 has expired: a gateway starting now does not need it
        late = Sessions(key=b"k" * 32, clock=lambda: now[0])
        asyncio.run(SessionCloses(late, ClosedSessions(b_store.engine), period_s=1,
                                  clock=lambda: now[0]).exchange())  # fmt: skip
        assert late._closed == {"s1": 1_500.0, "s3": 1_600.0}
        # Its exchange also purged the expired row (at most once a minute per gateway).
        rows, _ = ClosedSessions(a_store.engine).since(0, 0.0)
        assert sorted(rows) == [("s1", 1_500.0), ("s3", 1_600.0)]
    finally:
        a_store.close()
        b_store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_close_after_the_table_emptied_is_still_learned(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every close expired and purged, the table is empty; a reader far along still
    learns the next close (SQLite would reuse a seq without AUTOINCREMENT)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    (store,) = _stores(url, 1)
    try:
        closed = ClosedSessions(store.engine)
        closed.record((f"s{n}", 1_010.0) for n in range(1_500))  # more than any overlap
        rows, seq = closed.since(0, 1_000.0)
        assert len(rows) == 1_500 and seq >= 1_500
        assert closed.purge(2_000.0) == 1_500
        closed.record([("late", 3_000.0)])
        assert closed.since(seq, 2_000.0)[0] == [("late", 3_000.0)]
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_models_own_session_is_routed_by_every_gateway_of_the_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A session opened under a model's own id through one gateway is found by another
    (storage/sessions.py's pins), until it is closed (the close, shared, drops the pin)
    or expires (purged)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    a_store, b_store = _stores(url, 2)
    now = [1_000.0]
    held = Instance("i-1", "v", "http://127.0.0.1:9")
    try:
        a = Sessions(key=b"k" * 32, clock=lambda: now[0], pins=SessionPins(a_store.engine))
        b = Sessions(key=b"k" * 32, clock=lambda: now[0], pins=SessionPins(b_store.engine))
        for sid, expires in (("m-1", "00:25:00"), ("m-2", "00:20:00")):
            header = f"{sid}; Expires=1970-01-01T{expires}Z".encode()
            assert a.opened("e", held, header)[0] == sid
            asyncio.run(a.share("e", sid))
        gateway_id, _ = a.opened("e", held, None)
        asyncio.run(a.share("e", gateway_id))  # the gateway's own ids need no pin

        assert b.where("e", "m-1") is None  # not known here: the store says where
        assert asyncio.run(b.fetch("e", "m-1")) is True
        assert b.where("e", "m-1") == (held.digest, 1_500.0)
        assert asyncio.run(b.fetch("f", "m-1")) is False  # another endpoint's is not it
        assert asyncio.run(b.fetch("e", "never")) is False
        assert SessionPins(b_store.engine).find(key("e", gateway_id), now[0]) is None

        a.close("m-2", "e", held)
        b_loop = SessionCloses(b, ClosedSessions(b_store.engine), period_s=1, clock=lambda: now[0])
        a_loop = SessionCloses(a, ClosedSessions(a_store.engine), period_s=1, clock=lambda: now[0])
        asyncio.run(a_loop.exchange())
        assert asyncio.run(b.fetch("e", "m-2")) is False  # closed: its pin is gone

        now[0] = 1_600.0  # m-1 expired: no longer found, and purged
        assert asyncio.run(b.fetch("e", "m-1")) is False
        asyncio.run(b_loop.exchange())
        assert ClosedSessions(a_store.engine).purge(now[0]) == 0
    finally:
        a_store.close()
        b_store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_model_cannot_take_a_session_open_through_another_gateway(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A model's id live on an instance, recorded by one gateway, is not moved by another
    gateway whose model (another instance, or copy) answers the same id: that answer is
    the model's error, and the session stays where it is, in the store and here."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    a_store, b_store = _stores(url, 2)
    now = [1_000.0]
    held = Instance("i-1", "v", "http://127.0.0.1:9")
    other = Instance("i-2", "v", "http://127.0.0.1:10")
    try:
        a = Sessions(key=b"k" * 32, clock=lambda: now[0], pins=SessionPins(a_store.engine))
        b = Sessions(key=b"k" * 32, clock=lambda: now[0], pins=SessionPins(b_store.engine))
        a.opened("e", held, b"m-1; Expires=1970-01-01T00:25:00Z")
        asyncio.run(a.share("e", "m-1"))
        b.opened("e", other, b"m-1")  # b knows nothing of it: the store does
        with pytest.raises(ModelError, match="open on another instance"):
            asyncio.run(b.share("e", "m-1"))
        assert b.where("e", "m-1") is None  # no longer pinned here
        assert asyncio.run(b.fetch("e", "m-1")) is True
        assert b.where("e", "m-1") == (held.digest, 1_500.0)

        pins = SessionPins(b_store.engine)
        assert pins.record(key("e", "m-1"), other.digest, 1_400.0, now[0]) is False
        assert pins.record(key("e", "m-1"), held.digest, 1_400.0, now[0]) is True  # its own
        assert pins.find(key("e", "m-1"), now[0]) == (held.digest, 1_400.0)
        now[0] = 1_400.0  # expired: any instance may use the id again
        assert pins.record(key("e", "m-1"), other.digest, 2_000.0, now[0]) is True
        assert pins.find(key("e", "m-1"), now[0]) == (other.digest, 2_000.0)
    finally:
        a_store.close()
        b_store.close()
