"""Serverless endpoints: no instance while idle, cold starts that hold the
request, MaxConcurrency, idle scale-in, MemorySizeInMB and restarts."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import GatewayProcess, unique, wait_in_service, wait_until

IDLE = {"SHIPYARD_SERVERLESS_IDLE_S": "1"}


def serverless_variant(name: str, **config: int) -> list[dict[str, Any]]:
    return [
        {
            "VariantName": "v1",
            "ModelName": name,
            "ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 5, **config},
        }
    ]


def create_serverless(
    gw: GatewayProcess, name: str, model_url: str, *, wait: bool = True, **config: int
) -> None:
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_url},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName=name, ProductionVariants=serverless_variant(name, **config)
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    if wait:
        wait_in_service(gw.sm, name)


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    status, body = gw.get("/metrics")
    assert status == 200
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def instances(gw: GatewayProcess, endpoint: str) -> float:
    return metric(gw, "shipyard_instances", endpoint=endpoint)


def invoke(rt: Any, name: str, request: dict[str, Any]) -> dict[str, Any]:
    answer = rt.invoke_endpoint(
        EndpointName=name, Body=json.dumps(request), ContentType="application/json"
    )
    result: dict[str, Any] = json.loads(answer["Body"].read())
    return result


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def serverless_gateway(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory(extra_env=IDLE)


def test_a_serverless_endpoint_starts_on_demand_and_stops_when_idle(
    serverless_gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    gw = serverless_gateway
    name = unique("sls")
    create_serverless(gw, name, model_tarball("sleepy"), MaxConcurrency=3)
    described = gw.sm.describe_endpoint(EndpointName=name)
    variant = described["ProductionVariants"][0]
    assert variant["CurrentServerlessConfig"] == {"MemorySizeInMB": 1024, "MaxConcurrency": 3}
    assert "CurrentInstanceCount" not in variant
    config = gw.sm.describe_endpoint_config(EndpointConfigName=name)
    assert config["ProductionVariants"][0]["ServerlessConfig"]["MaxConcurrency"] == 3

    # The instance CreateEndpoint tried the model with goes once idle.
    wait_until(lambda: instances(gw, name) == 0, "no instance while idle")
    first = invoke(gw.rt, name, {"sleep": 0})  # a cold start, held until the instance is up
    assert metric(gw, "shipyard_serverless_cold_starts_total", endpoint=name) == 1
    assert metric(gw, "shipyard_model_setup_time_seconds_count", endpoint=name) == 1
    assert 0 < metric(gw, "shipyard_model_setup_time_seconds_sum", endpoint=name) < 30
    again = invoke(gw.rt, name, {"sleep": 0})  # warm now
    assert again["pid"] == first["pid"]
    assert metric(gw, "shipyard_serverless_cold_starts_total", endpoint=name) == 1

    wait_until(lambda: instances(gw, name) == 0, "idle scale-in")
    wait_until(lambda: gone(first["pid"]), "the idle instance's process to end")


def test_max_concurrency_throttles_and_concurrent_requests_get_instances_of_their_own(
    serverless_gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    gw = serverless_gateway
    name = unique("slsmax")
    create_serverless(gw, name, model_tarball("sleepy"), MaxConcurrency=2)
    started = threading.Barrier(3)
    answers: list[dict[str, Any]] = []

    def slow() -> None:
        started.wait()
        answers.append(invoke(gw.rt, name, {"sleep": 2}))

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for thread in threads:
        thread.start()
    started.wait()
    wait_until(lambda: metric(gw, "shipyard_requests_in_flight", endpoint=name) == 2, "2 in flight")
    no_retry = gw.client("sagemaker-runtime", max_attempts=1)
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        invoke(no_retry, name, {"sleep": 0})
    error = refused.value.response
    assert error["Error"]["Code"] == "ThrottlingException"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert "MaxConcurrency of 2" in error["Error"]["Message"]
    for thread in threads:
        thread.join()
    assert len({a["pid"] for a in answers}) == 2  # one instance per request at a time
    assert invoke(no_retry, name, {"sleep": 0})["slept"] == 0


def test_an_instance_over_its_memory_is_stopped_and_the_request_says_why(
    serverless_gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    gw = serverless_gateway
    name = unique("slsmem")
    create_serverless(gw, name, model_tarball("sleepy"))
    with pytest.raises(gw.rt.exceptions.ModelError) as failed:
        invoke(gw.rt, name, {"hold_mb": 1600, "sleep": 5})
    message = failed.value.response["Error"]["Message"]
    assert "MemorySizeInMB of 1024" in message
    assert metric(gw, "shipyard_serverless_memory_stops_total", endpoint=name) == 1
    assert invoke(gw.rt, name, {"sleep": 0})["slept"] == 0  # a new instance serves


def test_provisioned_concurrency_keeps_instances_warm(
    serverless_gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    gw = serverless_gateway
    name = unique("slswarm")
    create_serverless(gw, name, model_tarball("sleepy"), ProvisionedConcurrency=1)
    assert instances(gw, name) == 1
    pid = invoke(gw.rt, name, {"sleep": 0})["pid"]
    # Through several idle periods (1 s each, checked every 0.5 s), the warm instance
    # stays and serves without a cold start.
    threading.Event().wait(2.5)
    assert invoke(gw.rt, name, {"sleep": 0})["pid"] == pid
    assert metric(gw, "shipyard_serverless_cold_starts_total", endpoint=name) == 0
    described = gw.sm.describe_endpoint(EndpointName=name)
    assert described["ProductionVariants"][0]["CurrentServerlessConfig"] == {
        "MemorySizeInMB": 1024,
        "MaxConcurrency": 5,
        "ProvisionedConcurrency": 1,
    }


def test_a_model_that_cannot_start_fails_create_endpoint(
    serverless_gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    gw = serverless_gateway
    name = unique("slsfail")
    create_serverless(gw, name, model_tarball("load_fails"), wait=False)
    with pytest.raises(botocore.exceptions.WaiterError):
        wait_in_service(gw.sm, name)
    described = gw.sm.describe_endpoint(EndpointName=name)
    assert described["EndpointStatus"] == "Failed"
    assert described["FailureReason"]


def test_a_serverless_endpoint_survives_a_restart_and_still_starts_on_demand(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    gw = gateway_factory(home, extra_env=IDLE)
    name = unique("slsrestart")
    create_serverless(gw, name, model_tarball("sleepy"))
    gw.stop(signal.SIGTERM)
    again = gateway_factory(home, extra_env=IDLE)
    wait_until(
        lambda: again.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService",
        "InService after restart",
    )
    assert instances(again, name) == 0  # back with nothing running
    answers: list[dict[str, Any]] = []

    def answered() -> bool:
        # Until the restarted gateway has its table, requests are ModelNotReady (429,
        # which clients retry); none of them starts an instance.
        try:
            answers.append(invoke(again.rt, name, {"sleep": 0}))
        except again.rt.exceptions.ModelNotReadyException:
            return False
        return True

    wait_until(answered, "an answer after the restart")
    assert answers[0]["slept"] == 0
    assert metric(again, "shipyard_serverless_cold_starts_total", endpoint=name) == 1


@pytest.mark.parametrize(
    ("variant", "wording"),
    [
        ({"InstanceType": "ml.m5.large"}, "cannot also specify InstanceType"),
        ({"InitialInstanceCount": 1}, "cannot also specify InitialInstanceCount"),
        ({"ServerlessConfig": {"MemorySizeInMB": 1500, "MaxConcurrency": 1}}, "one of 1024"),
        ({"ServerlessConfig": {"MemorySizeInMB": 7168, "MaxConcurrency": 1}}, "equal to 6144"),
        ({"ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 201}}, "equal to 200"),
        (
            {
                "ServerlessConfig": {
                    "MemorySizeInMB": 1024,
                    "MaxConcurrency": 2,
                    "ProvisionedConcurrency": 3,
                }
            },
            "MaxConcurrency (2)",
        ),
    ],
)
def test_bad_serverless_configs_are_refused(
    gateway: GatewayProcess,
    model_tarball: Callable[[str], str],
    variant: dict[str, Any],
    wording: str,
) -> None:
    name = unique("slsbad")
    gateway.sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("echo")},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    spec = {**serverless_variant(name)[0], **variant}
    with pytest.raises(gateway.sm.exceptions.ClientError) as refused:
        gateway.sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[spec])
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert wording in refused.value.response["Error"]["Message"]


def test_serverless_refuses_async_and_instance_counts(
    gateway: GatewayProcess, model_tarball: Callable[[str], str], tmp_path: Path
) -> None:
    sm = gateway.sm
    name = unique("slsasync")
    create_serverless(gateway, name, model_tarball("echo"))
    with pytest.raises(sm.exceptions.ClientError) as refused:
        sm.create_endpoint_config(
            EndpointConfigName=name + "-async",
            ProductionVariants=serverless_variant(name),
            AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": (tmp_path / "o").as_uri()}},
        )
    assert "do not support AsyncInferenceConfig" in refused.value.response["Error"]["Message"]
    with pytest.raises(sm.exceptions.ClientError) as refused:
        sm.update_endpoint_weights_and_capacities(
            EndpointName=name,
            DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 2}],
        )
    assert "serverless" in refused.value.response["Error"]["Message"]
