"""The outbox: events recorded with the change that caused them, and their deliveries.

``record_event(conn, event)`` runs inside the caller's own transaction, so an event exists
if and only if the state change it announces was committed: write the change and its
event in one transaction, or a crash between the two loses the notification (or
announces a change that never happened). The event key is unique; recording it again is
a no-op, so a change seen twice is announced once.

``EventLog`` holds the dispatcher's queries. Each call is one short transaction, and
every state change of a delivery row is a compare-and-set on ``(status, attempts)``: the
pair changes on every transition, so of two dispatchers racing for the same subscriber
exactly one wins. Events are claimed with a lease (``claimed_until``), on PostgreSQL with
``FOR UPDATE SKIP LOCKED``, so gateways sharing a database split the work instead of
doing it twice; the lease is an optimisation, the per-row compare-and-set is the guard.

Every timestamp is stored as UTC. The callers' clock is used throughout, never the
database's, so tests can inject time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    func,
    or_,
    select,
    update,
)

from shipyard.records import Event
from shipyard.storage import tables as t
from shipyard.storage.transactions import insert_new, transaction


class DeliveryStatus(StrEnum):
    """Where one subscriber stands for one event."""

    SENDING = "sending"
    """Claimed by a dispatcher, committed before the send; stale once its lease passes."""
    SENT = "sent"
    """The subscriber accepted it. Final."""
    FAILED = "failed"
    """The last attempt failed; retried until ``max_attempts``, then final."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One subscriber of one event, as the ``deliveries`` table holds it."""

    event_key: str
    subscriber: str
    """``subscriber_key(url)``: a hash, so the store never holds a URL's secrets."""
    target: str
    """The URL with its secrets redacted (or the unknown topic's name), for display."""
    topic: str
    status: DeliveryStatus
    attempts: int
    last_error: str | None
    updated: datetime


@dataclass(frozen=True, slots=True)
class EventState:
    """An event and where its dispatch stands."""

    event: Event
    attempts: int
    """Dispatch passes that ended with a subscriber still unsettled; drives the backoff."""
    next_attempt_at: datetime
    claimed_until: datetime | None
    dispatched_at: datetime | None
    """Set once every subscriber is settled (sent, or given up)."""


def subscriber_key(url: str) -> str:
    """A stable identity for a subscriber URL that carries none of its secrets."""
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()


def record_event(conn: Connection, event: Event) -> bool:
    """Add ``event`` to the outbox inside the caller's transaction; True when it is new.

    A key that already exists is left as it is (``ON CONFLICT DO NOTHING``), which
    neither raises nor aborts the caller's transaction. The event is due at
    ``event.time``.
    """
    row = {
        "key": event.key,
        "detail_type": event.detail_type,
        "source": event.source,
        "resource": event.resource,
        "detail": event.detail,
        "topics": list(event.topics),
        "subject": event.subject,
        "message": event.message,
        "time": _utc(event.time),
        "next_attempt_at": _utc(event.time),
        "attempts": 0,
    }
    return insert_new(conn, t.events, row, ["key"])


class EventLog:
    """The dispatcher's queries over the outbox. Synchronous; run them in a thread."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __repr__(self) -> str:
        return f"EventLog({self._engine.url.render_as_string(hide_password=True)!r})"

    def record(self, event: Event) -> bool:
        """``record_event`` in a transaction of its own."""
        with transaction(self._engine) as conn:
            return record_event(conn, event)

    def claim_due(self, *, now: datetime, lease_s: float, limit: int) -> list[EventState]:
        """Lease up to ``limit`` undispatched events due at ``now``, oldest first.

        An event leased by someone else is skipped until its lease passes, so a dispatcher
        that crashed mid-event hands it over after ``lease_s``.
        """
        now = _utc(now)
        due = _due(now)
        query = select(t.events).where(due).order_by(t.events.c.id).limit(limit)
        claimed: list[EventState] = []
        with transaction(self._engine) as conn:
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)
            for row in conn.execute(query).mappings().all():
                lease = update(t.events).where(t.events.c.id == row["id"], due)
                until = now + timedelta(seconds=lease_s)
                if conn.execute(lease.values(claimed_until=until)).rowcount == 1:
                    claimed.append(_event_state(row, claimed_until=until))
        return claimed

    def release_claims(self) -> int:
        """Drop the leases on undispatched events, as a dispatcher starts.

        Leases left by a dispatcher that died would otherwise hold its events back for
        ``lease_s``. Safe with other dispatchers still running: each subscriber is
        claimed by its own delivery row, so an event worked on twice is sent once.
        """
        pending = and_(t.events.c.dispatched_at.is_(None), t.events.c.claimed_until.is_not(None))
        with transaction(self._engine) as conn:
            result = conn.execute(update(t.events).where(pending).values(claimed_until=None))
            return int(result.rowcount)

    def deliveries(self, event_key: str) -> list[Delivery]:
        table = t.deliveries
        query = select(table).where(table.c.event_key == event_key).order_by(table.c.topic)
        with transaction(self._engine) as conn:
            return [_delivery(r) for r in conn.execute(query).mappings().all()]

    def add_delivery(self, delivery: Delivery) -> bool:
        """Insert ``delivery`` unless its subscriber has a row; False when it has one.

        Claiming a new subscriber is this insert with status 'sending': of two
        dispatchers, the second one's insert finds the row and loses.
        """
        row = {
            "event_key": delivery.event_key,
            "subscriber": delivery.subscriber,
            "target": delivery.target,
            "topic": delivery.topic,
            "status": delivery.status.value,
            "attempts": delivery.attempts,
            "last_error": delivery.last_error,
            "updated": _utc(delivery.updated),
        }
        with transaction(self._engine) as conn:
            return insert_new(conn, t.deliveries, row, ["event_key", "subscriber"])

    def restart_delivery(self, seen: Delivery, *, now: datetime) -> bool:
        """Move ``seen`` back to 'sending' as its next attempt; False if it changed since."""
        return self._change_delivery(
            seen, status=DeliveryStatus.SENDING, attempts=seen.attempts + 1, error=None, now=now
        )

    def finish_delivery(self, sending: Delivery, *, error: str | None, now: datetime) -> bool:
        """Settle a 'sending' row as 'sent' (no error) or 'failed'; False if it changed since.

        False means another dispatcher took the row over after our lease passed.
        """
        status = DeliveryStatus.SENT if error is None else DeliveryStatus.FAILED
        return self._change_delivery(
            sending, status=status, attempts=sending.attempts, error=error, now=now
        )

    def reschedule(self, event_id: int, *, at: datetime) -> None:
        """Release the lease; try the event again at ``at`` (one more failed pass)."""
        self._update_event(
            event_id, next_attempt_at=_utc(at), attempts=t.events.c.attempts + 1, claimed_until=None
        )

    def mark_dispatched(self, event_id: int, *, now: datetime) -> None:
        self._update_event(event_id, dispatched_at=_utc(now), claimed_until=None)

    def list_events(self, *, pending_only: bool = False, limit: int = 1000) -> list[EventState]:
        """Events in the order they were recorded; with ``pending_only``, undispatched ones."""
        query = select(t.events).order_by(t.events.c.id).limit(limit)
        if pending_only:
            query = query.where(t.events.c.dispatched_at.is_(None))
        with transaction(self._engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [_event_state(r) for r in rows]

    def recent_events(self, limit: int) -> list[EventState]:
        """The ``limit`` events recorded last, newest first (the console's events log)."""
        query = select(t.events).order_by(t.events.c.id.desc()).limit(limit)
        with transaction(self._engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [_event_state(r) for r in rows]

    def recent_about(
        self, resource: str, detail_types: Sequence[str], limit: int
    ) -> list[EventState]:
        """The ``limit`` newest events of ``detail_types`` about ``resource`` (an ARN),
        newest first: an endpoint's deployment history, read without decoding the rest."""
        c = t.events.c
        query = (
            select(t.events)
            .where(c.resource == resource, c.detail_type.in_(list(detail_types)))
            .order_by(c.id.desc())
            .limit(limit)
        )
        with transaction(self._engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [_event_state(r) for r in rows]

    def pending_count(self) -> int:
        """Events not yet dispatched: the outbox backlog."""
        query = select(func.count()).select_from(t.events)
        with transaction(self._engine) as conn:
            return int(conn.execute(query.where(t.events.c.dispatched_at.is_(None))).scalar_one())

    def _change_delivery(
        self,
        seen: Delivery,
        *,
        status: DeliveryStatus,
        attempts: int,
        error: str | None,
        now: datetime,
    ) -> bool:
        c = t.deliveries.c
        query = (
            update(t.deliveries)
            .where(
                c.event_key == seen.event_key,
                c.subscriber == seen.subscriber,
                c.status == seen.status.value,
                c.attempts == seen.attempts,
            )
            .values(status=status.value, attempts=attempts, last_error=error, updated=_utc(now))
        )
        with transaction(self._engine) as conn:
            return bool(conn.execute(query).rowcount == 1)

    def _update_event(self, event_id: int, **values: Any) -> None:
        query = update(t.events).where(t.events.c.id == event_id).values(**values)
        with transaction(self._engine) as conn:
            conn.execute(query)


def _due(now: datetime) -> ColumnElement[bool]:
    c = t.events.c
    free = or_(c.claimed_until.is_(None), c.claimed_until <= now)
    return and_(c.dispatched_at.is_(None), c.next_attempt_at <= now, free)


def _utc(value: datetime) -> datetime:
    # SQLite drops the zone, so every stored timestamp must already be UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _opt_utc(value: datetime | None) -> datetime | None:
    return None if value is None else _utc(value)


def _event_state(row: Any, *, claimed_until: datetime | None = None) -> EventState:
    event = Event(
        key=row["key"],
        detail_type=row["detail_type"],
        source=row["source"],
        resource=row["resource"],
        detail=dict(row["detail"] or {}),
        topics=tuple(row["topics"] or ()),
        subject=row["subject"],
        message=row["message"],
        time=_utc(row["time"]),
        id=int(row["id"]),
    )
    return EventState(
        event=event,
        attempts=int(row["attempts"]),
        next_attempt_at=_utc(row["next_attempt_at"]),
        claimed_until=claimed_until or _opt_utc(row["claimed_until"]),
        dispatched_at=_opt_utc(row["dispatched_at"]),
    )


def _delivery(row: Any) -> Delivery:
    return Delivery(
        event_key=row["event_key"],
        subscriber=row["subscriber"],
        target=row["target"],
        topic=row["topic"],
        status=DeliveryStatus(row["status"]),
        attempts=int(row["attempts"]),
        last_error=row["last_error"],
        updated=_utc(row["updated"]),
    )
