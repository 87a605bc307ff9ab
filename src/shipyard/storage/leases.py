"""LeaseStore: one holder at a time per resource, taken over when the holder goes silent.

A lease is a row ``(kind, name)`` with a holder and an expiry; an endpoint's fleet is
reconciled only by the gateway holding its lease, however many gateways share the store.

- **Compare-and-set per row.** ``claim`` renews what this holder has and takes what
  nobody holds or what has expired, in one ``UPDATE … WHERE holder = :me OR holder IS
  NULL OR expires_at < :now``. On PostgreSQL two gateways racing for one expired row
  queue on its row lock, and the second re-checks the WHERE against the winner's row, no
  longer expired: it gets nothing. On SQLite, BEGIN IMMEDIATE runs claims one at a time.
- **One clock.** Expiry is measured on the database's clock on PostgreSQL, so gateways
  on hosts whose clocks disagree still agree on when a lease has passed, and on this
  process's clock on SQLite, which only one host uses.
- **Terms.** ``term`` grows each time the lease changes hands, so what a holder recorded
  is told apart from what its successor records.
- **Fenced records.** The holder of an endpoint's lease records its fleet's routes in
  the lease's row (``record_routes``), for the gateways that do not run the fleet; the
  write only lands while the writer holds the lease, so a gateway that lost it cannot
  overwrite what the new holder recorded. The gateway that takes a lease over is told
  what its previous holder recorded (``claim``'s ``taken``): on a backend whose
  instances outlive their gateway, the fleet it may adopt.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, delete, func, or_, select, update

from shipyard.storage import tables as t
from shipyard.storage.transactions import transaction, upsert

_L = t.leases

ENDPOINT = "endpoint"
"""The kind of the lease on an endpoint's fleet."""
TRAINING_JOB = "training-job"
"""The kind of the lease on a training job: who watches its runner."""
PROCESSING_JOB = "processing-job"
"""The kind of the lease on a processing job: who watches its runner."""
MONITORING = "monitoring-schedules"
"""The kind of the one lease on every monitoring schedule: who starts their runs."""
TRANSFORM_JOB = "transform-job"
"""The kind of the lease on a batch transform job: who runs it."""


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease as the store has it; ``routes`` is what its holder last recorded."""

    name: str
    holder: str | None
    term: int
    expires_at: datetime
    routes: dict[str, Any] | None


class LeaseStore:
    """Claims, renews and releases leases for one ``holder``; records fleets' routes."""

    def __init__(self, engine: Engine, *, holder: str) -> None:
        self.engine = engine
        self.holder = holder

    def __repr__(self) -> str:
        return f"LeaseStore(holder={self.holder!r})"

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with transaction(self.engine) as conn:
            yield conn

    def claim(
        self,
        kind: str,
        names: Collection[str],
        *,
        lease_s: float,
        taken: dict[str, dict[str, Any]] | None = None,
    ) -> dict[str, int]:
        """Renew or take the leases on ``names``; return those held now, with their terms.

        Leases of ``kind`` this holder has on anything not in ``names`` (a resource
        deleted since) are dropped in the same transaction. ``taken``, if given, gets
        the routes recorded under each lease taken from another holder (one that
        expired: a lease handed back has none).
        """
        with self._tx() as conn:
            now = _now(conn)
            mine = and_(_L.c.kind == kind, _L.c.holder == self.holder)
            conn.execute(delete(_L).where(mine, _L.c.name.not_in(list(names))))
            if not names:
                return {}
            _insert_missing(conn, kind, names, now)
            if taken is not None:
                # Locked (PostgreSQL): a gateway racing for the same rows waits here, then
                # reads them as the winner left them, no longer expired.
                expired = (
                    select(_L.c.name, _L.c.routes)
                    .where(
                        _L.c.kind == kind,
                        _L.c.name.in_(list(names)),
                        _L.c.holder != self.holder,
                        _L.c.expires_at < now,
                    )
                    .with_for_update()
                )
                recorded = {row.name: row.routes for row in conn.execute(expired)}
            free = or_(_L.c.holder == self.holder, _L.c.holder.is_(None), _L.c.expires_at < now)
            conn.execute(
                update(_L)
                .where(_L.c.kind == kind, _L.c.name.in_(list(names)), free)
                .values(
                    holder=self.holder,
                    expires_at=now + timedelta(seconds=lease_s),
                    term=case((_L.c.holder == self.holder, _L.c.term), else_=_L.c.term + 1),
                    # What the previous holder recorded describes a fleet no one runs now.
                    routes=case((_L.c.holder == self.holder, _L.c.routes), else_=None),
                )
            )
            held = select(_L.c.name, _L.c.term).where(mine, _L.c.name.in_(list(names)))
            terms = {row.name: int(row.term) for row in conn.execute(held)}
            if taken is not None:
                taken.update((n, r) for n, r in recorded.items() if n in terms and r)
            return terms

    def release(self, kind: str, names: Collection[str]) -> None:
        """Give up the leases on ``names`` at once, and what was recorded under them: the
        next gateway takes them without waiting for them to expire."""
        if not names:
            return
        with self._tx() as conn:
            conn.execute(
                update(_L)
                .where(
                    _L.c.kind == kind,
                    _L.c.name.in_(list(names)),
                    _L.c.holder == self.holder,
                )
                .values(holder=None, expires_at=_now(conn), routes=None)
            )

    def record_routes(self, name: str, routes: dict[str, Any] | None) -> bool:
        """Record the routes of the fleet of endpoint ``name``; False, and nothing
        written, when this holder does not hold its lease."""
        held = and_(_L.c.kind == ENDPOINT, _L.c.name == name, _L.c.holder == self.holder)
        with self._tx() as conn:
            return bool(conn.execute(update(_L).where(held).values(routes=routes)).rowcount)

    def held_elsewhere(self, kind: str) -> dict[str, Lease]:
        """Every lease of ``kind`` not held by this holder, by name."""
        query = select(_L).where(
            _L.c.kind == kind, or_(_L.c.holder.is_(None), _L.c.holder != self.holder)
        )
        with self._tx() as conn:
            rows = conn.execute(query).mappings().all()
        return {row["name"]: _lease(row) for row in rows}

    def get(self, kind: str, name: str) -> Lease | None:
        query = select(_L).where(_L.c.kind == kind, _L.c.name == name)
        with self._tx() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else _lease(row)


def _now(conn: Connection) -> datetime:
    """The time leases are measured by: the database's on PostgreSQL, else ours."""
    if conn.dialect.name == "postgresql":
        value: datetime = conn.execute(select(func.now())).scalar_one()
        return value
    return datetime.now(UTC)


def _insert_missing(conn: Connection, kind: str, names: Collection[str], now: datetime) -> None:
    """A free, already expired lease for each of ``names`` that has none yet."""
    # In one order on every gateway, so two inserting at once never deadlock.
    rows = [
        {"kind": kind, "name": name, "holder": None, "expires_at": now, "term": 0}
        for name in sorted(names)
    ]
    statement = upsert(conn.dialect.name, _L).values(rows)
    conn.execute(statement.on_conflict_do_nothing(index_elements=["kind", "name"]))


def _lease(row: Any) -> Lease:
    expires = row["expires_at"]
    return Lease(
        name=row["name"],
        holder=row["holder"],
        term=int(row["term"]),
        expires_at=expires if expires.tzinfo else expires.replace(tzinfo=UTC),
        routes=row["routes"],
    )
