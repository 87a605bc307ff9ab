"""The outbox's storage: record_event and EventLog, on SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import inspect

from shipyard.storage.events import DeliveryStatus, EventLog, record_event
from shipyard.storage.metadata import MetadataStore
from tests.events.conftest import FakeClock, make_event, sending_row


def test_the_same_key_recorded_twice_is_one_event(store: MetadataStore) -> None:
    log = EventLog(store.engine)
    assert log.record(make_event("k")) is True
    assert log.record(replace(make_event("k"), subject="again")) is False
    [state] = log.list_events()
    assert state.event.subject == "Job k completed" and state.event.id is not None
    assert log.pending_count() == 1


def test_a_duplicate_leaves_the_callers_transaction_usable(store: MetadataStore) -> None:
    """On PostgreSQL a failed INSERT would abort the whole transaction; ours must not."""
    log = EventLog(store.engine)
    log.record(make_event("k1"))
    with store.engine.begin() as conn:
        assert record_event(conn, make_event("k1")) is False
        assert record_event(conn, make_event("k2")) is True
    assert [s.event.key for s in log.list_events()] == ["k1", "k2"]


def test_an_event_recorded_in_a_rolled_back_transaction_does_not_exist(
    store: MetadataStore,
) -> None:
    with pytest.raises(RuntimeError, match="state change failed"):
        with store.engine.begin() as conn:
            assert record_event(conn, make_event("k", topics=("done",)))
            raise RuntimeError("state change failed")
    assert EventLog(store.engine).list_events() == []


def test_events_round_trip(store: MetadataStore, clock: FakeClock) -> None:
    event = make_event("k", topics=("done", "json://h/x"), time=clock())
    EventLog(store.engine).record(event)
    [state] = EventLog(store.engine).list_events()
    assert replace(state.event, id=None) == event
    assert state.next_attempt_at == clock() and state.attempts == 0
    assert state.dispatched_at is None and state.claimed_until is None


def test_a_leased_event_is_not_claimed_again_until_the_lease_passes(
    store: MetadataStore, clock: FakeClock
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", time=clock()))
    assert [s.event.key for s in log.claim_due(now=clock(), lease_s=60, limit=10)] == ["k"]
    assert log.claim_due(now=clock(), lease_s=60, limit=10) == []
    clock.advance(61)
    [again] = log.claim_due(now=clock(), lease_s=60, limit=10)
    assert again.claimed_until == clock() + timedelta(seconds=60)


def test_rescheduled_and_dispatched_events(store: MetadataStore, clock: FakeClock) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", time=clock()))
    [state] = log.claim_due(now=clock(), lease_s=60, limit=10)
    assert state.event.id is not None
    log.reschedule(state.event.id, at=clock() + timedelta(seconds=5))
    assert log.claim_due(now=clock(), lease_s=60, limit=10) == []
    clock.advance(5)
    [state] = log.claim_due(now=clock(), lease_s=60, limit=10)
    assert state.attempts == 1
    assert state.event.id is not None
    log.mark_dispatched(state.event.id, now=clock())
    clock.advance(3600)
    assert log.claim_due(now=clock(), lease_s=60, limit=10) == []
    assert log.pending_count() == 0 and log.list_events(pending_only=True) == []


def test_a_delivery_row_changes_hands_only_once(store: MetadataStore, clock: FakeClock) -> None:
    """Every change is a compare-and-set on (status, attempts): stale callers lose."""
    log = EventLog(store.engine)
    log.record(make_event("k"))
    assert log.add_delivery(sending_row("k", "json://h/x", at=clock())) is True
    assert log.add_delivery(sending_row("k", "json://h/x", at=clock())) is False
    [sending] = log.deliveries("k")
    assert (sending.status, sending.attempts) == (DeliveryStatus.SENDING, 1)
    assert log.finish_delivery(sending, error="HTTP 500", now=clock()) is True
    assert log.finish_delivery(sending, error=None, now=clock()) is False
    [failed] = log.deliveries("k")
    assert (failed.status, failed.last_error) == (DeliveryStatus.FAILED, "HTTP 500")
    assert log.restart_delivery(failed, now=clock()) is True
    assert log.restart_delivery(failed, now=clock()) is False
    [retrying] = log.deliveries("k")
    assert (retrying.status, retrying.attempts) == (DeliveryStatus.SENDING, 2)
    assert retrying.last_error is None


def test_the_migration_matches_the_tables(store: MetadataStore) -> None:
    inspector = inspect(store.engine)
    assert {"events", "deliveries"} <= set(inspector.get_table_names())
    indexed = {c for ix in inspector.get_indexes("events") for c in ix["column_names"]}
    assert {"next_attempt_at", "dispatched_at"} <= indexed
    assert inspector.get_pk_constraint("deliveries")["constrained_columns"] == [
        "event_key",
        "subscriber",
    ]
