"""MetricStore: CloudWatch's metric datapoints, alarms and alarm history.

A series is a namespace, a metric name and its dimensions; its datapoints are statistic
sets (cloudwatch/stats.py) per period (10 s and 60 s), per source: each gateway writes
its own rows, PutMetricData writes under ``put``, and a read adds the rows up. An
alarm's change of state, its history item and its event are written in one transaction.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
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

from shipyard.errors import LimitExceeded
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
back two weeks (three hours with RecentlyActive), an hour's slack is within both. A
series' id is also read anew this often, so an id another gateway purged is never used
for long."""
_CACHED_SERIES = 20_000
"""The series whose ids a process keeps (the most recently written); another is read."""


def dimensions_of(items: Iterable[dict[str, Any]] | None) -> Dimensions:
    return tuple(sorted((str(d["Name"]), str(d["Value"])) for d in items or ()))


def series_key(namespace: str, name: str, dimensions: Dimensions) -> str:
    text = json.dumps([namespace, name, [list(d) for d in dimensions]], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Quota:
    """How many series callers may create: ``total`` all together, ``per_owner`` each
    key (None: no bound per key, as with no ``auth:``)."""

    total: int
    per_owner: int | None


@dataclass(slots=True)
class _Known:
    """A series this process wrote: its id, the ``last_seen`` it wrote, whether its
    unit is settled."""

    id: int
    seen: int
    united: bool = False


class _SeriesCache:
    """Series key -> ``_Known``, the ``_CACHED_SERIES`` most recently used (threads of
    one process share it: the recorder's and PutMetricData's)."""

    def __init__(self, size: int = _CACHED_SERIES) -> None:
        self._size = size
        self._items: OrderedDict[str, _Known] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> _Known | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, known: _Known) -> None:
        with self._lock:
            self._items[key] = known
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@dataclass(slots=True)
class _Budget:
    """The series one write may still create, counted once per write when it first
    creates one."""

    quota: Quota
    owner: str
    total: int | None = None
    mine: int = 0

    def take(self, conn: Connection) -> None:
        """Count one more series, or LimitExceeded (the whole write is undone)."""
        c = t.metric_series.c
        if self.total is None:
            count = select(func.count()).select_from(t.metric_series)
            self.total = int(conn.execute(count.where(c.owner.is_not(None))).scalar_one())
            if self.quota.per_owner is not None:
                self.mine = int(conn.execute(count.where(c.owner == self.owner)).scalar_one())
        if self.total >= self.quota.total:
            raise LimitExceeded(
                f"The maximum of {self.quota.total} metric series has been reached: a "
                "series with no datapoint within the retention is deleted."
            )
        if self.quota.per_owner is not None and self.mine >= self.quota.per_owner:
            raise LimitExceeded(
                f"The maximum of {self.quota.per_owner} metric series one key may create "
                "has been reached: a series with no datapoint within the retention is deleted."
            )
        self.total += 1
        self.mine += 1


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
        self._known = _SeriesCache()
        """The series this process wrote lately (an id lives until its series is
        purged, which no series written within the retention is)."""

    def __repr__(self) -> str:
        return f"MetricStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # -- datapoints -------------------------------------------------------------------

    def write(
        self,
        points: Sequence[Point],
        source: str,
        *,
        seen: int,
        owner: str | None = None,
        quota: Quota | None = None,
    ) -> None:
        """Add ``points`` to the rows of ``source`` (merged with what a row holds already:
        a period recorded in two parts, or PutMetricData called twice in it).

        A series a write creates is ``owner``'s (None: the gateway's own), within
        ``quota`` when given: past it the write is LimitExceeded, and nothing of it is
        written. Two writers of one source's rows (PutMetricData from two threads or
        gateways) are serialised (a transaction lock on PostgreSQL), and a writer that
        lost the race to insert a series writes again."""
        if not points:
            return
        for attempt in range(_WRITE_ATTEMPTS):
            budget = None if quota is None or owner is None else _Budget(quota, owner)
            try:
                self._write(points, source, seen, owner, budget)
                return
            except IntegrityError:
                self._known.clear()  # a series another writer made: read it anew
                if attempt == _WRITE_ATTEMPTS - 1:
                    raise

    def _write(
        self,
        points: Sequence[Point],
        source: str,
        seen: int,
        owner: str | None,
        budget: _Budget | None,
    ) -> None:
        with transaction(self.engine) as conn:
            if conn.dialect.name == "postgresql":
                # One writer of a source's rows at a time, across threads and gateways
                # (SQLite's writers are one at a time already): its rows are read and
                # written back whole, which two writers at once could each overwrite.
                lock = int(hashlib.sha256(source.encode()).hexdigest()[:15], 16)
                conn.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": lock})
            merged: dict[tuple[int, int, int], StatSet] = {}
            for point in points:
                series = self._series_id(conn, point, seen, owner, budget)
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

    def _series_id(
        self,
        conn: Connection,
        point: Point,
        seen: int,
        owner: str | None,
        budget: _Budget | None,
    ) -> int:
        key = series_key(point.namespace, point.name, point.dimensions)
        known = self._known.get(key)
        if known is not None and seen - known.seen < _SEEN_EVERY_S:
            if point.unit is not None and not known.united:
                self._give_unit(conn, known, point.unit)
            return known.id
        row = conn.execute(select(t.metric_series.c.id).where(t.metric_series.c.key == key)).first()
        if row is None:
            if budget is not None:
                budget.take(conn)
            result = conn.execute(
                insert(t.metric_series).values(
                    key=key,
                    namespace=point.namespace,
                    name=point.name,
                    dimensions=[list(d) for d in point.dimensions],
                    unit=point.unit,
                    last_seen=seen,
                    owner=owner,
                )
            )
            known = _Known(int(result.inserted_primary_key[0]), seen)  # type: ignore[index]
        else:
            known = _Known(int(row.id), seen)
            same = t.metric_series.c.id == known.id
            conn.execute(update(t.metric_series).where(same).values(last_seen=seen))
            if point.unit is not None:
                self._give_unit(conn, known, point.unit)
        self._known.put(key, known)
        return known.id

    def _give_unit(self, conn: Connection, known: _Known, unit: str) -> None:
        """A series first written with no unit takes the first one given (a series an
        older gateway recorded, or a metric put without one before): asked for in its
        unit, its data is found."""
        conn.execute(
            update(t.metric_series)
            .where(t.metric_series.c.id == known.id, t.metric_series.c.unit.is_(None))
            .values(unit=unit)
        )
        known.united = True

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

    def purge_series(self, *, before: int) -> int:
        """Delete the series with no datapoint written since ``before`` (epoch seconds),
        with any rows left of them; how many. They leave the quota, and this process's
        ids. (``last_seen`` is written hourly, so one not written since an hour before
        ``before`` is the one known to be that old.)"""
        c = t.metric_series.c
        old = c.last_seen < before - _SEEN_EVERY_S
        with transaction(self.engine) as conn:
            stale = select(c.id).where(old)
            conn.execute(delete(t.metric_points).where(t.metric_points.c.series.in_(stale)))
            result = conn.execute(delete(t.metric_series).where(old))
            removed = int(result.rowcount or 0)
        if removed:
            self._known.clear()
        return removed

    # -- alarms -----------------------------------------------------------------------

    def put_alarm(
        self,
        alarm: Alarm,
        history: HistoryItem,
        *,
        owner: str | None = None,
        quota: Quota | None = None,
    ) -> None:
        """Create or replace ``alarm``, with its history. A new alarm is ``owner``'s,
        within ``quota`` when given (else LimitExceeded, nothing written); a replaced one
        stays its creator's and keeps the state it has in the store: writing back the
        state its caller read would undo a transition made since (its notification sent
        for a state the alarm then no longer had)."""
        row = _alarm_row(alarm)
        configured = {k: row[k] for k in ("arn", "config", "config_updated")}
        with transaction(self.engine) as conn:
            found = conn.execute(
                update(t.alarms).where(t.alarms.c.name == alarm.name).values(**configured)
            )
            if found.rowcount == 0:
                if quota is not None:
                    _check_alarm_quota(conn, owner, quota)
                conn.execute(insert(t.alarms).values(name=alarm.name, owner=owner, **row))
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
        configured: datetime | None = None,
    ) -> bool:
        """Set an alarm's state with its history item and event, in one transaction;
        False (nothing written) when the alarm is gone, is no longer in ``expected``, or
        was configured again since ``configured`` (its ``config_updated``).

        The last guard is what keeps a notification from going astray: a transition is
        decided on the alarm as an evaluation pass read it, and its event names that
        alarm's actions. Were the alarm replaced meanwhile (PutMetricAlarm on its name,
        with other actions), the new state would be written with an event for the old
        actions, and the new ones, never told, would wait for a change that had already
        happened. Refused here, the next pass decides again on the alarm as it is."""
        with transaction(self.engine) as conn:
            if configured is not None:
                found = conn.execute(
                    select(t.alarms.c.config_updated)
                    .where(t.alarms.c.name == name)
                    .with_for_update()
                ).first()
                if found is None or _utc(found.config_updated) != configured:
                    return False
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


_ALARM_QUOTA_LOCK = int(hashlib.sha256(b"shipyard.alarms.quota").hexdigest()[:15], 16)


def _check_alarm_quota(conn: Connection, owner: str | None, quota: Quota) -> None:
    """Refuse a new alarm past ``quota`` (LimitExceeded). The count and the insert after it
    are one transaction under a lock, so puts at once cannot all pass one count: SQLite's
    writers are one at a time already, PostgreSQL's take a transaction lock, as a
    source's series writes do."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": _ALARM_QUOTA_LOCK})
    count = select(func.count()).select_from(t.alarms)
    if int(conn.execute(count).scalar_one()) >= quota.total:
        raise LimitExceeded(f"The maximum of {quota.total} alarms has been reached.")
    if quota.per_owner is None or owner is None:
        return
    if int(conn.execute(count.where(t.alarms.c.owner == owner)).scalar_one()) >= quota.per_owner:
        raise LimitExceeded(
            f"The maximum of {quota.per_owner} alarms one key may create has been reached."
        )


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
