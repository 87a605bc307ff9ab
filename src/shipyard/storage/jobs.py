"""JobStore: long-running jobs in the metadata store, each change with its event.

Every status change goes through ``change``, which checks it against JOB_TRANSITIONS and
records the change's event in the same transaction: a crash between the two would lose
the notification (or send one for a change that never happened).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from shipyard.errors import InvalidParameter, ResourceInUse, ResourceLimitExceeded, ResourceNotFound
from shipyard.records import (
    ACTIVE_JOB_STATUSES,
    JOB_TRANSITIONS,
    Event,
    Job,
    JobStatus,
    StatusTransition,
)
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.metadata import _utc as utc
from shipyard.storage.metadata import now
from shipyard.storage.transactions import transaction

EventFor = Callable[[Job, Job | None], Event | None]
"""Builds the event of a change from the new record and the old one (None on create)."""

# One advisory lock key for "the set of active jobs", so two gateways on one PostgreSQL
# database can't both take the last slot.
_QUOTA_LOCK = zlib.crc32(b"shipyard.jobs.quota")


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


class JobStore:
    """Jobs over the MetadataStore's engine; typed records in, typed records out.

    ``table`` and ``noun``: training jobs (``jobs``) by default; processing jobs keep the
    same record in a table of their own (``processing_jobs``), named in messages as
    "Processing job"."""

    def __init__(
        self, engine: Engine, *, table: Table = t.jobs, noun: str = "Training job"
    ) -> None:
        self.engine = engine
        self.table = table
        self.noun = noun

    def __repr__(self) -> str:
        return f"JobStore({self.engine.url.render_as_string(hide_password=True)!r})"

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with transaction(self.engine) as conn:
            yield conn

    def create(self, job: Job, *, limit: int, event_for: EventFor) -> int:
        """Insert ``job`` unless ``limit`` jobs are active; return the slots left after it.

        The count and the insert are one transaction under a lock (SQLite's BEGIN
        IMMEDIATE, PostgreSQL's advisory lock), so simultaneous creates can't overshoot.
        """
        try:
            with self._tx() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _QUOTA_LOCK})
                active = self._count_active(conn)
                if active >= limit:
                    raise ResourceLimitExceeded(
                        f"The account-level service limit 'active long-running jobs' is {limit} "
                        f"Jobs, with current utilization of {active} Jobs and a request delta "
                        "of 1 Jobs."
                    )
                conn.execute(insert(self.table).values(**_row(job)))
                _record(conn, event_for(job, None))
                return limit - active - 1
        except IntegrityError as exc:
            raise ResourceInUse(f'{self.noun} "{job.name}" already exists.') from exc

    def get(self, name: str) -> Job:
        with self._tx() as conn:
            return self._get(conn, name)

    def newest(self, limit: int) -> tuple[list[Job], dict[str, int]]:
        """The ``limit`` jobs created last, newest first, and how many jobs have each status.

        For lists (the console): an ordered query with a limit and a grouped count, so
        the cost stays that of ``limit`` rows however many jobs the store holds.
        """
        query = select(self.table).order_by(self.table.c.created.desc()).limit(limit)
        counts = select(self.table.c.status, func.count()).group_by(self.table.c.status)
        with self._tx() as conn:
            jobs = [_job(r) for r in conn.execute(query).mappings().all()]
            by_status = {status: int(n) for status, n in conn.execute(counts).all()}
        return jobs, by_status

    def list(self, *, active_only: bool = False) -> list[Job]:
        query = select(self.table)
        if active_only:
            query = query.where(self.table.c.status.in_([s.value for s in ACTIVE_JOB_STATUSES]))
        with self._tx() as conn:
            return [_job(r) for r in conn.execute(query).mappings().all()]

    def count_active(self) -> int:
        with self._tx() as conn:
            return self._count_active(conn)

    def change(
        self,
        name: str,
        *,
        expect: Sequence[JobStatus] | None = None,
        secondary: StatusTransition | None = None,
        event_for: EventFor | None = None,
        **changes: Any,
    ) -> Job:
        """Apply ``changes`` (and append ``secondary`` to the transitions) in one transaction.

        ``expect`` guards against racing callers: the current status must be one of them.
        A new SecondaryStatus closes the previous transition at its start time.
        """
        with self._tx() as conn:
            current = self._get(conn, name, lock=True)
            if expect is not None and current.status not in expect:
                raise InvalidParameter(
                    f"The request was rejected because the {self.noun.lower()} {name} is in "
                    f"status "
                    f"{current.status}."
                )
            new_status = changes.get("status", current.status)
            if new_status != current.status and new_status not in JOB_TRANSITIONS[current.status]:
                raise InvalidParameter(
                    f"{self.noun} {name} cannot go from {current.status} to {new_status}."
                )
            changed = replace(current, modified=now(), **changes)
            if secondary is not None:
                changed = replace(
                    changed,
                    secondary_status=secondary.status,
                    transitions=_append(current.transitions, secondary),
                )
            conn.execute(
                update(self.table).where(self.table.c.name == name).values(**_row(changed))
            )
            if event_for is not None:
                _record(conn, event_for(changed, current))
            return changed

    def _count_active(self, conn: Connection) -> int:
        active = [s.value for s in ACTIVE_JOB_STATUSES]
        query = select(func.count()).select_from(self.table).where(self.table.c.status.in_(active))
        return int(conn.execute(query).scalar_one())

    def _get(self, conn: Connection, name: str, *, lock: bool = False) -> Job:
        query = select(self.table).where(self.table.c.name == name)
        if lock and conn.dialect.name == "postgresql":
            query = query.with_for_update()
        row = conn.execute(query).mappings().first()
        if row is None:
            raise ResourceNotFound("Requested resource not found.")
        return _job(row)


def _record(conn: Connection, event: Event | None) -> None:
    if event is not None:
        record_event(conn, event)


def _append(
    transitions: tuple[StatusTransition, ...], new: StatusTransition
) -> tuple[StatusTransition, ...]:
    if transitions and transitions[-1].status == new.status:
        return transitions
    if transitions and transitions[-1].end is None:
        transitions = (*transitions[:-1], replace(transitions[-1], end=new.start))
    return (*transitions, new)


def _row(job: Job) -> dict[str, Any]:
    return {
        "name": job.name,
        "arn": job.arn,
        "job_type": job.job_type,
        "status": job.status.value,
        "secondary_status": job.secondary_status,
        "failure_reason": job.failure_reason,
        "model_artifacts": job.model_artifacts,
        "request": job.request,
        "transitions": [
            {
                "status": s.status,
                "start": s.start.timestamp(),
                "end": s.end.timestamp() if s.end else None,
                "message": s.message,
            }
            for s in job.transitions
        ],
        "created": job.created,
        "modified": job.modified,
        "started": job.started,
        "ended": job.ended,
        "attempt": job.attempt,
        "runner": job.runner,
        "applied_lines": job.applied_lines,
    }


def _job(row: Any) -> Job:
    def ts(value: float | None) -> datetime | None:
        return None if value is None else datetime.fromtimestamp(value, tz=now().tzinfo)

    created = _utc(row["created"])
    modified = _utc(row["modified"])
    assert created is not None and modified is not None
    return Job(
        name=row["name"],
        arn=row["arn"],
        job_type=row["job_type"],
        status=JobStatus(row["status"]),
        secondary_status=row["secondary_status"],
        failure_reason=row["failure_reason"],
        model_artifacts=row["model_artifacts"],
        request=dict(row["request"] or {}),
        transitions=tuple(
            StatusTransition(
                status=s["status"],
                start=ts(s["start"]) or created,
                end=ts(s["end"]),
                message=s["message"],
            )
            for s in row["transitions"]
        ),
        created=created,
        modified=modified,
        started=_utc(row["started"]),
        ended=_utc(row["ended"]),
        attempt=int(row["attempt"]),
        runner=row["runner"],
        applied_lines=int(row["applied_lines"]),
    )
