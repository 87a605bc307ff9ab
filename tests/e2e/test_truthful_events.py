"""Events and counts that tell the truth, on a real gateway with no notification topic:
an endpoint's status changes and a deployment's steps and rollback are in the events log
(the console's ``/console/api/events``); an endpoint of inference components shows its
healthy instances and copies alike in DescribeEndpoint, the console and the CLI; and a
request the gateway refuses itself is not the model's invocation."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, unique, wait_in_service, wait_until
from tests.e2e.test_deployments import canary, make_config, stages
from tests.e2e.test_inference_components import (
    component_endpoint,
    create_component,
    wait_component,
)

ROLE = "arn:aws:iam::123456789012:role/x"


def event_rows(gw: GatewayProcess) -> list[str]:
    """The events log's rows as text, newest first (tags dropped, entities read)."""
    status, body = gw.get("/console/api/events")
    assert status == 200, body
    rows = re.findall(r"<tr\b.*?</tr>", body.decode(), re.DOTALL)
    return [html.unescape(re.sub(r"<[^>]+>", " ", row)) for row in rows]


def rows_about(gw: GatewayProcess, name: str) -> list[str]:
    return [row for row in event_rows(gw) if f"Endpoint {name}" in row]


def test_an_endpoints_status_changes_are_events_with_no_topic(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    name = unique("told")
    deploy(gateway.sm, name, model_tarball("echo"))
    wait_until(
        lambda: any(f"Endpoint {name} is InService" in r for r in rows_about(gateway, name)),
        "the InService event",
    )
    rows = rows_about(gateway, name)
    assert [r for r in rows if "is InService" in r] and [r for r in rows if "is Creating" in r]
    newest_first = [r for r in rows if " is " in r]
    assert "InService" in newest_first[0] and "Creating" in newest_first[-1], newest_first
    assert all("SageMaker Endpoint State Change" in r for r in newest_first)


def test_a_canary_rolled_back_by_its_alarm_leaves_its_steps_in_the_events_log(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    gw, name, url = gateway, unique("bumpy"), model_tarball("flaky")
    make_config(gw, f"{name}-a", url, "old", count=2)
    make_config(gw, f"{name}-b", url, "new", count=2)
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
    wait_in_service(gw.sm, name)
    guard = f"{name}-guard"
    cw = gw.client("cloudwatch")
    cw.put_metric_alarm(
        AlarmName=guard, Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Dimensions=[{"Name": "EndpointName", "Value": name}], Statistic="Sum", Period=10,
        EvaluationPeriods=1, Threshold=1000, ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="ignore",
    )  # fmt: skip
    gw.sm.update_endpoint(
        EndpointName=name, EndpointConfigName=f"{name}-b", DeploymentConfig=canary(60, [guard])
    )
    # The canary bakes (its step is an event): then the guard fires.
    wait_until(
        lambda: any(f"{name}: deployment Baking" in r for r in event_rows(gw)), "the Baking step"
    )
    cw.set_alarm_state(AlarmName=guard, StateValue="ALARM", StateReason="a drill")
    stages(gw, name, lambda d: d["EndpointStatus"] == "InService" and "FailureReason" in d)

    def told() -> list[str]:
        return [r for r in event_rows(gw) if name in r]

    wait_until(lambda: any("rolled back" in r for r in told()), "the RolledBack event")
    rows = told()
    text = "\n".join(rows)
    for expected in (
        f"Endpoint {name} is Updating",
        f"Endpoint {name}: deployment Creating",
        f"Endpoint {name}: deployment Baking",
        f"Endpoint {name} is RollingBack",
        f"Endpoint {name}: deployment RollingBack",
        "rolled back",
        f"Endpoint {name} is InService",
    ):
        assert expected in text, (expected, rows)
    assert "Endpoint Deployment Step" in text and "Endpoint Deployment State Change" in text


def test_an_endpoint_of_components_shows_its_healthy_instances_and_copies_everywhere(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    sm = gateway.sm
    sm.create_model(
        ModelName="copies-model",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("echo")},
        ExecutionRoleArn=ROLE,
    )
    component_endpoint(sm, "copies", count=1)
    # One instance of 2 vCPUs: three copies of half a core each fit on it.
    create_component(sm, "three", "copies", copies=3, cpus=0.5, memory_mb=512, model="copies-model")
    assert wait_component(sm, "three")["RuntimeConfig"]["CurrentCopyCount"] == 3

    variant = sm.describe_endpoint(EndpointName="copies")["ProductionVariants"][0]
    assert (variant["CurrentInstanceCount"], variant["DesiredInstanceCount"]) == (1, 1), variant

    status, page = gateway.get("/console/api/endpoints/copies")
    assert status == 200
    text = page.decode()
    assert '<td data-label="Instances">1/1</td>' in text, text
    assert '<td data-label="Instances">3/3 <span class="muted">copies</span></td>' in text, text
    status, listing = gateway.get("/console/api/endpoints")
    assert '<span class="counts">1/1</span>' in listing.decode()

    env = {"SHIPYARD_URL": gateway.url, "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "COLUMNS": "200"}  # fmt: skip
    described = subprocess.run(
        [sys.executable, "-m", "shipyard", "endpoints", "describe", "copies"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    row = next(line for line in described.stdout.splitlines() if "AllTraffic" in line)
    cells = [c.strip() for c in re.split(r"[│|]", row) if c.strip()]
    assert "1/1" in cells and cells[-2:] == ["1", "0"], row  # healthy, unhealthy


def test_requests_the_gateway_refuses_are_not_the_models_invocations(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    name = unique("counted")
    deploy(gateway.sm, name, model_tarball("echo"))
    rt = gateway.client("sagemaker-runtime", max_attempts=1)

    def counted(metric: str) -> float:
        status, body = gateway.get("/metrics")
        assert status == 200
        prefix = f'{metric}{{endpoint="{name}",variant="v1"}} '
        lines = [ln for ln in body.decode().splitlines() if ln.startswith(prefix)]
        return float(lines[0][len(prefix) :]) if lines else 0.0

    out = rt.invoke_endpoint(EndpointName=name, Body=b'{"a": 1}', ContentType="application/json")
    assert json.loads(out["Body"].read()) == {"a": 1}
    assert counted("shipyard_invocations_total") == 1.0
    refused: list[dict[str, Any]] = [
        {"SessionId": "never-opened"},  # an unknown session: the gateway answers it
        {"TargetVariant": "nope"},  # no such variant
    ]
    for extra in refused:
        with pytest.raises(ClientError) as err:
            rt.invoke_endpoint(EndpointName=name, Body=b"{}", **extra)
        assert err.value.response["Error"]["Code"] == "ValidationError", extra
    out = rt.invoke_endpoint(EndpointName=name, Body=b'{"b": 2}', ContentType="application/json")
    assert json.loads(out["Body"].read()) == {"b": 2}
    # The two the model answered, counted in order around the refusals: 2, not 4.
    assert counted("shipyard_invocations_total") == 2.0
    assert counted("shipyard_invocation_4xx_errors_total") == 0.0
