"""CloudWatch Logs (``X-Amz-Target: Logs_20140328.*``): the calls the sagemaker SDK's
``logs_for_job`` and ``aws logs tail`` make: DescribeLogGroups, DescribeLogStreams,
GetLogEvents, FilterLogEvents. Served from logs/service.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.errors import InvalidLogParameter
from shipyard.logs.service import LogService, LogStream

LogAction = Callable[[LogService, dict[str, Any]], dict[str, Any]]


def describe_log_groups(logs: LogService, p: dict[str, Any]) -> dict[str, Any]:
    prefix = p.get("logGroupNamePrefix", "")
    groups = [g for g in logs.groups() if g.startswith(prefix)]
    start = _offset(p.get("nextToken"), "g/")
    size = int(p.get("limit", 50))
    out: dict[str, Any] = {
        "logGroups": [{"logGroupName": g, "storedBytes": 0} for g in groups[start : start + size]]
    }
    if start + size < len(groups):
        out["nextToken"] = f"g/{start + size}"
    return out


def describe_log_streams(logs: LogService, p: dict[str, Any]) -> dict[str, Any]:
    streams = logs.streams(p["logGroupName"])
    prefix = p.get("logStreamNamePrefix", "")
    streams = [s for s in streams if s.name.startswith(prefix)]
    if p.get("orderBy") == "LastEventTime":
        streams.sort(key=lambda s: s.last_written_ms())
    if p.get("descending"):
        streams.reverse()
    start = _offset(p.get("nextToken"), "s/")
    size = int(p.get("limit", 50))
    out: dict[str, Any] = {"logStreams": [_stream(s) for s in streams[start : start + size]]}
    if start + size < len(streams):
        out["nextToken"] = f"s/{start + size}"
    return out


def get_log_events(logs: LogService, p: dict[str, Any]) -> dict[str, Any]:
    stream = logs.stream(p["logGroupName"], p["logStreamName"])
    limit = int(p.get("limit", 10_000))
    token = p.get("nextToken")
    if token:
        start = _offset(token, "f/", "b/")
    elif p.get("startFromHead"):
        start = 0
    else:  # the newest events, as CloudWatch answers without a token
        everything, _ = logs.events(stream, start=0, limit=10**9)
        start = everything[-limit].offset if len(everything) > limit else 0
    events, end = logs.events(stream, start=start, limit=limit)
    return {
        "events": [
            {"timestamp": e.timestamp_ms, "message": e.message, "ingestionTime": e.timestamp_ms}
            for e in events
        ],
        "nextForwardToken": f"f/{end}",
        "nextBackwardToken": f"b/{start}",
    }


def filter_log_events(logs: LogService, p: dict[str, Any]) -> dict[str, Any]:
    """Events of the group's streams, one stream after another; the token says where."""
    streams = logs.streams(p["logGroupName"])
    if names := p.get("logStreamNames"):
        streams = [s for s in streams if s.name in names]
    if prefix := p.get("logStreamNamePrefix"):
        streams = [s for s in streams if s.name.startswith(prefix)]
    pattern = p.get("filterPattern", "")
    start_ms, end_ms = p.get("startTime"), p.get("endTime")
    limit = int(p.get("limit", 10_000))
    index, offset = _filter_position(p.get("nextToken"))
    found: list[dict[str, Any]] = []
    searched = []
    while index < len(streams) and len(found) < limit:
        stream = streams[index]
        searched.append({"logStreamName": stream.name, "searchedCompletely": True})
        events, end = logs.events(stream, start=offset, limit=limit - len(found))
        for event in events:
            if start_ms is not None and event.timestamp_ms < start_ms:
                continue
            if end_ms is not None and event.timestamp_ms > end_ms:
                continue
            if pattern and pattern.strip('"') not in event.message:
                continue
            found.append(
                {
                    "logStreamName": stream.name,
                    "timestamp": event.timestamp_ms,
                    "message": event.message,
                    "ingestionTime": event.timestamp_ms,
                    "eventId": f"{index}-{event.offset}",
                }
            )
        if end >= stream.size() or not events:
            index, offset = index + 1, 0
        else:
            offset = end
    out: dict[str, Any] = {"events": found, "searchedLogStreams": searched}
    if index < len(streams):
        out["nextToken"] = f"x/{index}/{offset}"
    return out


def _stream(stream: LogStream) -> dict[str, Any]:
    last = stream.last_written_ms()
    return {
        "logStreamName": stream.name,
        "creationTime": stream.created_ms,
        "firstEventTimestamp": stream.created_ms,
        "lastEventTimestamp": last,
        "lastIngestionTime": last,
        "storedBytes": stream.size(),
    }


def _offset(token: str | None, *kinds: str) -> int:
    if not token:
        return 0
    for kind in kinds:
        if token.startswith(kind) and token[len(kind) :].isdigit():
            return int(token[len(kind) :])
    raise InvalidLogParameter("The specified nextToken is invalid.")


def _filter_position(token: str | None) -> tuple[int, int]:
    if not token:
        return 0, 0
    kind, _, rest = token.partition("/")
    index, _, offset = rest.partition("/")
    if kind != "x" or not index.isdigit() or not offset.isdigit():
        raise InvalidLogParameter("The specified nextToken is invalid.")
    return int(index), int(offset)


ACTIONS: dict[str, LogAction] = {
    "DescribeLogGroups": describe_log_groups,
    "DescribeLogStreams": describe_log_streams,
    "GetLogEvents": get_log_events,
    "FilterLogEvents": filter_log_events,
}
