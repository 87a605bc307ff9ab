"""The domain arithmetic of CloudWatch: statistic sets, metric math, alarm verdicts and
step scaling adjustments."""

from __future__ import annotations

import random

import pytest

from shipyard.autoscaling.scaling import step_wanted
from shipyard.cloudwatch.alarms import judge
from shipyard.cloudwatch.expressions import Context, evaluate
from shipyard.cloudwatch.service import check_query_ids, queries_of
from shipyard.errors import InvalidParameterValue
from shipyard.statsets import StatSet


def test_percentiles_are_within_their_bucket_of_the_true_value() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(6, 1.5) for _ in range(20_000)]
    left, right = StatSet(), StatSet()
    for n, value in enumerate(values):
        (left if n % 2 else right).observe(value)
    left.add(right)  # two gateways' sets, merged
    values.sort()
    for p in (50, 90, 99, 99.9):
        true = values[min(int(p / 100 * len(values)), len(values) - 1)]
        assert left.value(f"p{p:g}") == pytest.approx(true, rel=0.03)
    assert left.value("SampleCount") == 20_000
    assert left.value("Minimum") == values[0] and left.value("Maximum") == values[-1]
    assert left.value("Average") == pytest.approx(sum(values) / len(values))


def test_sets_given_as_numbers_answer_the_plain_statistics_only() -> None:
    numbers = StatSet.of(4, 10.0, 1.0, 4.0)
    assert numbers.value("Sum") == 10.0 and numbers.value("Average") == 2.5
    assert numbers.value("p90") is None
    assert StatSet().value("Sum") is None
    assert StatSet.of(3, 3.0, 1.0, 1.0).value("p99") == 1.0  # one value: every percentile


def context(**series: dict[int, float]) -> Context:
    return Context(series=series, labels={k: k.upper() for k in series}, period=60)


def test_metric_math() -> None:
    c = context(a={0: 1.0, 60: 2.0, 120: 4.0}, b={0: 1.0, 60: 0.0})
    assert evaluate("100 * a / b", c) == {0: 100.0}  # a point divided by zero is left out
    assert evaluate("a + b", c) == {0: 2.0, 60: 2.0}
    assert evaluate("SUM([a, b])", c) == {0: 2.0, 60: 2.0, 120: 4.0}
    assert evaluate("a ^ 2 - 1", c) == {0: 0.0, 60: 3.0, 120: 15.0}
    assert evaluate("SUM(a)", c) == {0: 7.0, 60: 7.0, 120: 7.0}
    assert evaluate("FILL(b, 9)", c) == {0: 1.0, 60: 0.0, 120: 9.0}
    assert evaluate("MAX(METRICS())", c) == {0: 1.0, 60: 2.0, 120: 4.0}
    assert evaluate("AVG(METRICS('B'))", c) == {0: 1.0, 60: 0.0}
    assert evaluate("RATE(a)", c) == {60: 1 / 60, 120: 2 / 60}
    assert evaluate("-ABS(b - a)", c) == {0: -0.0, 60: -2.0}
    assert evaluate("PERIOD(a)", c) == {0: 60.0, 60: 60.0, 120: 60.0}


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "a.real",
        "(lambda: 1)()",
        "a if a else b",
        "a < b",
        "'text'",
        "c + 1",
        "SUM(a, key=b)",
        "[a, b] + [a]",
        "[a, b]",
        "NOPE(a)",
        "ABS(" * 60 + "a" + ")" * 60,
        "a" * 3000,
        "a + 1" + "0" * 400,
        "SUM([" + ", ".join(["METRICS()"] * 200) + "])",
    ],
)
def test_anything_else_is_refused(expression: str) -> None:
    big = {t: 1.0 for t in range(0, 600_000, 60)}  # 10,000 points
    with pytest.raises(InvalidParameterValue):
        evaluate(expression, context(a=big, b={0: 2.0}))


ALARM = {"Threshold": 5.0, "ComparisonOperator": "GreaterThanThreshold", "EvaluationPeriods": 3}


def test_m_out_of_n_breaching_datapoints_alarm() -> None:
    config = {**ALARM, "DatapointsToAlarm": 2}
    assert judge(config, [9.0, 1.0, 9.0], "OK").state == "ALARM"  # type: ignore[union-attr]
    assert judge(config, [1.0, 1.0, 9.0], "ALARM").state == "OK"  # type: ignore[union-attr]
    verdict = judge(ALARM, [9.0, 9.0, 9.0], "OK")
    assert verdict is not None and verdict.state == "ALARM" and verdict.value == 9.0
    assert "3 out of the last 3 datapoints" in verdict.reason


def test_missing_data_is_treated_as_the_alarm_says() -> None:
    gone: list[float | None] = [None, None, None]
    assert judge(ALARM, gone, "OK").state == "INSUFFICIENT_DATA"  # type: ignore[union-attr]
    assert judge({**ALARM, "TreatMissingData": "ignore"}, gone, "ALARM") is None
    breaching = judge({**ALARM, "TreatMissingData": "breaching"}, gone, "OK")
    assert breaching is not None and breaching.state == "ALARM"
    fine = judge({**ALARM, "TreatMissingData": "notBreaching"}, [None, 9.0, None], "ALARM")
    assert fine is not None and fine.state == "OK"
    # missing: fewer datapoints than DatapointsToAlarm: all of those there must breach
    assert judge(ALARM, [None, None, 9.0], "OK").state == "ALARM"  # type: ignore[union-attr]
    assert judge(ALARM, [None, 1.0, 9.0], "ALARM").state == "OK"  # type: ignore[union-attr]
    assert judge({**ALARM, "TreatMissingData": "ignore"}, [None, None, 9.0], "OK") is None
    some = judge({**ALARM, "DatapointsToAlarm": 1}, [None, 9.0, None], "OK")
    assert some is not None and some.state == "ALARM"


STEPS = {
    "AdjustmentType": "ChangeInCapacity",
    "StepAdjustments": [
        {"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1},
        {"MetricIntervalLowerBound": 0, "MetricIntervalUpperBound": 10, "ScalingAdjustment": 1},
        {"MetricIntervalLowerBound": 10, "ScalingAdjustment": 3},
    ],
}


def test_step_adjustments_are_picked_by_the_breach() -> None:
    assert step_wanted(STEPS, 2, -4.0) == 1
    assert step_wanted(STEPS, 2, 0.0) == 3  # a lower bound is inclusive
    assert step_wanted(STEPS, 2, 10.0) == 5
    percent = {
        "AdjustmentType": "PercentChangeInCapacity",
        "MinAdjustmentMagnitude": 2,
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 10}],
    }
    assert step_wanted(percent, 4, 1.0) == 6  # 10 % of 4 is 0.4: at least 2
    half = {**percent, "MinAdjustmentMagnitude": None}
    half["StepAdjustments"] = [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 50}]
    assert step_wanted(half, 1, 1.0) == 2  # 50 % of 1 is 0.5: one instance
    exact = {"AdjustmentType": "ExactCapacity", "StepAdjustments": [{"ScalingAdjustment": 2}]}
    assert step_wanted(exact, 0, None) == 2


def test_an_alarm_stored_before_query_ids_were_checked_is_still_read() -> None:
    """CloudWatch's query Id rule is held to what callers give now (GetMetricData,
    PutMetricAlarm); an alarm a gateway stored with ``M1`` before keeps being evaluated."""
    stat = {"Metric": {"Namespace": "n", "MetricName": "m"}, "Period": 60, "Stat": "Sum"}
    queries, returned = queries_of({"Metrics": [{"Id": "M1", "MetricStat": stat}]})
    assert [q.id for q in queries] == ["M1"] and returned == "M1"
    with pytest.raises(InvalidParameterValue, match="not matching"):
        check_query_ids([{"Id": "M1"}], "Metrics")
