"""CloudWatch on the gateway, driven by boto3's ``cloudwatch`` client (AWS
JSON 1.0, what it sends), by botocore in Smithy RPC v2 CBOR (what its model lists first)
and by the AWS CLI: metrics of real invocations under SageMaker's names, sums that
match what was sent, alarms that go to ALARM and back on real error bursts and notify a
real webhook, step scaling run by an alarm, datapoints kept across a restart, and the
refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import botocore.exceptions
import botocore.model
import cbor2
import pytest
import yaml

from tests.conftest import (
    MODELS,
    GatewayProcess,
    deploy,
    unique,
    wait_in_service,
    wait_until,
)
from tests.e2e.test_async import deploy_async, put_input, wait_file

FAST = {"SHIPYARD_METRICS_TICK_S": "2", "SHIPYARD_AUTOSCALING_PERIOD_S": "0.5"}
SNS = "arn:aws:sns:us-east-1:000000000000:ops"


def cw(gw: GatewayProcess) -> Any:
    return gw.client("cloudwatch")


def dims(endpoint: str, variant: str = "v1") -> list[dict[str, str]]:
    return [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": variant}]


def invoke(gw: GatewayProcess, name: str, body: dict[str, Any]) -> bool:
    """True when the model answered, False when it failed (a ModelError)."""
    try:
        gw.rt.invoke_endpoint(
            EndpointName=name, Body=json.dumps(body), ContentType="application/json"
        )
        return True
    except botocore.exceptions.ClientError as exc:
        assert exc.response["Error"]["Code"] == "ModelError", exc.response
        return False


def sums(client: Any, name: str, *metrics: str) -> dict[str, float]:
    """Each metric's Sum over the last hour, one query each, in one GetMetricData."""
    now = time.time()
    answer = client.get_metric_data(
        MetricDataQueries=[
            {
                "Id": f"m{n}",
                "Label": metric,
                "MetricStat": {
                    "Metric": {
                        "Namespace": "AWS/SageMaker",
                        "MetricName": metric,
                        "Dimensions": dims(name),
                    },
                    "Period": 3600,
                    "Stat": "Sum",
                },
            }
            for n, metric in enumerate(metrics)
        ],
        StartTime=now - 3600,
        EndTime=now + 60,
    )
    return {r["Label"]: sum(r["Values"]) for r in answer["MetricDataResults"]}


@contextmanager
def steady_traffic(gw: GatewayProcess, name: str) -> Iterator[list[bool]]:
    """Good requests every 50 ms until the block ends; their outcomes."""
    outcomes: list[bool] = []
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            outcomes.append(invoke(gw, name, {"ok": True}))
            done.wait(0.05)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield outcomes
    finally:
        done.set()
        thread.join()


def refused(call: Callable[[], object], code: str, words: str = "") -> dict[str, Any]:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    error: dict[str, Any] = caught.value.response["Error"]
    assert error["Code"] == code, error
    assert words in error["Message"], error
    return error


def test_invocations_are_counted_under_sagemakers_names_and_add_up(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name = unique("cwsum")
    deploy(gw.sm, name, model_tarball("flaky"))
    outcomes = [invoke(gw, name, {"fail": n % 5 == 0}) for n in range(40)]
    assert outcomes.count(False) == 8
    client = cw(gw)
    wanted = {"Invocations": 40.0, "Invocation5XXErrors": 8.0, "Invocation4XXErrors": 0.0}
    wait_until(
        lambda: sums(client, name, *wanted) == wanted,
        "the sums of the invocations sent",
    )
    listed = client.list_metrics(
        Namespace="AWS/SageMaker", Dimensions=[{"Name": "EndpointName", "Value": name}]
    )
    names = {m["MetricName"] for m in listed["Metrics"]}
    assert {"Invocations", "Invocation4XXErrors", "Invocation5XXErrors", "ModelLatency",
            "OverheadLatency", "InvocationsPerInstance"} <= names, names  # fmt: skip
    assert all(m["Dimensions"] == dims(name) for m in listed["Metrics"]), listed["Metrics"]

    now = time.time()
    asked = {
        "Namespace": "AWS/SageMaker", "MetricName": "ModelLatency", "Dimensions": dims(name),
        "StartTime": now - 3600, "EndTime": now + 60, "Period": 3600,
    }  # fmt: skip
    latency = client.get_metric_statistics(
        **asked, Statistics=["SampleCount", "Average", "Minimum", "Maximum"]
    )["Datapoints"]
    (point,) = latency
    assert point["SampleCount"] == 32  # the answered requests; failed ones have no latency
    assert point["Unit"] == "Microseconds"  # as SageMaker reports it
    (median,) = client.get_metric_statistics(**asked, ExtendedStatistics=["p50"])["Datapoints"]
    assert 0 < point["Minimum"] <= median["ExtendedStatistics"]["p50"] <= point["Maximum"]
    assert point["Maximum"] < 10_000_000  # microseconds: well under 10 s
    # Data of another unit is kept apart: asked in milliseconds, there is none.
    assert (
        client.get_metric_statistics(**asked, Statistics=["SampleCount"], Unit="Milliseconds")[
            "Datapoints"
        ]
        == []
    )

    # Metric math over the same datapoints: the error rate in percent.
    rate = client.get_metric_data(
        MetricDataQueries=[
            {"Id": "errors", "ReturnData": False, "MetricStat": {"Metric": {
                "Namespace": "AWS/SageMaker", "MetricName": "Invocation5XXErrors",
                "Dimensions": dims(name)}, "Period": 3600, "Stat": "Sum"}},
            {"Id": "calls", "ReturnData": False, "MetricStat": {"Metric": {
                "Namespace": "AWS/SageMaker", "MetricName": "Invocations",
                "Dimensions": dims(name)}, "Period": 3600, "Stat": "Sum"}},
            {"Id": "rate", "Expression": "100 * errors / calls", "Label": "error rate"},
        ],
        StartTime=now - 3600, EndTime=now + 60,
    )["MetricDataResults"]  # fmt: skip
    assert [(r["Id"], r["Values"]) for r in rate] == [("rate", [20.0])]


def test_custom_metrics_over_the_cbor_wire_and_the_aws_cli(
    gateway: GatewayProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore's model lists smithy-rpc-v2-cbor first for CloudWatch; boto3 prefers JSON.
    # A client told to take the model's first choice speaks CBOR, as other SDKs do.
    monkeypatch.setattr(
        botocore.model, "PRIORITY_ORDERED_SUPPORTED_PROTOCOLS", ("smithy-rpc-v2-cbor",)
    )
    client = cw(gateway)
    assert client.meta.service_model.resolved_protocol == "smithy-rpc-v2-cbor"
    now = time.time()
    client.put_metric_data(
        Namespace="Shop/Orders",
        MetricData=[
            {"MetricName": "Latency", "Dimensions": [{"Name": "Region", "Value": "eu"}],
             "Values": [10.0, 20.0, 30.0], "Counts": [1.0, 2.0, 1.0], "Timestamp": now},
            {"MetricName": "Latency", "Dimensions": [{"Name": "Region", "Value": "eu"}],
             "StatisticValues": {"SampleCount": 2, "Sum": 100, "Minimum": 40, "Maximum": 60},
             "Timestamp": now},
        ],
    )  # fmt: skip
    stats = client.get_metric_statistics(
        Namespace="Shop/Orders", MetricName="Latency",
        Dimensions=[{"Name": "Region", "Value": "eu"}],
        StartTime=now - 120, EndTime=now + 120, Period=240,
        Statistics=["SampleCount", "Sum", "Minimum", "Maximum", "Average"],
    )["Datapoints"]  # fmt: skip
    assert [
        (p["SampleCount"], p["Sum"], p["Minimum"], p["Maximum"], p["Average"]) for p in stats
    ] == [(6.0, 180.0, 10.0, 60.0, 30.0)]
    assert isinstance(stats[0]["Timestamp"].year, int)  # a CBOR timestamp, parsed
    assert stats[0]["Unit"] == "None"  # put with none
    refused(
        lambda: client.put_metric_data(
            Namespace="AWS/SageMaker", MetricData=[{"MetricName": "x", "Value": 1}]
        ),
        "InvalidParameterValue",
        "reserved",
    )
    refused(lambda: client.describe_alarms(NextToken="not-ours"), "InvalidNextToken")

    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }  # fmt: skip
    aws = [sys.executable, "-m", "awscli", "--endpoint-url", gateway.url, "cloudwatch"]
    done = subprocess.run(
        [*aws, "list-metrics", "--namespace", "Shop/Orders"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["Metrics"] == [
        {
            "Namespace": "Shop/Orders",
            "MetricName": "Latency",
            "Dimensions": [{"Name": "Region", "Value": "eu"}],
        }
    ]


def test_an_alarm_goes_to_alarm_on_an_error_burst_and_back_and_notifies_a_webhook(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
    webhook: Any,
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"ops": [webhook.url]}}))
    gw = gateway_factory(extra_env=FAST, args=["--config", str(stack)])
    name = unique("cwalarm")
    deploy(gw.sm, name, model_tarball("flaky"))
    client = cw(gw)
    client.put_metric_alarm(
        AlarmName=f"{name}-5xx", Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Dimensions=dims(name), Statistic="Sum", Period=10, EvaluationPeriods=1,
        Threshold=3, ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="notBreaching", AlarmActions=[SNS], OKActions=[SNS],
    )  # fmt: skip

    def state() -> str:
        return str(
            client.describe_alarms(AlarmNames=[f"{name}-5xx"])["MetricAlarms"][0]["StateValue"]
        )

    assert state() == "INSUFFICIENT_DATA"
    with steady_traffic(gw, name) as outcomes:
        wait_until(lambda: state() == "OK", "OK on good traffic", timeout_s=60)
        assert [invoke(gw, name, {"fail": True}) for _ in range(6)] == [False] * 6
        wait_until(lambda: state() == "ALARM", "ALARM after the burst", timeout_s=60)
        wait_until(lambda: state() == "OK", "OK again once the errors stop", timeout_s=60)
    assert all(outcomes)  # the steady traffic itself never failed

    alarm = client.describe_alarms(AlarmNames=[f"{name}-5xx"])["MetricAlarms"][0]
    assert alarm["AlarmArn"] == f"arn:aws:cloudwatch:us-east-1:000000000000:alarm:{name}-5xx"
    assert "Threshold Crossed" in alarm["StateReason"]
    json.loads(alarm["StateReasonData"])
    notes = webhook.wait_for(3, timeout_s=30)
    texts = [json.dumps(r.body) for r in notes]
    assert "ALARM" in texts[1] and "OK" in texts[2], texts
    assert f"{name}-5xx" in texts[1], texts
    history = client.describe_alarm_history(AlarmName=f"{name}-5xx", HistoryItemType="StateUpdate")
    summaries = [h["HistorySummary"] for h in reversed(history["AlarmHistoryItems"])]
    assert summaries == [
        "Alarm updated from INSUFFICIENT_DATA to OK",
        "Alarm updated from OK to ALARM",
        "Alarm updated from ALARM to OK",
    ]

    # SetAlarmState runs the actions of the state it sets; the next evaluation decides again.
    client.set_alarm_state(AlarmName=f"{name}-5xx", StateValue="ALARM", StateReason="a drill")
    assert "a drill" in json.dumps(webhook.wait_for(4, timeout_s=30)[3].body)
    assert (
        client.describe_alarms_for_metric(
            Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors", Dimensions=dims(name)
        )["MetricAlarms"][0]["AlarmName"]
        == f"{name}-5xx"
    )
    client.delete_alarms(AlarmNames=[f"{name}-5xx"])
    assert client.describe_alarms()["MetricAlarms"] == []


def test_alarm_refusals(gateway: GatewayProcess) -> None:
    client = cw(gateway)
    base: dict[str, Any] = {
        "AlarmName": "a", "Namespace": "AWS/SageMaker", "MetricName": "Invocations",
        "Statistic": "Sum", "Period": 60, "EvaluationPeriods": 1, "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanThreshold",
    }  # fmt: skip
    refused(lambda: client.set_alarm_state(AlarmName="nope", StateValue="OK", StateReason="x"),
            "ResourceNotFound", "nope")  # fmt: skip
    refused(lambda: client.delete_alarms(AlarmNames=["nope"]), "ResourceNotFound", "nope")
    refused(lambda: client.put_metric_alarm(**{**base, "ComparisonOperator": "Bigger"}),
            "ValidationError", "comparisonOperator")  # fmt: skip
    refused(
        lambda: client.put_metric_alarm(**{**base, "Period": 45}), "InvalidParameterValue", "Period"
    )
    refused(lambda: client.put_metric_alarm(**{**base, "DatapointsToAlarm": 2}),
            "InvalidParameterValue", "DatapointsToAlarm")  # fmt: skip
    refused(lambda: client.put_metric_alarm(**{**base, "ExtendedStatistic": "p99"}),
            "InvalidParameterCombination")  # fmt: skip
    nobody = "arn:aws:sns:us-east-1:000000000000:nobody"
    refused(lambda: client.put_metric_alarm(**{**base, "AlarmActions": [nobody]}),
            "InvalidParameterValue", "no such topic")  # fmt: skip
    no_policy = "arn:aws:autoscaling:us-east-1:000000000000:scalingPolicy:x"
    refused(lambda: client.put_metric_alarm(**{**base, "AlarmActions": [no_policy]}),
            "InvalidParameterValue", "no scaling policy")  # fmt: skip
    refused(
        lambda: client.set_alarm_state(AlarmName="nope", StateValue="OK", StateReason="x",
                                       StateReasonData="{not json"),
        "ResourceNotFound",
    )  # fmt: skip
    client.put_metric_alarm(**base)
    refused(
        lambda: client.set_alarm_state(AlarmName="a", StateValue="OK", StateReason="x",
                                       StateReasonData="{not json"),
        "InvalidFormat",
    )  # fmt: skip
    now = time.time()
    refused(
        lambda: client.get_metric_data(
            MetricDataQueries=[{"Id": "e", "Expression": "__import__('os')"}],
            StartTime=now - 60,
            EndTime=now,
        ),
        "InvalidParameterValue",
        "not supported",
    )
    refused(
        lambda: client.get_metric_statistics(
            Namespace="AWS/SageMaker",
            MetricName="Invocations",
            StartTime=now - 86400 * 2,
            EndTime=now,
            Period=60,
            Statistics=["Sum"],
        ),
        "InvalidParameterCombination",
        "1440",
    )
    statistics = {
        "Namespace": "AWS/SageMaker", "MetricName": "Invocations",
        "StartTime": now - 600, "EndTime": now, "Period": 60,
    }  # fmt: skip
    refused(
        lambda: client.get_metric_statistics(
            **statistics, Statistics=["Sum"], ExtendedStatistics=["p99"]
        ),
        "InvalidParameterCombination",
        "mutually exclusive",
    )
    for metric, missing in [({"MetricName": "m"}, "Namespace"), ({"Namespace": "n"}, "MetricName")]:
        query = {"Id": "a", "MetricStat": {"Metric": metric, "Period": 60, "Stat": "Sum"}}
        refused(
            lambda query=query: client.get_metric_data(  # type: ignore[misc]
                MetricDataQueries=[query], StartTime=now - 60, EndTime=now
            ),
            "MissingParameter",
            missing,
        )
        refused(
            lambda query=query: client.put_metric_alarm(  # type: ignore[misc]
                AlarmName="m", EvaluationPeriods=1, Threshold=1.0,
                ComparisonOperator="GreaterThanThreshold", Metrics=[query],
            ),
            "MissingParameter",
            missing,
        )  # fmt: skip
    refused(
        lambda: client.get_metric_data(
            MetricDataQueries=[{"Id": "A1", "Expression": "1"}], StartTime=now - 60, EndTime=now
        ),
        "InvalidParameterValue",
        "^[a-z][a-zA-Z0-9_]*$",
    )
    upper = {"Id": "M1", "MetricStat": {"Metric": {"Namespace": "n", "MetricName": "m"},
                                        "Period": 60, "Stat": "Sum"}}  # fmt: skip
    refused(
        lambda: client.put_metric_alarm(
            AlarmName="m1", EvaluationPeriods=1, Threshold=1.0,
            ComparisonOperator="GreaterThanThreshold", Metrics=[upper],
        ),
        "InvalidParameterValue",
        "^[a-z][a-zA-Z0-9_]*$",
    )  # fmt: skip
    refused(
        lambda: client.describe_alarms(AlarmNames=["a"], AlarmNamePrefix="a"),
        "InvalidParameterCombination",
    )
    scaling = gateway.client("application-autoscaling")
    refused(
        lambda: scaling.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId="endpoint/x/variant/v1",
            ScalableDimension="sagemaker:variant:DesiredInstanceCount",
            MinCapacity=-1, MaxCapacity=2,
        ),
        "ValidationException",
        "MinCapacity",
    )  # fmt: skip


def test_step_scaling_run_by_an_alarm_brings_an_async_endpoint_back_from_zero(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    gw = gateway_factory(extra_env=FAST, args=["--config", str(stack)])
    name = unique("cwstep")
    out = tmp_path / "out"
    # Each request takes 2 s and an instance takes one at a time: the backlog lasts.
    deploy_async(gw.sm, name, out, model_url=(MODELS / "sleepy").as_uri(), max_concurrent=1)
    scaling = gw.client("application-autoscaling")
    resource = f"endpoint/{name}/variant/v1"
    scaling.register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=resource,
        ScalableDimension="sagemaker:variant:DesiredInstanceCount", MinCapacity=0, MaxCapacity=3,
    )  # fmt: skip
    policy = scaling.put_scaling_policy(
        PolicyName="backlog", ServiceNamespace="sagemaker", ResourceId=resource,
        ScalableDimension="sagemaker:variant:DesiredInstanceCount", PolicyType="StepScaling",
        StepScalingPolicyConfiguration={
            "AdjustmentType": "ExactCapacity", "Cooldown": 0,
            "StepAdjustments": [
                {"MetricIntervalLowerBound": 0, "MetricIntervalUpperBound": 5,
                 "ScalingAdjustment": 1},
                {"MetricIntervalLowerBound": 5, "ScalingAdjustment": 2},
            ],
        },
    )["PolicyARN"]  # fmt: skip
    # Down to zero by hand (no target tracking policy here), then requests wait.
    gw.sm.update_endpoint_weights_and_capacities(
        EndpointName=name,
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 0}],
    )
    wait_until(
        lambda: (
            gw.sm.describe_endpoint(EndpointName=name)["ProductionVariants"][0][
                "CurrentInstanceCount"
            ]
            == 0
        ),
        "zero instances",
    )
    cw(gw).put_metric_alarm(
        AlarmName=f"{name}-backlog", Namespace="AWS/SageMaker", MetricName="ApproximateBacklogSize",
        Dimensions=[{"Name": "EndpointName", "Value": name}], Statistic="Maximum", Period=10,
        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold",
        AlarmActions=[policy],
    )  # fmt: skip
    described = scaling.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)
    assert described["ScalingPolicies"][0]["Alarms"][0]["AlarmName"] == f"{name}-backlog"
    answers = [
        gw.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, {"n": n, "sleep": 2})
        )
        for n in range(8)
    ]

    # Back from zero at once by itself (HasBacklogWithoutCapacity), then to 2 instances
    # by the alarm's policy: the backlog is 5 or more above the threshold.
    def stepped_to_two() -> bool:
        listed = scaling.describe_scaling_activities(
            ServiceNamespace="sagemaker", ResourceId=resource
        )
        return any(
            "triggered policy backlog" in a["Cause"] and a["Description"].endswith(" 2.")
            for a in listed["ScalingActivities"]
        )

    wait_until(stepped_to_two, "a step to two instances by the alarm's policy", timeout_s=60)
    for answer in answers:
        wait_file(answer["OutputLocation"], timeout_s=90)
    pages = scaling.describe_scaling_activities(ServiceNamespace="sagemaker", ResourceId=resource)
    causes = [a["Cause"] for a in pages["ScalingActivities"]]
    assert any(
        f"monitor alarm {name}-backlog in state ALARM triggered policy backlog" in c for c in causes
    ), causes
    history = cw(gw).describe_alarm_history(AlarmName=f"{name}-backlog", HistoryItemType="Action")
    assert any(policy in h["HistorySummary"] for h in history["AlarmHistoryItems"]), history


def test_datapoints_and_alarms_survive_a_restart(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    gw = gateway_factory(home=home, extra_env=FAST)
    name = unique("cwkeep")
    deploy(gw.sm, name, model_tarball("flaky"))
    for _ in range(5):
        assert invoke(gw, name, {})
    cw(gw).put_metric_alarm(
        AlarmName="kept", Namespace="AWS/SageMaker", MetricName="Invocations",
        Dimensions=dims(name),
        Statistic="Sum", Period=60, EvaluationPeriods=1, Threshold=1000,
        ComparisonOperator="GreaterThanThreshold",
    )  # fmt: skip
    gw.stop()  # what was counted since the last tick is written as the gateway stops
    gw = gateway_factory(home=home, extra_env=FAST)
    assert sums(cw(gw), name, "Invocations") == {"Invocations": 5.0}
    wait_in_service(gw.sm, name)
    healthy = f'shipyard_instances{{endpoint="{name}",state="healthy",variant="v1"}} 1.0'
    wait_until(lambda: healthy in gw.get("/metrics")[1].decode(), "its instance back")
    for _ in range(3):
        assert invoke(gw, name, {})
    wait_until(lambda: sums(cw(gw), name, "Invocations") == {"Invocations": 8.0}, "8 in all")
    assert [a["AlarmName"] for a in cw(gw).describe_alarms()["MetricAlarms"]] == ["kept"]


@pytest.mark.parametrize(
    "body",
    [
        bytes.fromhex("d81c81d81d00"),  # a list holding itself (CBOR shared values)
        bytes.fromhex("d81c81d81c81d81d01d81d01"),  # one list held twice
        b"\xff\x00garbage",
        bytes.fromhex("a1d90102f6f6"),  # a map keyed by a tagged value
    ],
)
def test_hostile_cbor_is_refused_and_the_gateway_keeps_answering(
    gateway: GatewayProcess, body: bytes
) -> None:
    request = urllib.request.Request(
        gateway.url + "/service/GraniteServiceVersion20100801/operation/ListMetrics",
        data=body,
        headers={"Content-Type": "application/cbor", "smithy-protocol": "rpc-v2-cbor"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert cbor2.loads(refused.value.read())["__type"] == "SerializationException"
    assert gateway.get("/healthz")[0] == 200


def test_multi_model_and_instance_metrics_are_published(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    from tests.e2e.test_multimodel import _deploy_mme, _invoke
    from tests.runtime.mme_models import write_model

    gw = gateway_factory(extra_env=FAST)
    prefix = tmp_path / "prefix"
    model = write_model(prefix, "a.tar.gz")
    _deploy_mme(gw, "cwmme", prefix)
    for _ in range(4):  # one miss (the load), then hits
        _invoke(gw, "cwmme", model.name)
    client = cw(gw)
    now = time.time()

    def stat(namespace: str, metric: str, statistic: str) -> float | None:
        points = client.get_metric_statistics(
            Namespace=namespace, MetricName=metric, Dimensions=dims("cwmme"),
            StartTime=now - 600, EndTime=time.time() + 60, Period=3600, Statistics=[statistic],
        )["Datapoints"]  # fmt: skip
        return float(points[0][statistic]) if points else None

    wait_until(lambda: stat("AWS/SageMaker", "ModelCacheHit", "SampleCount") == 4, "4 lookups")
    assert stat("AWS/SageMaker", "ModelCacheHit", "Sum") == 3  # hits, of 4
    assert (stat("AWS/SageMaker", "ModelLoadingTime", "SampleCount") or 0) >= 1
    assert stat("AWS/SageMaker", "LoadedModelCount", "Maximum") == 1
    wait_until(
        lambda: stat("/aws/sagemaker/Endpoints", "CPUUtilization", "SampleCount") is not None,
        "CPUUtilization of the instance",
    )
    memory = stat("/aws/sagemaker/Endpoints", "MemoryUtilization", "Maximum")
    assert memory is not None and 0 < memory < 100  # of ml.m5.large's 8 GiB
    cpu = stat("/aws/sagemaker/Endpoints", "CPUUtilization", "Maximum")
    assert cpu is not None and 0 <= cpu <= 100 * (os.cpu_count() or 1)


def test_the_query_protocol_of_older_sdks(
    gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore before CloudWatch's JSON protocol sent a form and read XML back.
    monkeypatch.setattr(botocore.model, "PRIORITY_ORDERED_SUPPORTED_PROTOCOLS", ("query",))
    client = cw(gateway)
    assert client.meta.service_model.resolved_protocol == "query"
    now = time.time()
    where = [{"Name": "Shop", "Value": "eu"}]
    client.put_metric_data(
        Namespace="Old/SDK",
        MetricData=[{"MetricName": "Orders", "Dimensions": where, "Values": [1.0, 2.0, 3.0],
                     "Timestamp": now}],
    )  # fmt: skip
    stats = client.get_metric_statistics(
        Namespace="Old/SDK", MetricName="Orders", Dimensions=where,
        StartTime=now - 120, EndTime=now + 120, Period=240, Statistics=["Sum", "Maximum"],
    )["Datapoints"]  # fmt: skip
    assert [(p["Sum"], p["Maximum"]) for p in stats] == [(6.0, 3.0)]
    data = client.get_metric_data(
        MetricDataQueries=[
            {"Id": "o", "MetricStat": {"Metric": {"Namespace": "Old/SDK", "MetricName": "Orders",
                                                  "Dimensions": where},
                                       "Period": 240, "Stat": "SampleCount"}},
            {"Id": "twice", "Expression": "o * 2"},
        ],
        StartTime=now - 120, EndTime=now + 120,
    )["MetricDataResults"]  # fmt: skip
    assert [(r["Id"], r["Values"]) for r in data] == [("o", [3.0]), ("twice", [6.0])]
    assert data[0]["Timestamps"][0].tzinfo is not None
    client.put_metric_alarm(
        AlarmName="old-sdk", Namespace="Old/SDK", MetricName="Orders", Dimensions=where,
        Statistic="Sum", Period=60, EvaluationPeriods=2, DatapointsToAlarm=1, Threshold=10,
        ComparisonOperator="GreaterThanThreshold", ActionsEnabled=False,
    )  # fmt: skip
    alarm = client.describe_alarms(AlarmNames=["old-sdk"])["MetricAlarms"][0]
    assert alarm["Dimensions"] == where and alarm["Threshold"] == 10.0
    assert alarm["ActionsEnabled"] is False and alarm["StateValue"] == "INSUFFICIENT_DATA"
    assert alarm["AlarmConfigurationUpdatedTimestamp"].tzinfo is not None
    refused(lambda: client.delete_alarms(AlarmNames=["nope"]), "ResourceNotFound", "nope")
    refused(lambda: client.set_alarm_state(AlarmName="old-sdk", StateValue="ALARM",
                                           StateReason="x", StateReasonData="{no"),
            "InvalidFormat")  # fmt: skip
    client.delete_alarms(AlarmNames=["old-sdk"])
    # Not a query body, and no X-Amz-Target: AWS JSON's refusal, as before.
    status, body = _post(gateway, b'{"a": 1}')
    assert status == 400 and json.loads(body)["__type"] == "UnknownOperationException"


def _post(gw: GatewayProcess, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        gw.url + "/", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
