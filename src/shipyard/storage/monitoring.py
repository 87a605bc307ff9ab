"""MonitoringStore: Model Monitor's job definitions, schedules and executions.

A schedule's ``next_tick`` is when its next run is due (None: no run to come, a ``NOW``
schedule that has had its one); an execution is keyed by its processing job's name and
unique per schedule and ScheduledTime, so a run is never started twice for one tick
(``add_execution`` advances the tick in the same transaction).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from shipyard.errors import ResourceInUse
from shipyard.storage import tables as t
from shipyard.storage.metadata import _utc as utc
from shipyard.storage.metadata import now
from shipyard.storage.transactions import transaction


@dataclass(frozen=True, slots=True)
class Definition:
    """A data quality job definition: its CreateDataQualityJobDefinition request."""

    name: str
    arn: str
    request: dict[str, Any]
    created: datetime


@dataclass(frozen=True, slots=True)
class Schedule:
    """A monitoring schedule: its request (as last created or updated) and status."""

    name: str
    arn: str
    request: dict[str, Any]
    status: str
    created: datetime
    modified: datetime
    failure_reason: str | None = None
    next_tick: datetime | None = None


@dataclass(frozen=True, slots=True)
class Execution:
    """One run of a schedule: its processing job and what became of it."""

    job_name: str
    schedule: str
    scheduled: datetime
    status: str
    window_start: datetime
    window_end: datetime
    created: datetime
    modified: datetime
    failure_reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    """``endpoint``, ``definition``, ``job_arn`` and the run's processing request
    (``request``), kept so a restarted gateway can create its job."""


class MonitoringStore:
    """The three Model Monitor tables over the MetadataStore's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"MonitoringStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # -- definitions ----------------------------------------------------------------------

    def add_definition(self, definition: Definition) -> None:
        row = {
            "name": definition.name,
            "arn": definition.arn,
            "request": definition.request,
            "created": definition.created,
        }
        try:
            with transaction(self.engine) as conn:
                conn.execute(insert(t.monitoring_job_definitions).values(**row))
        except IntegrityError as exc:
            raise ResourceInUse(
                f"Data quality job definition {definition.name} already exists."
            ) from exc

    def definitions(self) -> list[Definition]:
        with transaction(self.engine) as conn:
            rows = conn.execute(select(t.monitoring_job_definitions)).mappings().all()
        return [
            Definition(r["name"], r["arn"], dict(r["request"]), _at(r["created"])) for r in rows
        ]

    def definition(self, name: str) -> Definition | None:
        return next((d for d in self.definitions() if d.name == name), None)

    def delete_definition(self, name: str) -> bool:
        table = t.monitoring_job_definitions
        with transaction(self.engine) as conn:
            return bool(conn.execute(delete(table).where(table.c.name == name)).rowcount)

    # -- schedules ------------------------------------------------------------------------

    def add_schedule(self, schedule: Schedule) -> None:
        try:
            with transaction(self.engine) as conn:
                conn.execute(insert(t.monitoring_schedules).values(**_schedule_row(schedule)))
        except IntegrityError as exc:
            raise ResourceInUse(f"Monitoring schedule {schedule.name} already exists.") from exc

    def schedules(self) -> list[Schedule]:
        with transaction(self.engine) as conn:
            rows = conn.execute(select(t.monitoring_schedules)).mappings().all()
        return [_schedule(r) for r in rows]

    def schedule(self, name: str) -> Schedule | None:
        table = t.monitoring_schedules
        with transaction(self.engine) as conn:
            row = conn.execute(select(table).where(table.c.name == name)).mappings().first()
        return None if row is None else _schedule(row)

    def change_schedule(self, name: str, **changes: Any) -> Schedule | None:
        table = t.monitoring_schedules
        with transaction(self.engine) as conn:
            row = conn.execute(select(table).where(table.c.name == name)).mappings().first()
            if row is None:
                return None
            changed = replace(_schedule(row), modified=now(), **changes)
            conn.execute(update(table).where(table.c.name == name).values(**_schedule_row(changed)))
            return changed

    def delete_schedule(self, name: str) -> bool:
        table = t.monitoring_schedules
        with transaction(self.engine) as conn:
            return bool(conn.execute(delete(table).where(table.c.name == name)).rowcount)

    # -- executions -----------------------------------------------------------------------

    def add_execution(self, execution: Execution, *, next_tick: datetime | None) -> bool:
        """Record a run and move its schedule's tick on, in one transaction; False when
        the schedule is gone or this tick's run exists already."""
        schedules = t.monitoring_schedules
        try:
            with transaction(self.engine) as conn:
                moved = conn.execute(
                    update(schedules)
                    .where(schedules.c.name == execution.schedule)
                    .values(next_tick=next_tick)
                ).rowcount
                if not moved:
                    return False
                conn.execute(insert(t.monitoring_executions).values(**_execution_row(execution)))
                return True
        except IntegrityError:
            return False

    def executions(self, *, active_only: bool = False) -> list[Execution]:
        table = t.monitoring_executions
        query = select(table)
        if active_only:
            query = query.where(table.c.status.in_(("Pending", "InProgress")))
        with transaction(self.engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [_execution(r) for r in rows]

    def change_execution(self, job_name: str, **changes: Any) -> None:
        table = t.monitoring_executions
        with transaction(self.engine) as conn:
            row = conn.execute(select(table).where(table.c.job_name == job_name)).mappings().first()
            if row is None:
                return
            changed = replace(_execution(row), modified=now(), **changes)
            conn.execute(
                update(table).where(table.c.job_name == job_name).values(**_execution_row(changed))
            )


def _at(value: datetime) -> datetime:
    return utc(value)


def _maybe(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


def _schedule(row: Any) -> Schedule:
    return Schedule(
        name=row["name"],
        arn=row["arn"],
        request=dict(row["request"]),
        status=row["status"],
        created=_at(row["created"]),
        modified=_at(row["modified"]),
        failure_reason=row["failure_reason"],
        next_tick=_maybe(row["next_tick"]),
    )


def _schedule_row(s: Schedule) -> dict[str, Any]:
    return {
        "name": s.name,
        "arn": s.arn,
        "request": s.request,
        "status": s.status,
        "failure_reason": s.failure_reason,
        "created": s.created,
        "modified": s.modified,
        "next_tick": s.next_tick,
    }


def _execution(row: Any) -> Execution:
    return Execution(
        job_name=row["job_name"],
        schedule=row["schedule"],
        scheduled=_at(row["scheduled"]),
        status=row["status"],
        window_start=_at(row["window_start"]),
        window_end=_at(row["window_end"]),
        created=_at(row["created"]),
        modified=_at(row["modified"]),
        failure_reason=row["failure_reason"],
        detail=dict(row["detail"] or {}),
    )


def _execution_row(e: Execution) -> dict[str, Any]:
    return {
        "job_name": e.job_name,
        "schedule": e.schedule,
        "scheduled": e.scheduled,
        "status": e.status,
        "failure_reason": e.failure_reason,
        "window_start": e.window_start,
        "window_end": e.window_end,
        "created": e.created,
        "modified": e.modified,
        "detail": e.detail,
    }
