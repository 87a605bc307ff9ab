"""MetricStore: CloudWatch's metric datapoints, alarms and alarm history (DESIGN 2.12).

A series is a namespace, a metric name and its dimensions; its datapoints are statistic
sets (cloudwatch/stats.py) per period (10 s and 60 s), per source: each gateway writes
its own rows, PutMetricData writes under ``put``, and a read adds the rows up. An
alarm's change of state, its history item and its event are written in one transaction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    delete,
    func,
    insert,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.exc import IntegrityError

from shipyard.records import Event
from shipyard.statsets import StatSet
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.transactions import transaction

Dimensions = tuple[tuple[str, str], ...]

Row = tuple[int, float, float, float, float, dict[str, float] | None]
"""A stored datapoint: (start, count, sum, min, max, distribution or None)."""
"""(name, value) pairs, sorted by name: the same metric whatever the order given."""


_WRITE_ATTEMPTS = 3
_SEEN_EVERY_S = 3600
"""How often a series' ``last_seen`` is written while it is written: ListMetrics looks
back two weeks (three hours with RecentlyActive), an hour's slack is within both."""


def dimensions_of(items: Iterable[dict[str, Any]] | None) -> Dimensions:
    return tuple(sorted((str(d["Name"]), str(d["Value"])) for d in items or ()))


def series_key(namespace: str, name: str, dimensions: Dimensions) -> str:
    text = json.dumps([namespace, name, [list(d) for d in dimensions]], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Series:
    id: int
    namespace: str
    name: str
    dimensions: Dimensions
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class Point:
    """One statistic set to record: ``stats`` of ``name`` over [start, start + period)."""

    namespace: str
    name: str
    dimensions: Dimensions
    period: int
    start: int
    stats: StatSet
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class Alarm:
    name: str
    arn: str
    config: dict[str, Any]
    """PutMetricAlarm's request as given (less AlarmName), JSON-ready."""
    state: str
    reason: str
    reason_data: str | None
    state_updated: datetime
    config_updated: datetime


@dataclass(frozen=True, slots=True)
class HistoryItem:
    alarm: str
    time: datetime
    item_type: str
    summary: str
    data: str


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class MetricStore:
    """Series, datapoints and alarms in the metadata store's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids: dict[str, int] = {}
        """Series key -> id, as this process has seen them (ids never change)."""
        self._seen: dict[str, int] = {}
        """Series key -> the ``last_seen`` this process last wrote for it."""
        self._united: set[str] = set()
        """Series this process has given a unit to (or left one already given)."""

    def __repr__(self) -> str:
        return f"MetricStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # -- datapoints -------------------------------------------------------------------

    def write(self, points: Sequence[Point], source: str, *, seen: int) -> None:
        """Add ``points`` to the rows of ``source`` (merged with what a row holds already:
        a period recorded in two parts, or PutMetricData called twice in it).

        Two writers of one source's rows (PutMetricData from two threads or gateways)
        are serialised (a transaction lock on PostgreSQL), and a writer that lost the
        race to insert a series writes again."""
        if not points:
            return
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                self._write(points, source, seen)
                return
            except IntegrityError:
                self._ids.clear()  # a series another writer made: read it anew
                if attempt == _WRITE_ATTEMPTS - 1:
                    raise

    def _write(self, points: Sequence[Point], source: str, seen: int) -> None:
        with transaction(self.engine) as conn:
            if conn.dialect.name == "postgresql":
                # One writer of a source's rows at a time, across threads and gateways
                # (SQLite's writers are one at a time already): its rows are read and
                # written back whole, which two writers at once could each overwrite.
                lock = int(hashlib.sha256(source.encode()).hexdigest()[:15], 16)
                conn.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": lock})
            merged: dict[tuple[int, int, int], StatSet] = {}
            for point in points:
                series = self._series_id(conn, point, seen)
                key = (series, point.period, point.start)
                found = merged.get(key)
                if found is None:
                    merged[key] = point.stats.copy()
                else:
                    found.add(point.stats)
            query = select(t.metric_points).where(
                t.metric_points.c.source == source,
                tuple_(
                    t.metric_points.c.series, t.metric_points.c.period, t.metric_points.c.start
                ).in_(list(merged)),
            )
            existing = conn.execute(query).all()
            updated = set()
            for row in existing:
                key = (row.series, row.period, row.start)
                m = row._mapping
                stats = stats_of((m["start"], m["count"], m["sum"], m["min"], m["max"], m["hist"]))
                stats.add(merged[key])
                updated.add(key)
                conn.execute(
                    update(t.metric_points)
                    .where(
                        t.metric_points.c.series == row.series,
                        t.metric_points.c.period == row.period,
                        t.metric_points.c.start == row.start,
                        t.metric_points.c.source == source,
                    )
                    .values(**_columns(stats))
                )
            fresh = [
                {"series": k[0], "period": k[1], "start": k[2], "source": source, **_columns(s)}
                for k, s in merged.items()
                if k not in updated
            ]
            if fresh:
                conn.execute(insert(t.metric_points), fresh)

    def _series_id(self, conn: Connection, point: Point, seen: int) -> int:
        key = series_key(point.namespace, point.name, point.dimensions)
        found = self._ids.get(key)
        if found is not None:
            if point.unit is not None and key not in self._united:
                self._give_unit(conn, key, found, point.unit)
            if seen - self._seen.get(key, 0) >= _SEEN_EVERY_S:
                conn.execute(
                    update(t.metric_series)
                    .where(t.metric_series.c.id == found)
                    .values(last_seen=seen)
                )
                self._seen[key] = seen
            return found
        row = conn.execute(select(t.metric_series.c.id).where(t.metric_series.c.key == key)).first()
        if row is None:
            result = conn.execute(
                insert(t.metric_series).values(
                    key=key,
                    namespace=point.namespace,
                    name=point.name,
                    dimensions=[list(d) for d in point.dimensions],
                    unit=point.unit,
                    last_seen=seen,
                )
            )
            found = int(result.inserted_primary_key[0])  # type: ignore[index]
        else:
            found = int(row.id)
            conn.execute(
                update(t.metric_series).where(t.metric_series.c.id == found).values(last_seen=seen)
            )
            if point.unit is not None:
                self._give_unit(conn, key, found, point.unit)
        self._ids[key] = found
        self._seen[key] = seen
        return found

    def _give_unit(self, conn: Connection, key: str, series: int, unit: str) -> None:
        """A series first written with no unit takes the first one given (a series an
        older gateway recorded, or a metric put without one before): asked for in its
        unit, its data is found."""
        conn.execute(
            update(t.metric_series)
            .where(t.metric_series.c.id == series, t.metric_series.c.unit.is_(None))
            .values(unit=unit)
        )
        self._united.add(key)

    def find(self, namespace: str, name: str, dimensions: Dimensions) -> Series | None:
        """The series of exactly these dimensions, if anything was ever recorded for it."""
        key = series_key(namespace, name, dimensions)
        with self.engine.connect() as conn:
            row = conn.execute(select(t.metric_series).where(t.metric_series.c.key == key)).first()
        return None if row is None else _series(row)

    def list_series(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        since: int | None = None,
    ) -> list[Series]:
        """Series by namespace and name, seen since ``since`` (epoch seconds), oldest
        id first; dimension filters are the caller's."""
        query = select(t.metric_series).order_by(t.metric_series.c.id)
        if namespace is not None:
            query = query.where(t.metric_series.c.namespace == namespace)
        if name is not None:
            query = query.where(t.metric_series.c.name == name)
        if since is not None:
            query = query.where(t.metric_series.c.last_seen >= since)
        with self.engine.connect() as conn:
            return [_series(row) for row in conn.execute(query)]

    def read(
        self,
        series: Sequence[int],
        period: int,
        start: int,
        end: int,
        *,
        distributions: bool = False,
    ) -> dict[int, list[Row]]:
        """Per series, its ``period`` rows starting in [start, end), every source's:
        ``(start, count, sum, min, max, hist)``, ``hist`` read only with
        ``distributions`` (percentiles need it; the other statistics do not, and reading
        it is most of a read's cost)."""
        out: dict[int, list[Row]] = {s: [] for s in series}
        if not series:
            return out
        c = t.metric_points.c
        columns = [c.series, c.start, c.count, c.sum, c.min, c.max]
        if distributions:
            columns.append(c.hist)
        query = select(*columns).where(
            c.series.in_(list(series)), c.period == period, c.start >= start, c.start < end
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).fetchall()
        for row in rows:
            hist = row[6] if distributions else None
            out[row[0]].append((row[1], row[2], row[3], row[4], row[5], hist))
        return out

    def aggregate(
        self, series: Sequence[int], step: int, origin: int, end: int, period: int
    ) -> dict[int, dict[int, tuple[float, float, float, float]]]:
        """Per series, its ``step`` rows in [origin, end) added up in the database into
        ``period``-long buckets from ``origin``: bucket start -> (count, sum, min, max).
        The plain statistics' read: what comes back is one row per bucket, not per
        stored row (a day of minutes read at an hour is 24 rows, not 1,440)."""
        out: dict[int, dict[int, tuple[float, float, float, float]]] = {s: {} for s in series}
        if not series:
            return out
        c = t.metric_points.c
        where = (c.series.in_(list(series)), c.period == step, c.start >= origin, c.start < end)
        if period == step:  # a bucket a row: added up here only where sources share one
            plain = select(c.series, c.start, c.count, c.sum, c.min, c.max).where(*where)
            with self.engine.connect() as conn:
                for found, at, count, total, low, high in conn.execute(plain).fetchall():
                    points = out[found]
                    was = points.get(at)
                    points[at] = (
                        (count, total, low, high)
                        if was is None
                        else (was[0] + count, was[1] + total, min(was[2], low), max(was[3], high))
                    )
            return out
        bucket = ((c.start - origin) // period).label("bucket")
        query = (
            select(
                c.series,
                bucket,
                func.sum(c.count),
                func.sum(c.sum),
                func.min(c.min),
                func.max(c.max),
            )
            .where(*where)
            .group_by(c.series, bucket)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).fetchall()
        for found, slot, count, total, low, high in rows:
            out[found][origin + int(slot) * period] = (count, total, low, high)
        return out

    def sums_by_source(
        self, keys: Sequence[str], *, period: int, start: int, end: int, other_than: str
    ) -> dict[str, dict[str, tuple[float, float]]]:
        """Per series key, per source but ``other_than``: the count and the sum of its
        ``period`` rows starting in [start, end), added up in the database. What the
        other gateways sharing the store recorded (the autoscaler adds it to what its own
        gateway counts)."""
        out: dict[str, dict[str, tuple[float, float]]] = {}
        if not keys:
            return out
        s, p = t.metric_series.c, t.metric_points.c
        query = (
            select(s.key, p.source, func.sum(p.count), func.sum(p.sum))
            .select_from(t.metric_points.join(t.metric_series, p.series == s.id))
            .where(
                s.key.in_(list(keys)),
                p.period == period,
                p.start >= start,
                p.start < end,
                p.source != other_than,
            )
            .group_by(s.key, p.source)
        )
        with self.engine.connect() as conn:
            for key, source, count, total in conn.execute(query):
                out.setdefault(key, {})[source] = (float(count), float(total))
        return out

    def purge(self, *, period: int, before: int) -> int:
        """Delete ``period`` rows older than ``before`` (epoch seconds); how many."""
        with transaction(self.engine) as conn:
            c = t.metric_points.c
            result = conn.execute(
                delete(t.metric_points).where(and_(c.period == period, c.start < before))
            )
            return int(result.rowcount or 0)

    # -- alarms -----------------------------------------------------------------------

    def put_alarm(self, alarm: Alarm, history: HistoryItem) -> None:
        """Create or replace ``alarm`` (its state kept by the caller), with its history."""
        row = _alarm_row(alarm)
        with transaction(self.engine) as conn:
            found = conn.execute(
                update(t.alarms).where(t.alarms.c.name == alarm.name).values(**row)
            )
            if found.rowcount == 0:
                conn.execute(insert(t.alarms).values(name=alarm.name, **row))
            _add_history(conn, history)

    def get_alarm(self, name: str) -> Alarm | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.alarms).where(t.alarms.c.name == name)).first()
        return None if row is None else _alarm(row)

    def list_alarms(self) -> list[Alarm]:
        with self.engine.connect() as conn:
            return [_alarm(r) for r in conn.execute(select(t.alarms).order_by(t.alarms.c.name))]

    def delete_alarms(self, names: Sequence[str]) -> None:
        """Delete alarms; their history stays (as CloudWatch keeps it), until purged."""
        with transaction(self.engine) as conn:
            conn.execute(delete(t.alarms).where(t.alarms.c.name.in_(list(names))))

    def purge_history(self, *, before: datetime) -> int:
        """Delete alarm history older than ``before``; how many items."""
        with transaction(self.engine) as conn:
            c = t.alarm_history.c
            return int(conn.execute(delete(t.alarm_history).where(c.time < before)).rowcount or 0)

    def change_state(
        self,
        name: str,
        *,
        state: str,
        reason: str,
        reason_data: str | None,
        when: datetime,
        history: HistoryItem,
        event: Event | None,
        expected: str | None = None,
    ) -> bool:
        """Set an alarm's state with its history item and event, in one transaction;
        False (nothing written) when the alarm is gone, or is no longer in ``expected``."""
        with transaction(self.engine) as conn:
            query = update(t.alarms).where(t.alarms.c.name == name)
            if expected is not None:
                query = query.where(t.alarms.c.state == expected)
            changed = conn.execute(
                query.values(
                    state=state, reason=reason, reason_data=reason_data, state_updated=when
                )
            )
            if changed.rowcount == 0:
                return False
            _add_history(conn, history)
            if event is not None:
                record_event(conn, event)
        return True

    def add_history(self, item: HistoryItem) -> None:
        with transaction(self.engine) as conn:
            _add_history(conn, item)

    def history(
        self,
        *,
        alarm: str | None,
        item_type: str | None,
        start: datetime | None,
        end: datetime | None,
        newest_first: bool,
    ) -> list[HistoryItem]:
        c = t.alarm_history.c
        query = select(t.alarm_history).order_by(c.seq.desc() if newest_first else c.seq)
        if alarm is not None:
            query = query.where(c.alarm == alarm)
        if item_type is not None:
            query = query.where(c.item_type == item_type)
        if start is not None:
            query = query.where(c.time >= start)
        if end is not None:
            query = query.where(c.time <= end)
        with self.engine.connect() as conn:
            return [
                HistoryItem(r.alarm, _utc(r.time), r.item_type, r.summary, r.data)
                for r in conn.execute(query)
            ]


def _add_history(conn: Connection, item: HistoryItem) -> None:
    conn.execute(
        insert(t.alarm_history).values(
            alarm=item.alarm,
            time=item.time,
            item_type=item.item_type,
            summary=item.summary,
            data=item.data,
        )
    )


def _alarm_row(alarm: Alarm) -> dict[str, Any]:
    return {
        "arn": alarm.arn,
        "config": alarm.config,
        "state": alarm.state,
        "reason": alarm.reason,
        "reason_data": alarm.reason_data,
        "state_updated": alarm.state_updated,
        "config_updated": alarm.config_updated,
    }


def _alarm(row: Any) -> Alarm:
    return Alarm(
        name=row.name,
        arn=row.arn,
        config=dict(row.config),
        state=row.state,
        reason=row.reason,
        reason_data=row.reason_data,
        state_updated=_utc(row.state_updated),
        config_updated=_utc(row.config_updated),
    )


def _series(row: Any) -> Series:
    return Series(
        id=int(row.id),
        namespace=row.namespace,
        name=row.name,
        dimensions=tuple((str(n), str(v)) for n, v in row.dimensions),
        unit=row.unit,
    )


def stats_of(row: Row) -> StatSet:
    """A stored datapoint's statistic set."""
    _, count, total, low, high, hist = row
    return StatSet(
        float(count),
        float(total),
        float(low),
        float(high),
        None if hist is None else {str(k): float(v) for k, v in hist.items()},
    )


def _columns(stats: StatSet) -> dict[str, Any]:
    return {
        "count": stats.count,
        "sum": stats.sum,
        "min": stats.min,
        "max": stats.max,
        "hist": stats.hist,
    }
