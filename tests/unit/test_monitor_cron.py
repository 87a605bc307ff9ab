"""Monitoring schedules' expressions and windows, as Model Monitor takes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shipyard.errors import InvalidParameter
from shipyard.monitoring.cron import parse

AT = datetime(2026, 5, 1, 12, 34, 56, tzinfo=UTC)


def test_an_hourly_schedule_ticks_on_the_next_hour_over_the_hour_before() -> None:
    cadence = parse({"ScheduleExpression": "cron(0 * ? * * *)"})

    tick = cadence.next_tick(AT)

    assert tick == datetime(2026, 5, 1, 13, tzinfo=UTC)
    assert cadence.window(tick) == (datetime(2026, 5, 1, 12, tzinfo=UTC), tick)


def test_a_daily_schedule_ticks_at_its_hour_and_one_every_n_hours_from_its_first() -> None:
    daily = parse({"ScheduleExpression": "cron(0 9 ? * * *)"})
    every = parse({"ScheduleExpression": "cron(0 2/6 ? * * *)"})

    assert daily.next_tick(AT) == datetime(2026, 5, 2, 9, tzinfo=UTC)
    assert every.next_tick(AT) == datetime(2026, 5, 1, 14, tzinfo=UTC)
    assert every.next_tick(datetime(2026, 5, 1, 20, 1, tzinfo=UTC)) == datetime(
        2026, 5, 2, 2, tzinfo=UTC
    )


def test_now_runs_at_once_over_its_offsets() -> None:
    cadence = parse(
        {
            "ScheduleExpression": "NOW",
            "DataAnalysisStartTime": "-PT1H30M",
            "DataAnalysisEndTime": "-PT0H",
        }
    )

    assert cadence.once and cadence.next_tick(AT) == AT
    assert cadence.window(AT) == (AT - timedelta(hours=1, minutes=30), AT)


@pytest.mark.parametrize(
    "config",
    [
        {"ScheduleExpression": "cron(5 * ? * * *)"},
        {"ScheduleExpression": "cron(0 * * * *)"},
        {"ScheduleExpression": "cron(0 25 ? * * *)"},
        {"ScheduleExpression": "rate(1 hour)"},
        {"ScheduleExpression": "NOW"},
        {"ScheduleExpression": "NOW", "DataAnalysisStartTime": "-PT1H"},
        {
            "ScheduleExpression": "NOW",
            "DataAnalysisStartTime": "PT0H",
            "DataAnalysisEndTime": "-PT1H",
        },
        {
            "ScheduleExpression": "NOW",
            "DataAnalysisStartTime": "-PT25H",
            "DataAnalysisEndTime": "PT0H",
        },
        {
            "ScheduleExpression": "NOW",
            "DataAnalysisStartTime": "an hour ago",
            "DataAnalysisEndTime": "PT0H",
        },
    ],
)
def test_what_model_monitor_does_not_take_is_refused(config: dict[str, str]) -> None:
    with pytest.raises(InvalidParameter):
        parse(config)
