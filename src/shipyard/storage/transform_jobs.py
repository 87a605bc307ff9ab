"""TransformStore: batch transform jobs and the input objects each has finished.

A status change and its event are one transaction (``change``), as for training jobs.
An object is recorded as finished (``finish_object``) only once its output was written
whole, so a job resumed after a restart skips exactly the objects already written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from shipyard.errors import InvalidParameter, ResourceInUse, ResourceNotFound
from shipyard.records import ACTIVE_JOB_STATUSES, JOB_TRANSITIONS, Event, JobStatus, TransformJob
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.metadata import _utc as utc
from shipyard.storage.metadata import now
from shipyard.storage.transactions import transaction

EventFor = Callable[[TransformJob, TransformJob | None], Event | None]
"""Builds the event of a change from the new record and the old one (None on create)."""


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


class TransformStore:
    """Transform jobs over the metadata store's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"TransformStore({self.engine.url.render_as_string(hide_password=True)!r})"

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with transaction(self.engine) as conn:
            yield conn

    def create(self, job: TransformJob, *, event_for: EventFor) -> None:
        try:
            with self._tx() as conn:
                conn.execute(insert(t.transform_jobs).values(**_row(job)))
                _record(conn, event_for(job, None))
        except IntegrityError as exc:
            raise ResourceInUse(
                "Job name must be unique within an AWS account and region, and a job with "
                f"this name already exists ({job.arn})"
            ) from exc

    def get(self, name: str) -> TransformJob:
        with self._tx() as conn:
            return self._get(conn, name)

    def newest(self, limit: int) -> tuple[list[TransformJob], dict[str, int]]:
        """The ``limit`` jobs created last, newest first, and how many jobs have each status.

        For lists (the console): an ordered query with a limit and a grouped count, so
        the cost stays that of ``limit`` rows however many jobs the store holds.
        """
        query = select(t.transform_jobs).order_by(t.transform_jobs.c.created.desc()).limit(limit)
        counts = select(t.transform_jobs.c.status, func.count()).group_by(t.transform_jobs.c.status)
        with self._tx() as conn:
            rows = conn.execute(query).mappings().all()
            jobs = [self._with_progress(conn, _job(r)) for r in rows]
            by_status = {status: int(n) for status, n in conn.execute(counts).all()}
        return jobs, by_status

    def list(self, *, active_only: bool = False) -> list[TransformJob]:
        query = select(t.transform_jobs)
        if active_only:
            active = [s.value for s in ACTIVE_JOB_STATUSES]
            query = query.where(t.transform_jobs.c.status.in_(active))
        with self._tx() as conn:
            rows = conn.execute(query).mappings().all()
            return [self._with_progress(conn, _job(r)) for r in rows]

    def change(
        self,
        name: str,
        *,
        expect: Sequence[JobStatus] | None = None,
        event_for: EventFor | None = None,
        **changes: Any,
    ) -> TransformJob:
        """Apply ``changes`` in one transaction, with the change's event.

        ``expect``: the current status must be one of these (two racing callers can't
        both move the job).
        """
        with self._tx() as conn:
            current = self._get(conn, name, lock=True)
            if expect is not None and current.status not in expect:
                raise InvalidParameter(
                    f"The request was rejected because the transform job is in status "
                    f"{current.status}."
                )
            new_status = changes.get("status", current.status)
            if new_status != current.status and new_status not in JOB_TRANSITIONS[current.status]:
                raise InvalidParameter(
                    f"Transform job {name} cannot go from {current.status} to {new_status}."
                )
            changed = replace(current, modified=now(), **changes)
            conn.execute(
                update(t.transform_jobs)
                .where(t.transform_jobs.c.name == name)
                .values(**_row(changed))
            )
            if event_for is not None:
                _record(conn, event_for(changed, current))
            return changed

    # -- objects ----------------------------------------------------------------------

    def finished_objects(self, name: str) -> dict[str, int]:
        """Keys of the input objects ``name`` has written the output of -> their records."""
        table = t.transform_objects
        with self._tx() as conn:
            rows = conn.execute(select(table.c.key, table.c.records).where(table.c.job == name))
            return {key: int(records) for key, records in rows}

    def finish_object(self, name: str, key: str, records: int) -> None:
        """Record that ``key``'s output is written (again: no change)."""
        table = t.transform_objects
        with self._tx() as conn:
            found = conn.execute(
                select(func.count())
                .select_from(table)
                .where(table.c.job == name, table.c.key == key)
            ).scalar_one()
            if not found:
                conn.execute(
                    insert(table).values(job=name, key=key, records=records, finished=now())
                )

    # -- shared -----------------------------------------------------------------------

    def _get(self, conn: Connection, name: str, *, lock: bool = False) -> TransformJob:
        query = select(t.transform_jobs).where(t.transform_jobs.c.name == name)
        if lock and conn.dialect.name == "postgresql":
            query = query.with_for_update()
        row = conn.execute(query).mappings().first()
        if row is None:
            raise ResourceNotFound(f"Could not find requested job with name {name}")
        return self._with_progress(conn, _job(row))

    @staticmethod
    def _with_progress(conn: Connection, job: TransformJob) -> TransformJob:
        table = t.transform_objects
        done, records = conn.execute(
            select(func.count(), func.coalesce(func.sum(table.c.records), 0)).where(
                table.c.job == job.name
            )
        ).one()
        return replace(job, objects_done=int(done), records_done=int(records))


def _record(conn: Connection, event: Event | None) -> None:
    if event is not None:
        record_event(conn, event)


def _row(job: TransformJob) -> dict[str, Any]:
    return {
        "name": job.name,
        "arn": job.arn,
        "status": job.status.value,
        "request": job.request,
        "failure_reason": job.failure_reason,
        "created": job.created,
        "modified": job.modified,
        "started": job.started,
        "ended": job.ended,
        "objects_total": job.objects_total,
    }


def _job(row: Any) -> TransformJob:
    created, modified = _utc(row["created"]), _utc(row["modified"])
    assert created is not None and modified is not None
    return TransformJob(
        name=row["name"],
        arn=row["arn"],
        status=JobStatus(row["status"]),
        request=dict(row["request"] or {}),
        created=created,
        modified=modified,
        failure_reason=row["failure_reason"],
        started=_utc(row["started"]),
        ended=_utc(row["ended"]),
        objects_total=row["objects_total"],
    )
