"""LeaseStore on SQLite and, where it runs, PostgreSQL: one holder at a time."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from shipyard.leases import Leases
from shipyard.storage.leases import ENDPOINT, LeaseStore
from shipyard.storage.metadata import MetadataStore


def test_a_lease_held_and_renewed_is_not_taken_by_another_holder(meta: MetadataStore) -> None:
    a, b = LeaseStore(meta.engine, holder="a"), LeaseStore(meta.engine, holder="b")
    assert a.claim(ENDPOINT, ["e1", "e2"], lease_s=30) == {"e1": 1, "e2": 1}
    assert b.claim(ENDPOINT, ["e1", "e2", "e3"], lease_s=30) == {"e3": 1}
    assert a.claim(ENDPOINT, ["e1", "e2", "e3"], lease_s=30) == {"e1": 1, "e2": 1}


def test_an_expired_lease_passes_to_the_next_claimer_with_a_new_term(
    meta: MetadataStore,
) -> None:
    a, b = LeaseStore(meta.engine, holder="a"), LeaseStore(meta.engine, holder="b")
    assert a.claim(ENDPOINT, ["e1"], lease_s=0.2) == {"e1": 1}
    time.sleep(0.3)
    assert a.record_routes("e1", {"config": "c", "variants": []})
    assert b.claim(ENDPOINT, ["e1"], lease_s=30) == {"e1": 2}
    assert a.claim(ENDPOINT, ["e1"], lease_s=30) == {}
    lease = a.get(ENDPOINT, "e1")
    assert lease is not None and lease.holder == "b" and lease.term == 2
    assert lease.routes is None  # the old holder's fleet is not the new one's


def test_the_next_holder_is_told_what_a_holder_that_died_recorded_and_nothing_else(
    meta: MetadataStore,
) -> None:
    a, b = LeaseStore(meta.engine, holder="a"), LeaseStore(meta.engine, holder="b")
    c = LeaseStore(meta.engine, holder="c")
    routes: dict[str, Any] = {"config": "c", "variants": [{"name": "v1", "instances": []}]}
    c.claim(ENDPOINT, ["held"], lease_s=30)
    assert c.record_routes("held", routes)
    a.claim(ENDPOINT, ["died", "handed-back"], lease_s=0.2)
    assert a.record_routes("died", routes) and a.record_routes("handed-back", routes)
    a.release(ENDPOINT, ["handed-back"])
    time.sleep(0.3)
    taken: dict[str, dict[str, Any]] = {}
    terms = b.claim(ENDPOINT, ["died", "handed-back", "held"], lease_s=30, taken=taken)
    assert sorted(terms) == ["died", "handed-back"]
    assert taken == {"died": routes}  # a lease handed back was stopped with its fleet
    again: dict[str, dict[str, Any]] = {}
    b.claim(ENDPOINT, ["died", "handed-back"], lease_s=30, taken=again)
    assert again == {}  # told once, as the lease changes hands


def test_routes_are_recorded_only_by_the_holder_and_released_with_the_lease(
    meta: MetadataStore,
) -> None:
    a, b = LeaseStore(meta.engine, holder="a"), LeaseStore(meta.engine, holder="b")
    a.claim(ENDPOINT, ["e1"], lease_s=30)
    assert a.record_routes("e1", {"config": "c", "variants": []})
    assert not b.record_routes("e1", {"config": "stale", "variants": []})
    seen = b.held_elsewhere(ENDPOINT)["e1"]
    assert seen.holder == "a" and seen.routes == {"config": "c", "variants": []}
    assert a.held_elsewhere(ENDPOINT) == {}
    a.release(ENDPOINT, ["e1"])
    assert b.held_elsewhere(ENDPOINT)["e1"].routes is None
    assert b.claim(ENDPOINT, ["e1"], lease_s=30) == {"e1": 2}


def test_the_leases_of_deleted_endpoints_are_dropped_by_their_holder(
    meta: MetadataStore,
) -> None:
    a = LeaseStore(meta.engine, holder="a")
    a.claim(ENDPOINT, ["e1", "e2"], lease_s=30)
    assert a.claim(ENDPOINT, ["e2"], lease_s=30) == {"e2": 1}
    assert a.get(ENDPOINT, "e1") is None


def test_of_many_holders_racing_for_free_leases_each_lease_goes_to_exactly_one(
    meta: MetadataStore,
) -> None:
    names = [f"e{i}" for i in range(20)]
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    gate = threading.Barrier(4)

    def race(holder: str) -> None:
        store = LeaseStore(meta.engine, holder=holder)
        gate.wait()
        try:
            for _ in range(5):
                for name in store.claim(ENDPOINT, names, lease_s=30):
                    won.setdefault(name, [])
                    if holder not in won[name]:
                        won[name].append(holder)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(f"h{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(won) == sorted(names)
    assert all(len(holders) == 1 for holders in won.values()), won


class _CountingStore(LeaseStore):
    """The real store, counting the claims that reach it; ``fail_after`` makes a claim
    naming something raise once it has committed (its reply lost)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims = 0
        self.fail_after = False

    def claim(self, *args: Any, **kwargs: Any) -> dict[str, int]:
        self.claims += 1
        terms = super().claim(*args, **kwargs)
        if self.fail_after and args[1]:
            raise ConnectionError("the reply was lost after the commit")
        return terms


def _counted(meta: MetadataStore) -> tuple[_CountingStore, LeaseStore, Leases]:
    """Holder a's leases over a counting store, and holder b's store beside it."""
    store = _CountingStore(meta.engine, holder="a")
    leases = Leases(store=store, kind=ENDPOINT, lease_s=30, renew_s=1)
    return store, LeaseStore(meta.engine, holder="b"), leases


def test_an_idle_kind_claims_from_the_store_only_until_it_holds_nothing(
    meta: MetadataStore,
) -> None:
    store, other, leases = _counted(meta)

    async def passes() -> None:
        assert await leases.claim([]) == set()
        assert await leases.claim([]) == set()
        assert store.claims == 1  # the second pass had nothing to renew, take or drop
        assert await leases.claim(["e1"]) == {"e1"}
        assert other.claim(ENDPOINT, ["e1"], lease_s=30) == {}
        assert await leases.claim([]) == set()  # e1 deleted: its lease is dropped...
        assert store.claims == 3
        assert other.claim(ENDPOINT, ["e1"], lease_s=30) == {"e1": 1}  # ...at once
        assert await leases.claim([]) == set()
        assert store.claims == 3

    asyncio.run(passes())


def test_a_claim_that_committed_and_failed_is_dropped_by_the_next_empty_one(
    meta: MetadataStore,
) -> None:
    store, other, leases = _counted(meta)

    async def passes() -> None:
        assert await leases.claim([]) == set()
        store.fail_after = True
        assert await leases.claim(["e1"]) == set()  # failed: nothing counted as held here
        store.fail_after = False
        assert other.claim(ENDPOINT, ["e1"], lease_s=30) == {}  # but the store has it
        assert await leases.claim([]) == set()
        assert store.claims == 3  # so the empty claim went to the store
        assert other.claim(ENDPOINT, ["e1"], lease_s=30) == {"e1": 1}

    asyncio.run(passes())
