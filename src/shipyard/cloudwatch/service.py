"""CloudWatchService: reading and writing metrics, and keeping alarms.

The control plane's ``cloudwatch`` actions land here (gateway/api/actions/cloudwatch.py
turns AWS's fields into these arguments). Reads add up every gateway's rows of a
period; a period finer than a minute reads the 10 s rows (kept three hours), any other
the one-minute rows (kept ``SHIPYARD_METRICS_RETENTION_DAYS``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shipyard.cloudwatch import expressions
from shipyard.errors import (
    AlarmNotFound,
    InvalidFormat,
    InvalidParameterCombination,
    InvalidParameterValue,
    MissingParameter,
)
from shipyard.statsets import StatSet, is_statistic, percentile_of
from shipyard.storage.metrics import (
    Alarm,
    Dimensions,
    HistoryItem,
    MetricStore,
    Point,
    Quota,
    Row,
    Series,
    dimensions_of,
    stats_of,
)
from shipyard.storage.tags import TagStore

PUT_SOURCE = "put"
"""The source of PutMetricData's rows."""

MAX_QUERIES = 500
MAX_ROWS = 2_000_000
"""The most stored rows one GetMetricData may read (its queries' rows added up, a
series named twice counted twice): a bound on one request's work."""
MAX_DATAPOINTS = 100_800
"""GetMetricData's default MaxDatapoints; GetMetricStatistics answers at most 1,440."""

STATES = ("OK", "ALARM", "INSUFFICIENT_DATA")
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
"""The comparison operators of static thresholds (anomaly bands are not supported)."""


@dataclass(frozen=True, slots=True)
class MetricStat:
    namespace: str
    name: str
    dimensions: Dimensions
    period: int
    statistic: str


@dataclass(slots=True)
class Query:
    """One MetricDataQuery: a MetricStat or an Expression."""

    id: str
    stat: MetricStat | None = None
    expression: str | None = None
    label: str | None = None
    return_data: bool = True
    period: int | None = None


@dataclass(slots=True)
class Result:
    id: str
    label: str
    points: dict[int, float] = field(default_factory=dict)


def reserved(namespace: str) -> bool:
    """Whether ``namespace`` is the gateway's own (``AWS/`` and ``/aws/``, any case):
    what it records there, no caller may put."""
    return namespace.lower().startswith(("aws/", "/aws/"))


def quota(limit: int, owner: str | None) -> Quota:
    """``limit`` in all, a tenth of it for ``owner`` (a key's id; none for "", a caller
    with no ``auth:``, or None, the operator's)."""
    return Quota(total=limit, per_owner=max(limit // 10, 1) if owner else None)


def resolution(period: int) -> int:
    """The rows a period reads: 10 s rows below a minute (or off a minute's multiple)."""
    return 60 if period % 60 == 0 else 10


def check_period(period: int, *, what: str = "Period") -> None:
    if (
        period < 1
        or (period >= 60 and period % 60)
        or (period < 60 and period not in (1, 5, 10, 20, 30))
    ):
        raise InvalidParameterValue(
            f"The parameter {what} must be 1, 5, 10, 20, 30 or a multiple of 60; it is {period}."
        )


class CloudWatchService:
    """Metrics and alarms (see the module)."""

    def __init__(
        self,
        *,
        store: MetricStore,
        region: str,
        account_id: str,
        check_action: Callable[[str], str | None],
        transition: Callable[[Alarm, str, str, str | None], bool],
        retention_days: float,
        max_series: int = 100_000,
        max_alarms: int = 5000,
        tags: TagStore | None = None,
        wake_alarms: Callable[[], None] = lambda: None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.region = region
        self.account_id = account_id
        self.check_action = check_action
        """An alarm action's ARN -> None when it can be run, else why not."""
        self.transition = transition
        """Moves an alarm to a state and runs its actions (cloudwatch/alarms.py)."""
        self.retention_days = retention_days
        self.max_series = max_series
        """Series callers may create, all together; each key a tenth of it."""
        self.max_alarms = max_alarms
        """Alarms, all together; each key may create a tenth of it."""
        self.tags = tags or TagStore(store.engine)
        """Alarms' tags, by ARN (TagResource, ListTagsForResource, UntagResource)."""
        self._wake_alarms = wake_alarms
        self._clock = clock or (lambda: datetime.now(UTC).timestamp())

    def __repr__(self) -> str:
        return f"CloudWatchService({self.store!r})"

    # -- metrics ----------------------------------------------------------------------

    def namespace_arn(self, namespace: str) -> str:
        """A namespace as a resource a scoped key must reach (the name verbatim)."""
        return f"arn:aws:cloudwatch:{self.region}:{self.account_id}:namespace/{namespace}"

    def put_metric_data(
        self, namespace: str, data: Sequence[dict[str, Any]], *, owner: str = ""
    ) -> None:
        """Record ``data``; a series it creates is ``owner``'s (the caller's key id, ""
        with no ``auth:``), within the series quota."""
        if reserved(namespace):
            raise InvalidParameterValue(
                f"The value {namespace} for parameter Namespace is invalid: the AWS/ and "
                "/aws/ namespaces are reserved for the gateway's own metrics."
            )
        self._put(namespace, data, owner=owner)

    def put_own_metric_data(self, namespace: str, data: Sequence[dict[str, Any]]) -> None:
        """Record ``data`` in one of the gateway's own namespaces (Model Monitor's
        ``aws/sagemaker/Endpoints/data-metrics``), as the operator's series."""
        self._put(namespace, data, owner=None)

    def _put(self, namespace: str, data: Sequence[dict[str, Any]], *, owner: str | None) -> None:
        now = self._clock()
        points: list[Point] = []
        for n, datum in enumerate(data, start=1):
            stats = _datum_stats(datum, n)
            when = float(datum.get("Timestamp", now))
            if when < now - 14 * 86_400 or when > now + 2 * 3600:
                raise InvalidParameterValue(
                    f"The parameter MetricData.member.{n}.Timestamp must be within the past "
                    "two weeks and no more than two hours ahead."
                )
            dims = _dimensions(datum.get("Dimensions"))
            for period in (10, 60):
                start = int(when // period * period)
                points.append(
                    Point(
                        namespace,
                        datum["MetricName"],
                        dims,
                        period,
                        start,
                        stats,
                        datum.get("Unit"),
                    )
                )
        self.store.write(
            points, PUT_SOURCE, seen=int(now), owner=owner, quota=quota(self.max_series, owner)
        )

    def list_metrics(
        self,
        *,
        namespace: str | None,
        name: str | None,
        dimensions: Sequence[dict[str, Any]],
        recently_active: bool,
    ) -> list[Series]:
        now = self._clock()
        since = now - (3 * 3600 if recently_active else 14 * 86_400)
        found = self.store.list_series(namespace=namespace, name=name, since=int(since))
        wanted = [(str(d["Name"]), d.get("Value")) for d in dimensions]
        return [s for s in found if _dimensions_match(s.dimensions, wanted)]

    def statistics(
        self,
        stat: MetricStat,
        start: float,
        end: float,
        statistics: Sequence[str],
        unit: str | None = None,
    ) -> tuple[str, list[tuple[int, StatSet]]]:
        """GetMetricStatistics: the metric's unit ("None" where it has none) and each
        period's statistic set, oldest first; none for a ``unit`` not the metric's, as
        CloudWatch keeps data of another unit apart."""
        check_period(stat.period)
        if end <= start:
            raise InvalidParameterValue("The parameter StartTime must be before EndTime.")
        periods = math.ceil((end - start) / stat.period)
        if periods > 1440:
            raise InvalidParameterCombination(
                f"You have requested up to {periods} datapoints, which exceeds the limit of 1440. "
                "You may reduce the datapoints requested by increasing Period, or decreasing the "
                "time range."
            )
        for name in statistics:
            if not is_statistic(name):
                raise InvalidParameterValue(f"The statistic {name} is not supported.")
        series = self.store.find(stat.namespace, stat.name, stat.dimensions)
        if series is None:
            return unit or "None", []
        stored = series.unit or "None"
        if unit is not None and unit != stored:
            return unit, []
        return stored, sorted(self._buckets(series.id, stat.period, start, end).items())

    def _buckets(self, series: int, period: int, start: float, end: float) -> dict[int, StatSet]:
        step = resolution(period)
        origin = int(start // step * step)
        rows = self.store.read([series], step, origin, int(end), distributions=True)[series]
        return _bucketed(rows, origin, period)

    def metric_data(self, queries: Sequence[Query], start: float, end: float) -> list[Result]:
        """GetMetricData: every query's series, ReturnData's or not, in the order given."""
        if not queries:
            raise MissingParameter("The parameter MetricDataQueries is required.")
        if len(queries) > MAX_QUERIES:
            raise InvalidParameterValue(f"At most {MAX_QUERIES} MetricDataQueries are allowed.")
        if end <= start:
            raise InvalidParameterValue("The parameter StartTime must be before EndTime.")
        ids = [q.id for q in queries]
        if len(set(ids)) != len(ids):
            raise InvalidParameterValue("The Id of each MetricDataQuery must be unique.")
        results: dict[str, Result] = {}
        stats = [q for q in queries if q.stat is not None]
        for q in stats:
            assert q.stat is not None
            check_period(q.stat.period, what=f"MetricDataQueries {q.id} Period")
            if not is_statistic(q.stat.statistic):
                raise InvalidParameterValue(
                    f"The statistic {q.stat.statistic} of MetricDataQueries {q.id} is not "
                    "supported."
                )
        self._read_stats(stats, start, end, results)
        expressions_left = [q for q in queries if q.expression is not None]
        period = min((q.stat.period for q in stats if q.stat), default=60)
        for q in _in_order(expressions_left):
            assert q.expression is not None
            context = expressions.Context(
                series={k: r.points for k, r in results.items()},
                labels={k: r.label for k, r in results.items()},
                period=q.period or period,
            )
            points = expressions.evaluate(q.expression, context)
            results[q.id] = Result(q.id, q.label or q.id, points)
        return [results[q.id] for q in queries]

    def _read_stats(
        self, queries: Sequence[Query], start: float, end: float, results: dict[str, Result]
    ) -> None:
        # One read per period resolution: 100 endpoints' queries are two queries, not 100.
        wanted: list[tuple[Query, Series | None]] = []
        for q in queries:
            assert q.stat is not None
            s = q.stat
            wanted.append((q, self.store.find(s.namespace, s.name, s.dimensions)))
        # Plain statistics are added up in the database, one read per (resolution,
        # period); percentiles need each row's distribution, read once per resolution.
        plain: dict[tuple[int, int], list[int]] = {}
        kept: dict[int, list[int]] = {}
        for q, series in wanted:
            if series is None or q.stat is None:
                continue
            step = resolution(q.stat.period)
            if percentile_of(q.stat.statistic) is None:
                plain.setdefault((step, q.stat.period), []).append(series.id)
            else:
                kept.setdefault(step, []).append(series.id)
        sums = {
            (step, period): self.store.aggregate(
                ids, step, int(start // step * step), int(end), period
            )
            for (step, period), ids in plain.items()
        }
        rows = {
            step: self.store.read(
                ids, step, int(start // step * step), int(end), distributions=True
            )
            for step, ids in kept.items()
        }
        touched = sum(len(found) for by_series in rows.values() for found in by_series.values())
        if touched > MAX_ROWS:
            raise InvalidParameterValue(
                f"The request reads {touched} datapoints with their distributions, more than "
                f"the {MAX_ROWS} one GetMetricData may: ask for a shorter time range or fewer "
                "percentiles."
            )
        for q, series in wanted:
            stat = q.stat
            assert stat is not None
            result = results[q.id] = Result(q.id, q.label or stat.name)
            if series is None:
                continue
            step = resolution(stat.period)
            if percentile_of(stat.statistic) is None:
                found = sums[(step, stat.period)][series.id]
                pick = _PICK[stat.statistic]
                result.points = {slot: pick(v) for slot, v in found.items() if v[0] > 0}
                continue
            origin = int(start // step * step)
            for slot, stats in _bucketed(rows[step][series.id], origin, stat.period).items():
                value = stats.value(stat.statistic)
                if value is not None:
                    result.points[slot] = value

    # -- alarms -----------------------------------------------------------------------

    def alarm_arn(self, name: str) -> str:
        return f"arn:aws:cloudwatch:{self.region}:{self.account_id}:alarm:{name}"

    def put_alarm(
        self,
        name: str,
        config: dict[str, Any],
        tags: Sequence[dict[str, Any]] = (),
        *,
        owner: str | None = None,
    ) -> Alarm:
        """Create or update an alarm; a new one starts INSUFFICIENT_DATA, an updated one
        keeps its state until its next evaluation (as CloudWatch does). A new one is
        ``owner``'s (a key's id, "" with no ``auth:``, None the operator's), within the
        alarm quota."""
        check_alarm(config)
        for key in ("AlarmActions", "OKActions", "InsufficientDataActions"):
            for arn in config.get(key) or ():
                why = self.check_action(arn)
                if why is not None:
                    raise InvalidParameterValue(f"Invalid {key} {arn}: {why}")
        current = self.store.get_alarm(name)
        when = datetime.fromtimestamp(self._clock(), UTC)
        if current is None:
            alarm = Alarm(
                name=name,
                arn=self.alarm_arn(name),
                config=config,
                state="INSUFFICIENT_DATA",
                reason="Unchecked: Initial alarm creation",
                reason_data=None,
                state_updated=when,
                config_updated=when,
            )
            summary = f'Alarm "{name}" created'
        else:
            alarm = Alarm(
                name=name,
                arn=current.arn,
                config=config,
                state=current.state,
                reason=current.reason,
                reason_data=current.reason_data,
                state_updated=current.state_updated,
                config_updated=when,
            )
            summary = f'Alarm "{name}" updated'
        data = json.dumps({"type": "Update", "updatedAlarm": _history_config(name, config)})
        self.store.put_alarm(
            alarm,
            HistoryItem(name, when, "ConfigurationUpdate", summary, data),
            owner=owner,
            quota=quota(self.max_alarms, owner),
        )
        if tags:
            self.tags.add(alarm.arn, {str(t["Key"]): str(t.get("Value", "")) for t in tags})
        self._wake_alarms()
        return alarm

    def _alarm_arn_known(self, arn: str) -> None:
        prefix = f"arn:aws:cloudwatch:{self.region}:{self.account_id}:alarm:"
        if not arn.startswith(prefix) or self.store.get_alarm(arn[len(prefix) :]) is None:
            raise AlarmNotFound(f"Alarm {arn} not found")

    def tag(self, arn: str, tags: Sequence[dict[str, Any]]) -> None:
        self._alarm_arn_known(arn)
        self.tags.add(arn, {str(t["Key"]): str(t.get("Value", "")) for t in tags})

    def tags_of(self, arn: str) -> list[dict[str, str]]:
        self._alarm_arn_known(arn)
        return [{"Key": k, "Value": v} for k, v in self.tags.get(arn)]

    def untag(self, arn: str, keys: Sequence[str]) -> None:
        self._alarm_arn_known(arn)
        self.tags.delete(arn, list(keys))

    def describe_alarms(
        self,
        *,
        names: Sequence[str] | None = None,
        prefix: str | None = None,
        state: str | None = None,
        action_prefix: str | None = None,
    ) -> list[Alarm]:
        alarms = self.store.list_alarms()
        if names:
            wanted = set(names)
            alarms = [a for a in alarms if a.name in wanted]
        if prefix:
            alarms = [a for a in alarms if a.name.startswith(prefix)]
        if state:
            alarms = [a for a in alarms if a.state == state]
        if action_prefix:
            alarms = [
                a
                for a in alarms
                if any(x.startswith(action_prefix) for x in a.config.get("AlarmActions") or ())
            ]
        return alarms

    def alarms_for_metric(
        self,
        namespace: str,
        name: str,
        dimensions: Dimensions,
        statistic: str | None,
        period: int | None,
    ) -> list[Alarm]:
        out = []
        for alarm in self.store.list_alarms():
            c = alarm.config
            if c.get("Namespace") != namespace or c.get("MetricName") != name:
                continue
            if _dimensions(c.get("Dimensions")) != dimensions:
                continue
            if statistic is not None and statistic not in (
                c.get("Statistic"),
                c.get("ExtendedStatistic"),
            ):
                continue
            if period is not None and c.get("Period") != period:
                continue
            out.append(alarm)
        return out

    def set_alarm_state(self, name: str, state: str, reason: str, data: str | None) -> None:
        """SetAlarmState: the state until the next evaluation, with its actions run."""
        alarm = self.store.get_alarm(name)
        if alarm is None:
            raise AlarmNotFound(f"Alarm {name} not found")
        if data is not None:
            try:
                json.loads(data)
            except (ValueError, RecursionError):
                raise InvalidFormat("The parameter StateReasonData is not valid JSON.") from None
        if state != alarm.state:
            self.transition(alarm, state, reason, data)

    def delete_alarms(self, names: Sequence[str]) -> None:
        known = {a.name for a in self.store.list_alarms()}
        missing = [n for n in names if n not in known]
        if missing:
            raise AlarmNotFound(f"{len(missing)}/{len(names)} alarms not found: {missing}")
        self.store.delete_alarms(names)
        for name in names:
            self.tags.delete(self.alarm_arn(name))

    def history(self, **filters: Any) -> list[HistoryItem]:
        return self.store.history(**filters)


def check_alarm(config: dict[str, Any]) -> None:
    """What botocore's model cannot say of PutMetricAlarm (CloudWatch's own rules)."""
    if config.get("Metrics"):
        _check_math_alarm(config)
    else:
        _check_metric_alarm(config)
    operator = config.get("ComparisonOperator")
    if operator not in OPERATORS:
        raise InvalidParameterValue(
            f"ComparisonOperator {operator} is not supported: use one of {', '.join(OPERATORS)} "
            "(anomaly detection bands are not)."
        )
    if config.get("Threshold") is None:
        raise MissingParameter("The parameter Threshold is required.")
    periods = int(config["EvaluationPeriods"])
    to_alarm = int(config.get("DatapointsToAlarm") or periods)
    if not 1 <= to_alarm <= periods:
        raise InvalidParameterValue(
            f"DatapointsToAlarm ({to_alarm}) must be between 1 and EvaluationPeriods ({periods})."
        )
    period = alarm_period(config)
    if period not in (10, 30) and period % 60:
        raise InvalidParameterValue(
            f"The alarm's Period must be 10, 30 or a multiple of 60 seconds; it is {period}."
        )
    if period * periods > 7 * 86_400:
        raise InvalidParameterValue(
            "Period times EvaluationPeriods must not exceed one week (604800 seconds)."
        )
    missing = config.get("TreatMissingData", "missing")
    if missing not in ("breaching", "notBreaching", "ignore", "missing"):
        raise InvalidParameterValue(
            f"TreatMissingData {missing} is not valid: use breaching, notBreaching, ignore or "
            "missing."
        )


_SINGLE = ("MetricName", "Namespace", "Statistic", "ExtendedStatistic", "Period", "Dimensions")


def _check_math_alarm(config: dict[str, Any]) -> None:
    metrics = config["Metrics"]
    check_query_ids(metrics, "Metrics")
    given = [k for k in _SINGLE if config.get(k) not in (None, [])]
    if given:
        raise InvalidParameterCombination(
            f"Metrics may not be used with {', '.join(given)}: an alarm watches one metric "
            "or metric math."
        )
    returned = [m for m in metrics if m.get("ReturnData", True)]
    if len(returned) != 1:
        raise InvalidParameterValue(
            "Exactly one element of the Metrics list must have ReturnData set to true."
        )
    # Each expression is tried once on empty series: one that cannot be evaluated is
    # refused now, not at every evaluation.
    empty = expressions.Context(series={m["Id"]: {} for m in metrics}, labels={}, period=60)
    for m in metrics:
        if m.get("Expression") is not None:
            expressions.evaluate(m["Expression"], empty)
        query = query_of(m)
        if query.stat is not None:
            check_period(query.stat.period, what=f"Metrics {query.id} Period")
            if not is_statistic(query.stat.statistic):
                raise InvalidParameterValue(
                    f"The statistic {query.stat.statistic} is not supported."
                )


def _check_metric_alarm(config: dict[str, Any]) -> None:
    for key in ("MetricName", "Namespace", "Period"):
        if config.get(key) is None:
            raise MissingParameter(f"The parameter {key} is required.")
    if (config.get("Statistic") is None) == (config.get("ExtendedStatistic") is None):
        raise InvalidParameterCombination(
            "Exactly one of the parameters Statistic and ExtendedStatistic must be given."
        )
    extended = config.get("ExtendedStatistic")
    if extended is not None and not is_statistic(extended):
        raise InvalidParameterValue(
            f"The parameter ExtendedStatistic {extended} is not supported: use a percentile, "
            "pNN or pNN.NN."
        )
    check_period(int(config["Period"]))


def alarm_period(config: dict[str, Any]) -> int:
    """The period an alarm evaluates by: its own, or its returned metric's."""
    if config.get("Period") is not None:
        return int(config["Period"])
    for m in config.get("Metrics") or ():
        if m.get("ReturnData", True):
            if m.get("Period") is not None:
                return int(m["Period"])
            if m.get("MetricStat"):
                return int(m["MetricStat"]["Period"])
    periods = [
        int(m["MetricStat"]["Period"]) for m in config.get("Metrics") or () if m.get("MetricStat")
    ]
    return min(periods, default=60)


def queries_of(config: dict[str, Any]) -> tuple[list[Query], str]:
    """An alarm's metric as GetMetricData queries, and the id of the one it compares."""
    if not config.get("Metrics"):
        stat = MetricStat(
            namespace=config["Namespace"],
            name=config["MetricName"],
            dimensions=_dimensions(config.get("Dimensions")),
            period=int(config["Period"]),
            statistic=config.get("Statistic") or config["ExtendedStatistic"],
        )
        return [Query("m", stat=stat)], "m"
    queries = [query_of(m) for m in config["Metrics"]]
    returned = next(m["Id"] for m in config["Metrics"] if m.get("ReturnData", True))
    return queries, returned


def query_of(m: dict[str, Any]) -> Query:
    """A MetricDataQuery (as AWS spells it) as a Query."""
    stat = m.get("MetricStat")
    if stat is None and m.get("Expression") is None:
        raise InvalidParameterValue(
            f"MetricDataQueries {m.get('Id')}: give MetricStat or Expression."
        )
    if stat is not None and m.get("Expression") is not None:
        raise InvalidParameterValue(
            f"MetricDataQueries {m.get('Id')}: give MetricStat or Expression, not both."
        )
    query_id = m["Id"]
    return Query(
        id=query_id,
        stat=None if stat is None else _metric_stat(query_id, stat),
        expression=m.get("Expression"),
        label=m.get("Label"),
        return_data=m.get("ReturnData", True),
        period=m.get("Period"),
    )


_QUERY_ID = re.compile(r"[a-z][a-zA-Z0-9_]*")
"""A MetricDataQuery's Id, as CloudWatch requires it (botocore's documentation)."""


def check_query_ids(queries: Sequence[dict[str, Any]], what: str) -> None:
    """InvalidParameterValue for a query Id CloudWatch refuses: checked on what a caller
    gives (GetMetricData, PutMetricAlarm), never on an alarm stored before it was."""
    for m in queries:
        query_id = m.get("Id")
        if isinstance(query_id, str) and not _QUERY_ID.fullmatch(query_id):
            raise InvalidParameterValue(
                f"The value {query_id} for parameter {what}.Id is not matching the "
                "expected pattern ^[a-z][a-zA-Z0-9_]*$."
            )


def _metric_stat(query_id: str, stat: dict[str, Any]) -> MetricStat:
    metric = stat["Metric"]
    # botocore's Metric shape requires none of its members; CloudWatch requires both.
    for member in ("Namespace", "MetricName"):
        if not metric.get(member):
            raise MissingParameter(
                f"MetricDataQueries {query_id}: MetricStat.Metric.{member} is required."
            )
    return MetricStat(
        namespace=metric["Namespace"],
        name=metric["MetricName"],
        dimensions=_dimensions(metric.get("Dimensions")),
        period=int(stat["Period"]),
        statistic=stat["Stat"],
    )


def _bucketed(rows: Sequence[Row], origin: int, period: int) -> dict[int, StatSet]:
    """Stored rows added up into ``period``-long buckets from ``origin``."""
    buckets: dict[int, StatSet] = {}
    for row in rows:
        slot = origin + (row[0] - origin) // period * period
        stats = stats_of(row)
        found = buckets.get(slot)
        if found is None:
            buckets[slot] = stats
        else:
            found.add(stats)
    return buckets


_PICK: dict[str, Callable[[tuple[float, float, float, float]], float]] = {
    "SampleCount": lambda v: v[0],
    "Sum": lambda v: v[1],
    "Average": lambda v: v[1] / v[0],
    "Minimum": lambda v: v[2],
    "Maximum": lambda v: v[3],
}
"""A plain statistic from a bucket's (count, sum, min, max)."""


def _in_order(queries: list[Query]) -> list[Query]:
    """Expressions ordered so each comes after the expressions it names (each parsed
    once; Kahn's algorithm)."""
    ids = {q.id for q in queries}
    needs = {q.id: expressions.ids_in(q.expression or "") & ids - {q.id} for q in queries}
    by_id = {q.id: q for q in queries}
    ready = [q.id for q in queries if not needs[q.id]]
    out: list[Query] = []
    while ready:
        done = ready.pop()
        out.append(by_id[done])
        for other, wanted in needs.items():
            if done in wanted:
                wanted.discard(done)
                if not wanted:
                    ready.append(other)
    if len(out) != len(queries):
        circle = sorted(q for q in ids if needs[q])
        raise InvalidParameterValue(
            f"The expressions {', '.join(circle)} name each other in a circle."
        )
    return out


def _dimensions(items: Sequence[dict[str, Any]] | None) -> Dimensions:
    dims = dimensions_of(items)
    if len({n for n, _ in dims}) != len(dims):
        raise InvalidParameterValue("A dimension name may appear only once per metric.")
    return dims


def _dimensions_match(have: Dimensions, wanted: Sequence[tuple[str, Any]]) -> bool:
    given = dict(have)
    for name, value in wanted:
        if name not in given or (value is not None and given[name] != value):
            return False
    return True


def _datum_stats(datum: dict[str, Any], n: int) -> StatSet:
    where = f"MetricData.member.{n}"
    given = [k for k in ("Value", "StatisticValues", "Values") if datum.get(k) is not None]
    if len(given) > 1:
        raise InvalidParameterCombination(
            f"The parameters {where}.{' and '.join(given)} are mutually exclusive."
        )
    if not given:
        raise MissingParameter(
            f"The parameter {where}.Value, StatisticValues or Values is required."
        )
    if datum.get("Value") is not None:
        value = _finite(datum["Value"], f"{where}.Value")
        stats = StatSet()
        stats.observe(value)
        return stats
    if datum.get("StatisticValues") is not None:
        s = datum["StatisticValues"]
        count = _finite(s["SampleCount"], f"{where}.StatisticValues.SampleCount")
        if count <= 0:
            raise InvalidParameterValue(
                f"The parameter {where}.StatisticValues.SampleCount must be > 0."
            )
        low = _finite(s["Minimum"], f"{where}.StatisticValues.Minimum")
        high = _finite(s["Maximum"], f"{where}.StatisticValues.Maximum")
        if low > high:
            raise InvalidParameterValue(
                f"The parameter {where}.StatisticValues.Minimum is above its Maximum."
            )
        return StatSet.of(count, _finite(s["Sum"], f"{where}.StatisticValues.Sum"), low, high)
    values = datum["Values"]
    counts = datum.get("Counts") or [1.0] * len(values)
    if len(counts) != len(values):
        raise InvalidParameterValue(f"The parameters {where}.Values and Counts must be as long.")
    stats = StatSet()
    for value, count in zip(values, counts, strict=True):
        weight = _finite(count, f"{where}.Counts")
        if weight > 0:
            stats.observe(_finite(value, f"{where}.Values"), weight)
    if stats.count <= 0:
        raise InvalidParameterValue(f"The parameter {where}.Counts holds no positive count.")
    return stats


def _finite(value: Any, where: str) -> float:
    number = float(value)
    if not math.isfinite(number) or abs(number) > 2**360:
        raise InvalidParameterValue(f"The value {value} for parameter {where} is invalid.")
    return number


def _history_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"alarmName": name, **{k[0].lower() + k[1:]: v for k, v in config.items()}}
