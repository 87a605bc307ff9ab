"""AsyncQueue: the durable queue of asynchronous invocations, in the metadata store.

The queue survives restarts because it is a table. Guarantees:

- **Idempotent enqueue.** ``(endpoint, inference_id)`` is unique: a repeated Inference-Id
  returns the request already queued (or done) and queues nothing.
- **Bounded enqueue.** Given a bound, an endpoint's unfinished requests are counted in the
  transaction that queues one (SQLite's ``BEGIN IMMEDIATE`` serialises them; on
  PostgreSQL concurrent puts may pass it by as many as race), and one beyond it is
  refused with :class:`QueueFull`.
- **Leased claims.** A claim marks requests Running with an owner and a lease; a request
  whose owner died is claimable again once its lease has passed. On PostgreSQL claims use
  ``FOR UPDATE SKIP LOCKED``, so gateways sharing a database never claim the same request
  at once; on SQLite, ``BEGIN IMMEDIATE`` serialises them.
- **Compare-and-set completion.** ``finish`` succeeds only for the owner holding the lease;
  the outcome and its notification event are written in one transaction, so a request is
  announced once, by the worker whose outcome stands.
- **Inline bodies leave with the request.** An input sent inline is kept only while its
  request is unfinished: the transaction that finishes it (done, failed or expired) also
  clears its body, so finished rows hold no client bytes and a finished request can never
  be run again from one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from shipyard.records import AsyncRequest, AsyncStatus, Event
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.metadata import _utc as utc
from shipyard.storage.transactions import transaction

_Q = t.async_requests
_WAITING = (AsyncStatus.QUEUED.value, AsyncStatus.RUNNING.value)


class QueueFull(Exception):
    """An endpoint already holds its most unfinished requests; nothing was queued."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} requests waiting")
        self.waiting = waiting


@dataclass(frozen=True, slots=True)
class Backlog:
    """What CloudWatch's async metrics are computed from, for one endpoint."""

    queued: int
    running: int
    oldest_received: datetime | None


class AsyncQueue:
    """Enqueue, claim and finish asynchronous invocations; records in, records out."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"AsyncQueue({self.engine.url.render_as_string(hide_password=True)!r})"

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with transaction(self.engine) as conn:
            yield conn

    def enqueue(
        self, request: AsyncRequest, *, max_waiting: int | None = None
    ) -> tuple[AsyncRequest, bool]:
        """Queue ``request``; return it and True, or the earlier one with its id and False.

        Raises:
            QueueFull: its endpoint holds ``max_waiting`` unfinished requests already
                (and none with its inference id).
        """
        try:
            with self._tx() as conn:
                if max_waiting is not None:
                    waiting = _count_waiting(conn, request.endpoint)
                    if waiting >= max_waiting:
                        earlier = _find(conn, request.endpoint, request.inference_id)
                        if earlier is None:
                            raise QueueFull(waiting)
                        return earlier, False
                result = conn.execute(insert(_Q).values(**_row(request)))
                key = result.inserted_primary_key
                assert key is not None
                return replace(request, id=int(key[0])), True
        except IntegrityError:
            return self.get(request.endpoint, request.inference_id), False

    def get(self, endpoint: str, inference_id: str) -> AsyncRequest:
        with self._tx() as conn:
            found = _find(conn, endpoint, inference_id)
        if found is None:
            raise LookupError(f"no asynchronous request {inference_id!r} for {endpoint!r}")
        return found

    def claim(
        self, endpoint: str, *, owner: str, limit: int, now: datetime, lease_s: float
    ) -> list[AsyncRequest]:
        """Take up to ``limit`` requests, oldest first: queued ones, and running ones whose
        lease has passed (their gateway died). Each leaves Running, owned by ``owner``,
        with a lease of ``lease_s``, which the owner renews while it runs it (``renew``)."""
        if limit <= 0:
            return []
        claimable = or_(
            _Q.c.status == AsyncStatus.QUEUED.value,
            and_(_Q.c.status == AsyncStatus.RUNNING.value, _Q.c.lease_until < now),
        )
        query = (
            select(_Q).where(_Q.c.endpoint == endpoint, claimable).order_by(_Q.c.id).limit(limit)
        )
        with self._tx() as conn:
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)
            rows = conn.execute(query).mappings().all()
            claimed = []
            for row in rows:
                request = replace(
                    _request(row),
                    status=AsyncStatus.RUNNING,
                    owner=owner,
                    attempts=int(row["attempts"]) + 1,
                    started=now,
                    lease_until=now + timedelta(seconds=lease_s),
                )
                conn.execute(update(_Q).where(_Q.c.id == row["id"]).values(**_row(request)))
                claimed.append(request)
            return claimed

    def finish(
        self,
        request: AsyncRequest,
        *,
        status: AsyncStatus,
        now: datetime,
        failure_reason: str | None = None,
        event: Event | None = None,
    ) -> bool:
        """Record the outcome if ``request.owner`` still holds it; False if it does not."""
        assert request.id is not None
        held = and_(
            _Q.c.id == request.id,
            _Q.c.owner == request.owner,
            _Q.c.status == AsyncStatus.RUNNING.value,
        )
        values = {
            "status": status.value,
            "finished": now,
            "failure_reason": failure_reason,
            "body": None,  # an inline input is not kept past its request
        }
        with self._tx() as conn:
            if conn.execute(update(_Q).where(held).values(**values)).rowcount != 1:
                return False
            if event is not None:
                record_event(conn, event)
            return True

    def release(self, request: AsyncRequest) -> None:
        """Give back a claimed request that was not started (no instance took it)."""
        held = and_(_Q.c.id == request.id, _Q.c.owner == request.owner)
        values = {"status": AsyncStatus.QUEUED.value, "owner": None, "lease_until": None}
        with self._tx() as conn:
            conn.execute(
                update(_Q).where(held, _Q.c.status == AsyncStatus.RUNNING.value).values(**values)
            )

    def renew(self, owner: str, until: datetime) -> int:
        """Extend the leases of the requests ``owner`` runs to ``until``; how many."""
        held = and_(_Q.c.owner == owner, _Q.c.status == AsyncStatus.RUNNING.value)
        with self._tx() as conn:
            return int(conn.execute(update(_Q).where(held).values(lease_until=until)).rowcount)

    def release_owned(self, owner: str) -> int:
        """Requeue every request ``owner`` was running: a gateway calls this as it starts,
        for what its previous run (same owner, now dead) left behind, rather than waiting
        for their leases to pass."""
        held = and_(_Q.c.owner == owner, _Q.c.status == AsyncStatus.RUNNING.value)
        values = {"status": AsyncStatus.QUEUED.value, "owner": None, "lease_until": None}
        with self._tx() as conn:
            return int(conn.execute(update(_Q).where(held).values(**values)).rowcount)

    def backlog(self, endpoint: str) -> Backlog:
        query = (
            select(_Q.c.status, func.count(), func.min(_Q.c.received))
            .where(_Q.c.endpoint == endpoint, _Q.c.status.in_(_WAITING))
            .group_by(_Q.c.status)
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        counts = {row[0]: int(row[1]) for row in rows}
        oldest = [utc(row[2]) for row in rows if row[0] == AsyncStatus.QUEUED.value and row[2]]
        return Backlog(
            queued=counts.get(AsyncStatus.QUEUED.value, 0),
            running=counts.get(AsyncStatus.RUNNING.value, 0),
            oldest_received=oldest[0] if oldest else None,
        )

    def recent(self, endpoint: str, limit: int) -> list[AsyncRequest]:
        """An endpoint's ``limit`` newest requests, newest first, without their inline
        bodies (the console's list: what is queued, running, done or failed, and where
        its output or failure went)."""
        columns = [c for c in _Q.c if c.name != "body"]
        query = (
            select(*columns).where(_Q.c.endpoint == endpoint).order_by(_Q.c.id.desc()).limit(limit)
        )
        with self._tx() as conn:
            rows = conn.execute(query).mappings().all()
        return [_request({**row, "body": None}) for row in rows]

    def endpoints_with_work(self) -> list[str]:
        query = select(_Q.c.endpoint).where(_Q.c.status.in_(_WAITING)).distinct()
        with self._tx() as conn:
            return [row[0] for row in conn.execute(query).all()]


def _count_waiting(conn: Connection, endpoint: str) -> int:
    query = select(func.count()).where(_Q.c.endpoint == endpoint, _Q.c.status.in_(_WAITING))
    return int(conn.execute(query).scalar_one())


def _find(conn: Connection, endpoint: str, inference_id: str) -> AsyncRequest | None:
    query = select(_Q).where(_Q.c.endpoint == endpoint, _Q.c.inference_id == inference_id)
    row = conn.execute(query).mappings().first()
    return None if row is None else _request(row)


def _row(r: AsyncRequest) -> dict[str, Any]:
    return {
        "endpoint": r.endpoint,
        "inference_id": r.inference_id,
        "input_location": r.input_location,
        "output_location": r.output_location,
        "failure_location": r.failure_location,
        "received": r.received,
        "expires": r.expires,
        "invocation_timeout_s": r.invocation_timeout_s,
        "content_type": r.content_type,
        "accept": r.accept,
        "custom_attributes": r.custom_attributes,
        "notify": r.notify,
        "status": r.status.value,
        "attempts": r.attempts,
        "owner": r.owner,
        "lease_until": r.lease_until,
        "started": r.started,
        "finished": r.finished,
        "failure_reason": r.failure_reason,
        "body": r.body,
    }


def _request(row: Any) -> AsyncRequest:
    def when(value: datetime | None) -> datetime | None:
        return None if value is None else utc(value)

    return AsyncRequest(
        id=int(row["id"]),
        endpoint=row["endpoint"],
        inference_id=row["inference_id"],
        input_location=row["input_location"],
        output_location=row["output_location"],
        failure_location=row["failure_location"],
        received=utc(row["received"]),
        expires=utc(row["expires"]),
        invocation_timeout_s=float(row["invocation_timeout_s"]),
        content_type=row["content_type"],
        accept=row["accept"],
        custom_attributes=row["custom_attributes"],
        notify=dict(row["notify"] or {}),
        status=AsyncStatus(row["status"]),
        attempts=int(row["attempts"]),
        owner=row["owner"],
        lease_until=when(row["lease_until"]),
        started=when(row["started"]),
        finished=when(row["finished"]),
        failure_reason=row["failure_reason"],
        body=None if row["body"] is None else bytes(row["body"]),
    )
