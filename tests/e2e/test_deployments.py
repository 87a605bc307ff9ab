"""Safe deployments: UpdateEndpoint with a DeploymentConfig, driven by boto3
against a real gateway under steady traffic. A canary of a good model completes step by
step; a canary and a linear deployment of a model that fails 30 % of its requests roll
back by themselves on a real CloudWatch alarm, with no failure for clients of the old
model; a rolling update replaces instances in batches; a restart mid-bake resumes; and
the refusals."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
import yaml

from tests.conftest import GatewayProcess, unique, wait_in_service, wait_until

FAST = {"SHIPYARD_METRICS_TICK_S": "2"}


def make_config(gw: GatewayProcess, name: str, url: str, label: str, *, count: int = 2,
                fail: int = 0, environment: dict[str, str] | None = None) -> None:  # fmt: skip
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": url,
            "Environment": {
                "MODEL_LABEL": label,
                "FAIL_PERCENT": str(fail),
                **(environment or {}),
            },  # fmt: skip
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[{"VariantName": "v1", "ModelName": name,
                             "InstanceType": "ml.m5.large", "InitialInstanceCount": count}],
    )  # fmt: skip


@dataclass
class Traffic:
    """What a steady client saw: the model that answered each request, or the error."""

    answers: list[tuple[float, str]] = field(default_factory=list)

    def models(self) -> Counter[str]:
        return Counter(a for _, a in self.answers)

    def errors(self) -> list[str]:
        return [a for _, a in self.answers if a.startswith("error")]


@contextmanager
def steady(gw: GatewayProcess, name: str, clients: int = 2) -> Iterator[Traffic]:
    traffic = Traffic()
    done = threading.Event()

    def run() -> None:
        rt = gw.client("sagemaker-runtime", max_attempts=1)
        while not done.is_set():
            try:
                body = rt.invoke_endpoint(
                    EndpointName=name, Body=b"{}", ContentType="application/json"
                )
                traffic.answers.append((time.time(), json.loads(body["Body"].read())["model"]))
            except botocore.exceptions.ClientError as exc:
                error = exc.response["Error"]
                traffic.answers.append((time.time(), f"error {error['Code']}: {error['Message']}"))
            done.wait(0.02)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield traffic
    finally:
        done.set()
        for thread in threads:
            thread.join()


def alarm_on_errors(gw: GatewayProcess, name: str) -> str:
    return alarm_on_errors_for(gw, name, period=10)


def alarm_on_errors_for(gw: GatewayProcess, name: str, *, period: int) -> str:
    """An alarm on the endpoint's Invocation5XXErrors: 2 or more in one period."""
    alarm = f"{name}-errors"
    gw.client("cloudwatch").put_metric_alarm(
        AlarmName=alarm, Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Dimensions=[{"Name": "EndpointName", "Value": name},
                    {"Name": "VariantName", "Value": "v1"}],
        Statistic="Sum", Period=period, EvaluationPeriods=1, Threshold=2,
        ComparisonOperator="GreaterThanOrEqualToThreshold", TreatMissingData="notBreaching",
    )  # fmt: skip
    return alarm


def stages(gw: GatewayProcess, name: str, until: Callable[[dict[str, Any]], bool],
           timeout_s: float = 90) -> list[tuple[str, str, float]]:  # fmt: skip
    """(EndpointStatus, the pending variant's status, its CurrentWeight) as they change,
    polled until ``until(describe)``."""
    seen: list[tuple[str, str, float]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        d = gw.sm.describe_endpoint(EndpointName=name)
        pending = (d.get("PendingDeploymentSummary") or {}).get("ProductionVariants") or [{}]
        state = (
            d["EndpointStatus"],
            (pending[0].get("VariantStatus") or [{}])[0].get("Status", ""),
            round(float(pending[0].get("CurrentWeight", 0.0)), 3),
        )
        if not seen or seen[-1] != state:
            seen.append(state)
        if until(d):
            return seen
        assert time.monotonic() < deadline, f"{name} never got there: {seen}"
        time.sleep(0.2)


def in_service(d: dict[str, Any]) -> bool:
    return bool(d["EndpointStatus"] == "InService")


def canary(wait_s: int, alarms: list[str] | None = None, **routing: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "BlueGreenUpdatePolicy": {
            "TrafficRoutingConfiguration": {
                "Type": "CANARY",
                "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1},
                "WaitIntervalInSeconds": wait_s,
                **routing,
            },
            "TerminationWaitInSeconds": 1,
        }
    }
    if alarms:
        config["AutoRollbackConfiguration"] = {"Alarms": [{"AlarmName": a} for a in alarms]}
    return config


def notified(tmp_path: Path, webhook: Any) -> list[str]:
    """``--config`` of a stack whose ``deployments.notify`` is the webhook."""
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        yaml.safe_dump({"topics": {"ops": [webhook.url]}, "deployments": {"notify": ["ops"]}})
    )
    return ["--config", str(stack)]


def test_a_canary_of_a_good_model_completes_step_by_step(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
    webhook: Any,
) -> None:
    gw = gateway_factory(extra_env=FAST, args=notified(tmp_path, webhook))
    name, url = unique("canary"), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old")
    make_config(gw, f"{name}-b", url, "new")
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    alarm = alarm_on_errors(gw, name)
    deployment = canary(4, [alarm])
    with steady(gw, name) as traffic:
        gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                              DeploymentConfig=deployment)  # fmt: skip
        seen = stages(gw, name, in_service)
        time.sleep(1)
    assert ("Updating", "Baking", 0.5) in seen, seen  # the canary: 1 of 2 instances
    assert ("Updating", "Baking", 1.0) in seen, seen  # then all of the traffic
    assert seen.index(("Updating", "Baking", 0.5)) < seen.index(("Updating", "Baking", 1.0))
    assert traffic.errors() == []
    models = traffic.models()
    assert models["old"] > 0 and models["new"] > 0, models
    assert traffic.answers[-1][1] == "new"
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-b"
    assert "FailureReason" not in d and "PendingDeploymentSummary" not in d
    assert d["LastDeploymentConfig"] == deployment
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    note = json.dumps(webhook.wait_for(1, timeout_s=30)[0].body)
    assert "Completed" in note and f"{name}-b" in note, note


@pytest.mark.parametrize("kind", ["CANARY", "LINEAR"])
def test_a_failing_model_rolls_back_by_itself_without_failing_the_old_models_clients(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    kind: str,
    tmp_path: Path,
    webhook: Any,
) -> None:
    gw = gateway_factory(extra_env=FAST, args=notified(tmp_path, webhook))
    name, url = unique(kind.lower()), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old")
    make_config(gw, f"{name}-b", url, "bad", fail=30)
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    alarm = alarm_on_errors(gw, name)
    size = {"Type": "INSTANCE_COUNT", "Value": 1}
    deployment = canary(120, [alarm]) if kind == "CANARY" else {
        "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
            "Type": "LINEAR", "LinearStepSize": size, "WaitIntervalInSeconds": 120}},
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": alarm}]},
    }  # fmt: skip
    with steady(gw, name) as traffic:
        wait_until(lambda: len(traffic.answers) > 20, "traffic before the update")
        gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                              DeploymentConfig=deployment)  # fmt: skip
        seen = stages(gw, name, in_service)
        time.sleep(1)
    assert ("Updating", "Baking", 0.5) in seen, seen
    assert ("Updating", "Baking", 1.0) not in seen, seen  # never went past the first step
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-a"
    assert alarm in d["FailureReason"] and "rolled back" in d["FailureReason"], d
    assert "PendingDeploymentSummary" not in d
    # Every failure is the new model's own (its canary share); the old never failed.
    errors = traffic.errors()
    assert errors and all("bad failed request" in e for e in errors), errors[:5]
    models = traffic.models()
    assert models["old"] > 0 and traffic.answers[-1][1] == "old", models
    # Traffic is fully back within two alarm periods (2 x 10 s) of the first failure.
    first_failure = next(t for t, a in traffic.answers if a.startswith("error"))
    last_bad = max(t for t, a in traffic.answers if a == "bad" or a.startswith("error"))
    assert last_bad - first_failure < 20, (first_failure, last_bad)
    note = json.dumps(webhook.wait_for(1, timeout_s=30)[0].body)
    assert "RolledBack" in note and alarm in note, note


def test_a_rolling_update_replaces_instances_in_batches(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name, url = unique("rolling"), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old", count=3)
    make_config(gw, f"{name}-b", url, "new", count=3)
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    batch = {"Type": "INSTANCE_COUNT", "Value": 1}
    # Each step bakes 5 s: DescribeEndpoint, polled every 0.2 s, sees every step even on a
    # machine so loaded that a poll takes seconds (at 2 s a step went unseen).
    deployment = {"RollingUpdatePolicy": {"MaximumBatchSize": batch, "WaitIntervalInSeconds": 5}}
    with steady(gw, name) as traffic:
        gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                              DeploymentConfig=deployment)  # fmt: skip
        seen = stages(gw, name, in_service)
        time.sleep(1)
    shares = [s[2] for s in seen if s[1] == "Baking"]
    assert shares == [0.333, 0.667, 1.0], seen  # one instance of three at a time
    assert traffic.errors() == []
    assert traffic.answers[-1][1] == "new"
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-b"
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 3


def test_a_restart_mid_bake_resumes_the_deployment(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Any,
) -> None:
    home = tmp_path / "home"
    gw = gateway_factory(home=home, extra_env=FAST)
    name, url = unique("resume"), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old")
    make_config(gw, f"{name}-b", url, "new")
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                          DeploymentConfig=canary(6))  # fmt: skip
    stages(gw, name, lambda d: "Baking" in json.dumps(d, default=str))
    gw.stop()
    gw = gateway_factory(home=home, extra_env=FAST)
    seen = stages(gw, name, in_service)
    assert ("Updating", "Baking", 0.5) in seen, seen  # from its first step again
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-b" and "FailureReason" not in d
    answer = gw.rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    assert json.loads(answer["Body"].read())["model"] == "new"


def test_deployment_configs_that_cannot_be_carried_out_are_refused(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    name, url = unique("refuse"), model_tarball("flaky")
    make_config(gateway, f"{name}-a", url, "old")
    make_config(gateway, f"{name}-b", url, "new")
    gateway.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gateway.sm, name)

    def refused(deployment: dict[str, Any], words: str) -> None:
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            gateway.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                                       DeploymentConfig=deployment)  # fmt: skip
        error = caught.value.response["Error"]
        assert error["Code"] == "ValidationException", error
        assert words in error["Message"], error

    big = canary(1)
    big["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["CanarySize"]["Value"] = 3
    refused(big, "CanarySize of 3 instances is larger than the fleet")
    refused(canary(1, ["no-such-alarm"]), "no-such-alarm")
    refused({"AutoRollbackConfiguration": {"Alarms": [{}]}}, "names no AlarmName")  # was a 500
    refused(
        {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {"Type": "LINEAR", "WaitIntervalInSeconds": 0}
            }
        },
        "LinearStepSize is required",
    )
    refused(
        {**canary(1), "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT",
                                              "Value": 1}, "WaitIntervalInSeconds": 0}},
        "not both",
    )  # fmt: skip
    assert gateway.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"

    # RetainDeploymentConfig reuses the last one given, and it keeps showing.
    gateway.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                               DeploymentConfig=canary(0))  # fmt: skip
    wait_in_service(gateway.sm, name)
    gateway.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a",
                               RetainDeploymentConfig=True)  # fmt: skip
    wait_in_service(gateway.sm, name)
    d = gateway.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-a"
    assert d["LastDeploymentConfig"] == canary(0)


def test_a_rollback_that_cannot_start_the_old_instances_again_is_update_rollback_failed(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name, url = unique("stuck"), model_tarball("flaky")
    marker = tmp_path / "refuse-loads"
    make_config(gw, f"{name}-a", url, "old", environment={"FAIL_LOAD_IF": str(marker)})
    make_config(gw, f"{name}-b", url, "new")
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    # No traffic here: with "ignore" the evaluator keeps the state SetAlarmState sets.
    alarm = f"{name}-drill"
    gw.client("cloudwatch").put_metric_alarm(
        AlarmName=alarm, Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Dimensions=[{"Name": "EndpointName", "Value": name}], Statistic="Sum", Period=10,
        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="ignore",
    )  # fmt: skip
    batch = {"Type": "INSTANCE_COUNT", "Value": 1}
    gw.sm.update_endpoint(
        EndpointName=name, EndpointConfigName=f"{name}-b",
        DeploymentConfig={
            "RollingUpdatePolicy": {"MaximumBatchSize": batch, "WaitIntervalInSeconds": 300},
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": alarm}]}},
    )  # fmt: skip
    stages(gw, name, lambda d: "Baking" in json.dumps(d, default=str))
    marker.write_text("the old model can no longer start")
    gw.client("cloudwatch").set_alarm_state(AlarmName=alarm, StateValue="ALARM", StateReason="x")
    seen = stages(gw, name, lambda d: d["EndpointStatus"] == "UpdateRollbackFailed")
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert "did not complete" in d["FailureReason"] and alarm in d["FailureReason"], d
    assert d["EndpointConfigName"] == f"{name}-a" and "PendingDeploymentSummary" not in d
    # What it could keep serves: the old instance that was never stopped.
    answer = gw.rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    assert json.loads(answer["Body"].read())["model"] == "old"
    # An update from there is allowed, as on AWS.
    marker.unlink()
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b")
    wait_in_service(gw.sm, name)
    assert seen[0][0] == "Updating"


def test_a_rollback_cut_short_by_a_restart_is_finished_on_the_old_config(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The gateway stopped while an endpoint was RollingBack: started again, it serves
    the old config and records the rollback (the endpoint was left RollingBack for good,
    with no instances, refusing updates)."""
    from shipyard.records import EndpointStatus
    from shipyard.storage.metadata import MetadataStore

    home = tmp_path / "home"
    gw = gateway_factory(home=home, extra_env=FAST)
    name, url = unique("cut"), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old")
    make_config(gw, f"{name}-b", url, "new")
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                          DeploymentConfig=canary(300))  # fmt: skip
    stages(gw, name, lambda d: "Baking" in json.dumps(d, default=str))
    gw.stop()
    # Where a stop during the rollback leaves the store (Deployer._rolling_back).
    store = MetadataStore(f"sqlite:///{home / 'shipyard.db'}")
    ep = store.get_endpoint(name)
    store.change_endpoint(
        name,
        status=EndpointStatus.ROLLING_BACK,
        deployment={**(ep.deployment or {}), "stage": "RollingBack", "since": time.time()},
    )
    store.engine.dispose()
    gw = gateway_factory(home=home, extra_env=FAST)
    stages(gw, name, in_service)
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-a" and "PendingDeploymentSummary" not in d, d
    assert "rolled back" in d["FailureReason"], d
    answer = gw.rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    assert json.loads(answer["Body"].read())["model"] == "old"
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b")  # allowed again
    wait_in_service(gw.sm, name)


def test_a_failed_endpoint_updated_with_a_deployment_config_deploys_the_new_config(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    """No old fleet serves to be kept safe: the new config is deployed at once (the old,
    broken config was started again and the endpoint left Failed on it)."""
    gw = gateway
    name = unique("mend")
    make_config(gw, f"{name}-a", model_tarball("load_fails"), "old", count=1)
    make_config(gw, f"{name}-b", model_tarball("flaky"), "new", count=1)
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_until(
        lambda: gw.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "Failed",
        "the first config failed",
    )
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-b",
                          DeploymentConfig=canary(0))  # fmt: skip
    wait_in_service(gw.sm, name)
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-b" and "PendingDeploymentSummary" not in d, d
    answer = gw.rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    assert json.loads(answer["Body"].read())["model"] == "new"


def test_alarms_without_a_policy_roll_back_an_all_at_once_deployment(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    """botocore: with no update policy, blue/green all at once, its alarms watched."""
    gw = gateway
    name, url = unique("alarmed"), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old", count=1)
    make_config(gw, f"{name}-b", url, "new", count=1)
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    alarm = f"{name}-drill"
    gw.client("cloudwatch").put_metric_alarm(
        AlarmName=alarm, Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Dimensions=[{"Name": "EndpointName", "Value": name}], Statistic="Sum", Period=10,
        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="ignore",
    )  # fmt: skip
    gw.client("cloudwatch").set_alarm_state(AlarmName=alarm, StateValue="ALARM", StateReason="x")
    gw.sm.update_endpoint(
        EndpointName=name,
        EndpointConfigName=f"{name}-b",
        DeploymentConfig={"AutoRollbackConfiguration": {"Alarms": [{"AlarmName": alarm}]}},
    )
    stages(gw, name, lambda d: in_service(d) and "FailureReason" in d)
    d = gw.sm.describe_endpoint(EndpointName=name)
    assert d["EndpointConfigName"] == f"{name}-a" and alarm in d["FailureReason"], d
