"""CloudWatch's actions (``GraniteServiceVersion20100801.*``, or the same names over
Smithy RPC v2 CBOR): metrics and alarms."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from shipyard.cloudwatch.service import (
    MAX_DATAPOINTS,
    CloudWatchService,
    MetricStat,
    check_query_ids,
    query_of,
)
from shipyard.errors import InvalidNextToken, InvalidParameterCombination, InvalidParameterValue
from shipyard.gateway.api.actions.listing import offset, token
from shipyard.gateway.edge.auth import REQUEST_KEY
from shipyard.statsets import STATISTICS
from shipyard.storage.metrics import Alarm, HistoryItem, Series, dimensions_of

T = TypeVar("T")

_LIST_PAGE = 500
_ALARMS_PAGE = 50
_HISTORY_PAGE = 100


def _time(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _page(items: Sequence[T], next_token: str | None, size: int) -> tuple[list[T], str | None]:
    try:
        start = offset(next_token)
    except Exception:
        raise InvalidNextToken("The NextToken is not valid.") from None
    window = list(items[start : start + size])
    return window, token(start + size) if start + size < len(items) else None


def _with_token(out: dict[str, Any], next_token: str | None) -> dict[str, Any]:
    if next_token is not None:
        out["NextToken"] = next_token
    return out


def _dimensions(items: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"Name": n, "Value": v} for n, v in items]


# -- metrics ------------------------------------------------------------------------------


def put_metric_data(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    data = p.get("MetricData") or []
    if not data:
        raise InvalidParameterValue("The parameter MetricData is required.")
    svc.put_metric_data(p["Namespace"], data, owner=REQUEST_KEY.get())
    return {}


def list_metrics(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    found = svc.list_metrics(
        namespace=p.get("Namespace"),
        name=p.get("MetricName"),
        dimensions=p.get("Dimensions") or [],
        recently_active=p.get("RecentlyActive") == "PT3H",
    )
    window, next_token = _page(found, p.get("NextToken"), _LIST_PAGE)
    return _with_token({"Metrics": [_metric(s) for s in window]}, next_token)


def _metric(s: Series) -> dict[str, Any]:
    return {"Namespace": s.namespace, "MetricName": s.name, "Dimensions": _dimensions(s.dimensions)}


def get_metric_statistics(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    plain = p.get("Statistics") or []
    extended = p.get("ExtendedStatistics") or []
    if not plain and not extended:
        raise InvalidParameterValue(
            "Either the parameter Statistics or ExtendedStatistics is required."
        )
    if plain and extended:
        raise InvalidParameterCombination(
            "The parameters Statistics and ExtendedStatistics are mutually exclusive."
        )
    for name in plain:
        if name not in STATISTICS:
            raise InvalidParameterValue(
                f"The statistic {name} is not one of {', '.join(STATISTICS)}."
            )
    stat = MetricStat(
        namespace=p["Namespace"],
        name=p["MetricName"],
        dimensions=dimensions_of(p.get("Dimensions")),
        period=int(p["Period"]),
        statistic="Sum",
    )
    unit, points = svc.statistics(
        stat, float(p["StartTime"]), float(p["EndTime"]), [*plain, *extended], p.get("Unit")
    )
    datapoints = []
    for at, stats in points:
        point: dict[str, Any] = {"Timestamp": _time(at), "Unit": unit}
        for name in plain:
            point[name] = stats.value(name)
        if extended:
            values = {e: stats.value(e) for e in extended}
            point["ExtendedStatistics"] = {k: v for k, v in values.items() if v is not None}
        datapoints.append(point)
    return {"Label": p["MetricName"], "Datapoints": datapoints}


def get_metric_data(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    given = p.get("MetricDataQueries") or []
    check_query_ids(given, "MetricDataQueries")
    queries = [query_of(q) for q in given]
    results = svc.metric_data(queries, float(p["StartTime"]), float(p["EndTime"]))
    descending = p.get("ScanBy", "TimestampDescending") == "TimestampDescending"
    budget = int(p.get("MaxDatapoints") or MAX_DATAPOINTS)
    out = []
    for query, result in zip(queries, results, strict=True):
        if not query.return_data:
            continue
        stamps = sorted(result.points, reverse=descending)
        status = "Complete"
        if len(stamps) > budget:
            stamps, status = stamps[:budget], "PartialData"
        budget = max(budget - len(stamps), 0)
        out.append(
            {
                "Id": result.id,
                "Label": result.label,
                "Timestamps": [_time(t) for t in stamps],
                "Values": [result.points[t] for t in stamps],
                "StatusCode": status,
            }
        )
    return {"MetricDataResults": out, "Messages": []}


# -- alarms -------------------------------------------------------------------------------

_ALARM_FIELDS = (
    "AlarmDescription",
    "ActionsEnabled",
    "OKActions",
    "AlarmActions",
    "InsufficientDataActions",
    "MetricName",
    "Namespace",
    "Statistic",
    "ExtendedStatistic",
    "Dimensions",
    "Period",
    "Unit",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "EvaluateLowSampleCountPercentile",
    "Metrics",
    "ThresholdMetricId",
)


def put_metric_alarm(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    config = {k: p[k] for k in _ALARM_FIELDS if k in p}
    config.setdefault("ActionsEnabled", True)
    svc.put_alarm(p["AlarmName"], config, p.get("Tags") or (), owner=REQUEST_KEY.get())
    return {}


def tag_resource(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    svc.tag(p["ResourceARN"], p["Tags"])
    return {}


def list_tags_for_resource(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    return {"Tags": svc.tags_of(p["ResourceARN"])}


def untag_resource(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    svc.untag(p["ResourceARN"], p["TagKeys"])
    return {}


def describe_alarms(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    types = p.get("AlarmTypes") or ["MetricAlarm"]
    if p.get("AlarmNames") and p.get("AlarmNamePrefix"):
        # botocore: "If this parameter is specified, you cannot specify AlarmNames."
        raise InvalidParameterCombination(
            "The parameters AlarmNames and AlarmNamePrefix are mutually exclusive."
        )
    alarms = svc.describe_alarms(
        names=p.get("AlarmNames"),
        prefix=p.get("AlarmNamePrefix"),
        state=p.get("StateValue"),
        action_prefix=p.get("ActionPrefix"),
    )
    if "MetricAlarm" not in types:
        alarms = []
    window, next_token = _page(alarms, p.get("NextToken"), int(p.get("MaxRecords") or _ALARMS_PAGE))
    out = {"MetricAlarms": [alarm_shape(a) for a in window], "CompositeAlarms": []}
    return _with_token(out, next_token)


def describe_alarms_for_metric(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    alarms = svc.alarms_for_metric(
        p["Namespace"],
        p["MetricName"],
        dimensions_of(p.get("Dimensions")),
        p.get("Statistic") or p.get("ExtendedStatistic"),
        p.get("Period"),
    )
    return {"MetricAlarms": [alarm_shape(a) for a in alarms]}


def delete_alarms(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    svc.delete_alarms(p["AlarmNames"])
    return {}


def set_alarm_state(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    svc.set_alarm_state(p["AlarmName"], p["StateValue"], p["StateReason"], p.get("StateReasonData"))
    return {}


def describe_alarm_history(svc: CloudWatchService, p: dict[str, Any]) -> dict[str, Any]:
    items = svc.history(
        alarm=p.get("AlarmName"),
        item_type=p.get("HistoryItemType"),
        start=_time(float(p["StartDate"])) if p.get("StartDate") is not None else None,
        end=_time(float(p["EndDate"])) if p.get("EndDate") is not None else None,
        newest_first=p.get("ScanBy", "TimestampDescending") == "TimestampDescending",
    )
    window, next_token = _page(items, p.get("NextToken"), int(p.get("MaxRecords") or _HISTORY_PAGE))
    return _with_token({"AlarmHistoryItems": [_history(i) for i in window]}, next_token)


def _history(item: HistoryItem) -> dict[str, Any]:
    return {
        "AlarmName": item.alarm,
        "AlarmType": "MetricAlarm",
        "Timestamp": item.time,
        "HistoryItemType": item.item_type,
        "HistorySummary": item.summary,
        "HistoryData": item.data,
    }


def alarm_shape(a: Alarm) -> dict[str, Any]:
    """A MetricAlarm as DescribeAlarms spells it."""
    out: dict[str, Any] = {
        "AlarmName": a.name,
        "AlarmArn": a.arn,
        "AlarmConfigurationUpdatedTimestamp": a.config_updated,
        "StateValue": a.state,
        "StateReason": a.reason,
        "StateUpdatedTimestamp": a.state_updated,
        "StateTransitionedTimestamp": a.state_updated,
        "OKActions": [],
        "AlarmActions": [],
        "InsufficientDataActions": [],
        "Dimensions": [],
        **a.config,
    }
    if a.reason_data is not None:
        out["StateReasonData"] = a.reason_data
    return out


ACTIONS: dict[str, Callable[[CloudWatchService, dict[str, Any]], dict[str, Any]]] = {
    "PutMetricData": put_metric_data,
    "ListMetrics": list_metrics,
    "GetMetricStatistics": get_metric_statistics,
    "GetMetricData": get_metric_data,
    "PutMetricAlarm": put_metric_alarm,
    "DescribeAlarms": describe_alarms,
    "DescribeAlarmsForMetric": describe_alarms_for_metric,
    "DeleteAlarms": delete_alarms,
    "SetAlarmState": set_alarm_state,
    "DescribeAlarmHistory": describe_alarm_history,
    "TagResource": tag_resource,
    "ListTagsForResource": list_tags_for_resource,
    "UntagResource": untag_resource,
}
