"""A monitoring schedule's ScheduleExpression and analysis window, in UTC.

The expressions Model Monitor takes, and nothing else:

- ``cron(0 * ? * * *)``: every hour, on the hour;
- ``cron(0 H ? * * *)``: every day at hour H;
- ``cron(0 H/N ? * * *)``: every N hours from hour H;
- ``NOW``: one run at once, over the window ``DataAnalysisStartTime`` to
  ``DataAnalysisEndTime``: ISO 8601 offsets from the run's ScheduledTime (``-PT1H``),
  the start first and at most 24 hours apart.

A cron run's window is the hour before its tick unless the offsets say otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from shipyard.errors import InvalidParameter

NOW = "NOW"
_CRON = re.compile(r"cron\(0 (\*|\d{1,2})(?:/(\d{1,2}))? \? \* \* \*\)")
_OFFSET = re.compile(r"(-?)P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")
MAX_WINDOW = timedelta(hours=24)
HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Cadence:
    """When a schedule's runs are due: ``hours`` of the day (None: a ``NOW`` schedule)."""

    hours: frozenset[int] | None
    start_offset: timedelta
    end_offset: timedelta

    @property
    def once(self) -> bool:
        return self.hours is None

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (a ``NOW`` schedule's: ``after``)."""
        if self.hours is None:
            return after
        tick = after.replace(minute=0, second=0, microsecond=0) + HOUR
        for _ in range(49):
            if tick.hour in self.hours:
                return tick
            tick += HOUR
        raise AssertionError("a cadence has an hour of the day")  # parse() made it so

    def window(self, scheduled: datetime) -> tuple[datetime, datetime]:
        return scheduled + self.start_offset, scheduled + self.end_offset


def parse(
    config: dict[str, object], field: str = "MonitoringScheduleConfig.ScheduleConfig"
) -> Cadence:
    """A ScheduleConfig's cadence; InvalidParameter naming the field when it is none of
    the forms above."""
    expression = str(config.get("ScheduleExpression", "")).strip()
    start = config.get("DataAnalysisStartTime")
    end = config.get("DataAnalysisEndTime")
    if expression == NOW:
        if start is None or end is None:
            raise InvalidParameter(
                f"{field}: ScheduleExpression NOW needs DataAnalysisStartTime and "
                "DataAnalysisEndTime."
            )
        begin, finish = _offset(start, field, "Start"), _offset(end, field, "End")
        if begin >= finish:
            raise InvalidParameter(
                f"{field}: DataAnalysisStartTime must come before DataAnalysisEndTime."
            )
        if finish - begin > MAX_WINDOW:
            raise InvalidParameter(
                f"{field}: DataAnalysisStartTime and DataAnalysisEndTime are at most 24 hours "
                "apart."
            )
        return Cadence(None, begin, finish)
    match = _CRON.fullmatch(expression)
    if match is None:
        raise InvalidParameter(
            f"{field}.ScheduleExpression: {expression[:100]!r} is not a schedule Model Monitor "
            "takes: cron(0 * ? * * *), cron(0 H ? * * *), cron(0 H/N ? * * *) or NOW."
        )
    hour, every = match.group(1), match.group(2)
    if hour == "*":
        if every is not None:
            raise InvalidParameter(
                f"{field}.ScheduleExpression: {expression!r}: use cron(0 0/N ? * * *)."
            )
        hours = frozenset(range(24))
    else:
        first, step = int(hour), int(every) if every is not None else 24
        if first > 23 or not 1 <= step <= 24:
            raise InvalidParameter(
                f"{field}.ScheduleExpression: {expression!r} names no hour of the day."
            )
        hours = frozenset(range(first, 24, step))
    begin = _offset(start, field, "Start") if start is not None else -HOUR
    finish = _offset(end, field, "End") if end is not None else timedelta(0)
    if begin >= finish or finish - begin > MAX_WINDOW:
        raise InvalidParameter(
            f"{field}: DataAnalysisStartTime must come before DataAnalysisEndTime, at most 24 "
            "hours before it."
        )
    return Cadence(hours, begin, finish)


def _offset(value: object, field: str, which: str) -> timedelta:
    match = _OFFSET.fullmatch(str(value).strip())
    if match is None or not any(match.groups()[1:]):
        raise InvalidParameter(
            f"{field}.DataAnalysis{which}Time: {str(value)[:50]!r} is not an ISO 8601 offset "
            "such as -PT1H."
        )
    sign, days, hours, minutes, seconds = match.groups()
    span = timedelta(
        days=int(days or 0),
        hours=int(hours or 0),
        minutes=int(minutes or 0),
        seconds=int(seconds or 0),
    )
    return -span if sign else span
