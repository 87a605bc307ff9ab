"""What callers may make of CloudWatch, bounded: metric series and alarms
per key and in all, and the gateway's own namespaces, which no caller may put into."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess
from tests.e2e.test_auth import SECRETS, client, error_code, write_stack

WATCHER, WATCHER_SECRET = "AKIATESTQUOTAW000001", "quota-watcher-secret"


def datum(name: str, value: float = 1.0) -> dict[str, Any]:
    return {"MetricName": name, "Value": value}


def limited(code: str, call: Callable[[], object]) -> None:
    found, status, message = error_code(call)
    assert (found, status) == (code, 400), message


@pytest.fixture
def quotas(gateway_factory: Callable[..., GatewayProcess], tmp_path: Path) -> tuple[Any, Any, Any]:
    """A gateway with ``auth:`` allowing 50 series and 20 alarms (5 and 2 per key); the
    CloudWatch clients of two keys and the operator's."""
    stack = write_stack(
        tmp_path / "stack.yaml",
        more_keys=[
            {
                "access_key_id": WATCHER,
                "secret_access_key_env": "K_WATCHER",
                "allow": ["cloudwatch:*"],
            }
        ],
    )
    env = {
        **SECRETS,
        "K_WATCHER": WATCHER_SECRET,
        "SHIPYARD_MAX_METRIC_SERIES": "50",
        "SHIPYARD_MAX_ALARMS": "20",
    }
    gw = gateway_factory(extra_env=env, args=["--config", str(stack)])
    one = client(gw, "cloudwatch", WATCHER, WATCHER_SECRET)
    return one, client(gw, "cloudwatch"), gw


def test_a_key_creates_a_tenth_of_the_series_and_another_key_still_can(
    quotas: tuple[Any, Any, Any],
) -> None:
    one, ops, _ = quotas
    one.put_metric_data(Namespace="Shop", MetricData=[datum(f"m{i}") for i in range(5)])
    limited(
        "LimitExceeded", lambda: one.put_metric_data(Namespace="Shop", MetricData=[datum("m5")])
    )
    # A series it made takes more datapoints; a refused put wrote none of its data.
    one.put_metric_data(Namespace="Shop", MetricData=[datum("m0", 2.0), datum("m4")])
    limited(
        "LimitExceeded",
        lambda: one.put_metric_data(Namespace="Shop", MetricData=[datum("m1"), datum("new")]),
    )
    names = {m["MetricName"] for m in ops.list_metrics(Namespace="Shop")["Metrics"]}
    assert names == {f"m{i}" for i in range(5)}
    ops.put_metric_data(Namespace="Shop", MetricData=[datum(f"ops{i}") for i in range(5)])
    assert len(ops.list_metrics(Namespace="Shop")["Metrics"]) == 10


def test_a_key_creates_a_tenth_of_the_alarms_and_another_key_still_can(
    quotas: tuple[Any, Any, Any],
) -> None:
    one, ops, _ = quotas
    alarm = {
        "Namespace": "Shop", "MetricName": "m", "Statistic": "Sum", "Period": 60,
        "EvaluationPeriods": 1, "Threshold": 1.0, "ComparisonOperator": "GreaterThanThreshold",
    }  # fmt: skip
    one.put_metric_alarm(AlarmName="a1", **alarm)
    one.put_metric_alarm(AlarmName="a2", **alarm)
    limited("LimitExceeded", lambda: one.put_metric_alarm(AlarmName="a3", **alarm))
    one.put_metric_alarm(AlarmName="a2", **{**alarm, "Threshold": 2.0})  # an update
    ops.put_metric_alarm(AlarmName="b1", **alarm)
    every = ops.describe_alarms()["MetricAlarms"]
    assert sorted(a["AlarmName"] for a in every) == ["a1", "a2", "b1"]
    one.delete_alarms(AlarmNames=["a1"])
    one.put_metric_alarm(AlarmName="a3", **alarm)  # room again


@pytest.mark.parametrize(
    "namespace", ["AWS/SageMaker", "aws/SageMaker", "Aws/SageMaker", "/aws/sagemaker/Endpoints",
                  "/AWS/x"],
)  # fmt: skip
def test_the_gateways_own_namespaces_are_refused_in_any_case_without_auth(
    gateway: GatewayProcess, namespace: str
) -> None:
    cw = gateway.client("cloudwatch")
    found, status, message = error_code(
        lambda: cw.put_metric_data(Namespace=namespace, MetricData=[datum("CPUUtilization")])
    )
    assert (found, status) == ("InvalidParameterValue", 400), message
    assert cw.list_metrics(Namespace=namespace)["Metrics"] == []


def test_namespaces_that_only_look_like_the_gateways_are_callers(gateway: GatewayProcess) -> None:
    cw = gateway.client("cloudwatch")
    for namespace in ("AWSome/x", "Team/aws/x", "AWS"):
        cw.put_metric_data(Namespace=namespace, MetricData=[datum("m")])
        assert [m["MetricName"] for m in cw.list_metrics(Namespace=namespace)["Metrics"]] == ["m"]


def test_the_gateways_own_namespaces_are_refused_to_a_key_that_reaches_everything(
    quotas: tuple[Any, Any, Any],
) -> None:
    _, ops, _ = quotas
    found, _, _ = error_code(
        lambda: ops.put_metric_data(Namespace="aWs/SageMaker", MetricData=[datum("x")])
    )
    assert found == "InvalidParameterValue"
