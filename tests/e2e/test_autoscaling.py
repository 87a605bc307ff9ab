"""Application Auto Scaling, driven by boto3's ``application-autoscaling``
client: the API and its refusals, target tracking under a real bounded load, asynchronous
endpoints at zero instances, and restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
import yaml

from tests.conftest import GatewayProcess, deploy, unique, wait_until
from tests.e2e.test_async import deploy_async, put_input, wait_file

DIMENSION = "sagemaker:variant:DesiredInstanceCount"
FAST = {
    "SHIPYARD_AUTOSCALING_PERIOD_S": "0.3",
    "SHIPYARD_AUTOSCALING_WINDOW_S": "3",
}


def scaling(gw: GatewayProcess) -> Any:
    return gw.client("application-autoscaling")


def rid(endpoint: str, variant: str = "v1") -> str:
    return f"endpoint/{endpoint}/variant/{variant}"


def register(gw: GatewayProcess, endpoint: str, **bounds: Any) -> Any:
    return scaling(gw).register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=rid(endpoint), ScalableDimension=DIMENSION,
        **bounds,
    )  # fmt: skip


def put_policy(gw: GatewayProcess, endpoint: str, config: dict[str, Any], name: str = "p") -> Any:
    return scaling(gw).put_scaling_policy(
        PolicyName=name,
        ServiceNamespace="sagemaker",
        ResourceId=rid(endpoint),
        ScalableDimension=DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration=config,
    )


def refused(call: Callable[[], object], code: str, words: str = "") -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    error = caught.value.response["Error"]
    assert error["Code"] == code, error
    assert words in error["Message"], error
    return str(error["Message"])


def counts(gw: GatewayProcess, endpoint: str) -> tuple[int, int]:
    """(CurrentInstanceCount, DesiredInstanceCount) of the endpoint's variant v1."""
    variant = gw.sm.describe_endpoint(EndpointName=endpoint)["ProductionVariants"][0]
    return variant.get("CurrentInstanceCount", -1), variant["DesiredInstanceCount"]


def activities(gw: GatewayProcess, endpoint: str) -> list[dict[str, Any]]:
    pages = scaling(gw).get_paginator("describe_scaling_activities").paginate(
        ServiceNamespace="sagemaker", ResourceId=rid(endpoint), PaginationConfig={"PageSize": 2}
    )  # fmt: skip
    return [a for page in pages for a in page["ScalingActivities"]]


def test_the_api_answers_as_application_auto_scaling_does(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name, other = unique("as"), unique("as")
    deploy(gw.sm, name, model_tarball("echo"))
    deploy(gw.sm, other, model_tarball("echo"))
    aas = scaling(gw)

    refused(lambda: register(gw, "nope", MinCapacity=1, MaxCapacity=2), "ValidationException",
            "does not exist")  # fmt: skip
    refused(lambda: register(gw, name, MinCapacity=3, MaxCapacity=2), "ValidationException",
            "cannot be greater than maximum")  # fmt: skip
    refused(lambda: register(gw, name, MinCapacity=0, MaxCapacity=2), "ValidationException",
            "only allowed for asynchronous")  # fmt: skip
    refused(lambda: register(gw, name, MaxCapacity=2), "ValidationException", "required")
    refused(lambda: register(gw, name, MinCapacity=1, MaxCapacity=1000), "ValidationException",
            "limit")  # fmt: skip
    refused(
        lambda: aas.register_scalable_target(
            ServiceNamespace="ecs", ResourceId="service/c/s",
            ScalableDimension="ecs:service:DesiredCount", MinCapacity=1, MaxCapacity=2,
        ),
        "ValidationException", "Unsupported service namespace",
    )  # fmt: skip
    refused(
        lambda: aas.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId=f"endpoint/{name}",
            ScalableDimension=DIMENSION, MinCapacity=1, MaxCapacity=2,
        ),
        "ValidationException", "Unsupported resource ID",
    )  # fmt: skip
    refused(lambda: put_policy(gw, name, {"TargetValue": 5.0, "PredefinedMetricSpecification": {
        "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}}),
        "ObjectNotFoundException", "No scalable target registered")  # fmt: skip

    arn = register(gw, name, MinCapacity=1, MaxCapacity=3)["ScalableTargetARN"]
    assert arn.startswith("arn:aws:application-autoscaling:us-east-1:")
    register(gw, other, MinCapacity=1, MaxCapacity=2)
    # A second register changes what it names and keeps the rest.
    assert register(gw, name, MaxCapacity=4)["ScalableTargetARN"] == arn
    pages = aas.get_paginator("describe_scalable_targets").paginate(
        ServiceNamespace="sagemaker", PaginationConfig={"PageSize": 1}
    )
    listed = [t for page in pages for t in page["ScalableTargets"]]
    assert {t["ResourceId"] for t in listed} >= {rid(name), rid(other)}
    mine = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid(name)])
    (target,) = mine["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 4)
    assert target["ScalableDimension"] == DIMENSION and target["ScalableTargetARN"] == arn
    assert target["SuspendedState"]["DynamicScalingInSuspended"] is False

    predefined = {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}
    bad_configs = [
        ({"TargetValue": 5.0, "PredefinedMetricSpecification": {
            "PredefinedMetricType": "SageMakerVariantProvisionedConcurrencyUtilization"}},
         "not supported"),
        ({"TargetValue": 5.0, "CustomizedMetricSpecification": {
            "MetricName": "CPUUtilization", "Namespace": "AWS/SageMaker", "Statistic": "Average"}},
         "not a metric shipyard publishes"),
        ({"TargetValue": 5.0, "CustomizedMetricSpecification": {
            "MetricName": "Invocations", "Namespace": "AWS/EC2", "Statistic": "Sum"}},
         "AWS/SageMaker"),
        ({"TargetValue": 5.0, "CustomizedMetricSpecification": {
            "MetricName": "ApproximateBacklogSizePerInstance", "Namespace": "AWS/SageMaker",
            "Statistic": "Average"}},
         "asynchronous"),
        ({"TargetValue": 0.0, "PredefinedMetricSpecification": predefined}, "greater than 0"),
        ({"TargetValue": 5.0, "PredefinedMetricSpecification": predefined,
          "ScaleOutCooldown": -1}, "between 0 and"),
        ({"TargetValue": 5.0, "PredefinedMetricSpecification": predefined,
          "ScaleInCooldown": 100_000}, "between 0 and"),
        ({"TargetValue": 5.0}, "exactly one"),
    ]  # fmt: skip
    for config, words in bad_configs:
        refused(lambda c=config: put_policy(gw, name, c), "ValidationException", words)
    refused(
        lambda: aas.put_scaling_policy(
            PolicyName="s", ServiceNamespace="sagemaker", ResourceId=rid(name),
            ScalableDimension=DIMENSION, PolicyType="StepScaling",
        ),
        "ValidationException", "StepScalingPolicyConfiguration is required",
    )  # fmt: skip
    step_configs = [
        ({"AdjustmentType": "ChangeInCapacity", "StepAdjustments": []}, "at least one"),
        (
            {
                "AdjustmentType": "ChangeInCapacity",
                "StepAdjustments": [
                    {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1},
                    {"MetricIntervalLowerBound": 5, "ScalingAdjustment": 2},
                ],
            },
            "overlap",
        ),
        (
            {
                "AdjustmentType": "ExactCapacity",
                "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": -1}],
            },
            "0 or more",
        ),
        (
            {
                "AdjustmentType": "ChangeInCapacity",
                "MinAdjustmentMagnitude": 2,
                "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
            },
            "MinAdjustmentMagnitude",
        ),
    ]
    for config, words in step_configs:
        refused(
            lambda c=config: aas.put_scaling_policy(
                PolicyName="s",
                ServiceNamespace="sagemaker",
                ResourceId=rid(name),
                ScalableDimension=DIMENSION,
                PolicyType="StepScaling",
                StepScalingPolicyConfiguration=c,
            ),
            "ValidationException",
            words,
        )

    good = {"TargetValue": 1000.0, "PredefinedMetricSpecification": predefined,
            "ScaleInCooldown": 60, "ScaleOutCooldown": 30}  # fmt: skip
    policy_arn = put_policy(gw, name, good)["PolicyARN"]
    assert policy_arn.startswith("arn:aws:autoscaling:") and policy_arn.endswith("policyName/p")
    assert put_policy(gw, name, {**good, "TargetValue": 2000.0})["PolicyARN"] == policy_arn
    put_policy(gw, name, good, name="second")
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid(name))
    by_name = {p["PolicyName"]: p for p in policies["ScalingPolicies"]}
    assert set(by_name) == {"p", "second"}
    tracking = by_name["p"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 2000.0 and tracking["ScaleInCooldown"] == 60
    named = aas.describe_scaling_policies(ServiceNamespace="sagemaker", PolicyNames=["second"])
    assert [p["PolicyName"] for p in named["ScalingPolicies"]] == ["second"]

    remove = {"ServiceNamespace": "sagemaker", "ResourceId": rid(name),
              "ScalableDimension": DIMENSION}  # fmt: skip
    aas.delete_scaling_policy(PolicyName="second", **remove)
    refused(lambda: aas.delete_scaling_policy(PolicyName="second", **remove),
            "ObjectNotFoundException", "No scaling policy found")  # fmt: skip
    aas.deregister_scalable_target(**remove)
    refused(lambda: aas.deregister_scalable_target(**remove), "ObjectNotFoundException")
    # Deregistering took the target's policies with it.
    left = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid(name))
    assert left["ScalingPolicies"] == []
    refused(
        lambda: aas.describe_scalable_targets(ServiceNamespace="sagemaker", NextToken="junk"),
        "ValidationException",
    )


def test_a_minimum_above_the_count_scales_out_at_once(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name = unique("asmin")
    deploy(gw.sm, name, model_tarball("echo"))
    register(gw, name, MinCapacity=2, MaxCapacity=3)
    wait_until(lambda: counts(gw, name) == (2, 2), "two instances")
    wait_until(lambda: activities(gw, name)[0]["StatusCode"] == "Successful", "the step's end")
    (step,) = activities(gw, name)
    assert step["Description"] == "Setting desired instance count to 2."
    assert "below the minimum capacity 2" in step["Cause"]
    assert step["EndTime"] >= step["StartTime"]
    assert gw.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"


class Load:
    """``threads`` clients calling the endpoint in a loop until stopped; every answer
    counted, every failure kept."""

    def __init__(self, gw: GatewayProcess, endpoint: str, threads: int, sleep_s: float) -> None:
        self.rt = gw.client("sagemaker-runtime", max_attempts=1)
        self.endpoint = endpoint
        self.body = json.dumps({"sleep": sleep_s})
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        self._lock = threading.Lock()

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self.rt.invoke_endpoint(
                    EndpointName=self.endpoint, Body=self.body, ContentType="application/json"
                )
                answer["Body"].read()
                with self._lock:
                    self.ok += 1
            except Exception as exc:  # every failure is what the test reports
                with self._lock:
                    self.failures.append(repr(exc))


def test_target_tracking_scales_out_under_load_and_back_in_without_failing_a_request(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
    webhook: Any,
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        yaml.safe_dump({"topics": {"ops": [webhook.url]}, "autoscaling": {"notify": ["ops"]}})
    )
    gw = gateway_factory(extra_env=FAST, args=["--config", str(stack)])
    name = unique("asload")
    deploy(gw.sm, name, model_tarball("sleepy"))
    register(gw, name, MinCapacity=1, MaxCapacity=3)
    # One instance answers about 20 requests a second (50 ms each): 1,200 a minute.
    put_policy(gw, name, {
        "TargetValue": 600.0,
        "PredefinedMetricSpecification": {
            "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleOutCooldown": 1, "ScaleInCooldown": 2,
    })  # fmt: skip
    with Load(gw, name, threads=4, sleep_s=0.05) as load:
        wait_until(lambda: counts(gw, name) == (3, 3), "three instances under load", 60)
        served = load.ok
        wait_until(lambda: load.ok > served + 20, "requests served by the bigger fleet")
    assert load.failures == []
    wait_until(lambda: counts(gw, name) == (1, 1), "back to one instance once idle", 60)
    wait_until(
        lambda: all(a["StatusCode"] != "InProgress" for a in activities(gw, name)),
        "every step ended",
    )
    steps = activities(gw, name)
    assert all(a["StatusCode"] == "Successful" for a in steps), steps
    targets = [int(a["Description"].rsplit(" ", 1)[1].rstrip(".")) for a in reversed(steps)]
    assert max(targets) == 3 and targets[-1] == 1, targets
    assert any("SageMakerVariantInvocationsPerInstance" in a["Cause"] for a in steps)

    def announced() -> list[str]:
        return [r.body.get("title", "") for r in webhook.requests if r.status == 200]

    wait_until(lambda: len(announced()) >= len(steps), "every step announced")
    assert all(name in title and "Successful" in title for title in announced())


def test_an_async_endpoint_scales_to_zero_and_back_and_stays_at_zero_across_a_restart(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    home = tmp_path / "home"
    gw = gateway_factory(home=home, extra_env=FAST, args=["--config", str(stack)])
    name = unique("aszero")
    out = tmp_path / "out"
    deploy_async(gw.sm, name, out)
    register(gw, name, MinCapacity=0, MaxCapacity=2)
    put_policy(gw, name, {
        "TargetValue": 5.0,
        "CustomizedMetricSpecification": {
            "MetricName": "ApproximateBacklogSizePerInstance", "Namespace": "AWS/SageMaker",
            "Dimensions": [{"Name": "EndpointName", "Value": name}], "Statistic": "Average"},
        "ScaleInCooldown": 0,
    })  # fmt: skip
    wait_until(lambda: counts(gw, name) == (0, 0), "zero instances with an empty queue")

    def wake_and_answer(gw: GatewayProcess, body: dict[str, Any]) -> None:
        started = time.monotonic()
        answer = gw.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, body)
        )
        assert json.loads(wait_file(answer["OutputLocation"], timeout_s=60)) == body
        assert time.monotonic() - started < 60

    wake_and_answer(gw, {"first": 1})
    causes = [a["Cause"] for a in activities(gw, name)]
    assert any("HasBacklogWithoutCapacity" in cause for cause in causes), causes
    wait_until(lambda: counts(gw, name) == (0, 0), "zero again once the queue is empty")

    gw.stop()
    gw = gateway_factory(home=home, extra_env=FAST, args=["--config", str(stack)])
    policies = scaling(gw).describe_scaling_policies(ServiceNamespace="sagemaker")
    assert [p["PolicyName"] for p in policies["ScalingPolicies"]] == ["p"]
    wait_until(
        lambda: gw.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService",
        "the endpoint back in service",
    )
    assert counts(gw, name) == (0, 0)
    wake_and_answer(gw, {"second": 2})


def test_the_aws_cli_registers_and_describes_a_target(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name = unique("ascli")
    deploy(gw.sm, name, model_tarball("echo"))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    aws = [sys.executable, "-m", "awscli", "--endpoint-url", gw.url, "application-autoscaling"]
    common = ["--service-namespace", "sagemaker", "--scalable-dimension", DIMENSION]
    done = subprocess.run(
        [*aws, "register-scalable-target", *common, "--resource-id", rid(name),
         "--min-capacity", "1", "--max-capacity", "2"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ScalableTargetARN"].startswith("arn:aws:application-")
    listed = subprocess.run(
        [*aws, "describe-scalable-targets", "--service-namespace", "sagemaker"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    (target,) = json.loads(listed.stdout)["ScalableTargets"]
    assert (target["ResourceId"], target["MaxCapacity"]) == (rid(name), 2)
    missing = subprocess.run(
        [*aws, "deregister-scalable-target", *common, "--resource-id", rid("nope")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert missing.returncode != 0 and "ObjectNotFoundException" in missing.stderr
