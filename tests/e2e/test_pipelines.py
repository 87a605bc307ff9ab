"""Multi-container models end to end: inference pipelines (Serial) and Direct invocation,
each container a real instance process of its own, behind a real gateway, through boto3.

Every container runs tests/models/stage, which appends ``|<name>(<content type>;<accept>)``
to what it is sent and answers as the content type its Environment names, so an answer
shows which steps ran, in which order, and what each one was sent.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, wait_in_service, wait_until
from tests.e2e.processes import alive, instance_pids

STAGE = (MODELS / "stage").as_uri()
ROLE = "arn:aws:iam::123456789012:role/x"


def stage(name: str, out_type: str, hostname: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "Image": "shipyard/python",
        "ModelDataUrl": STAGE,
        "Environment": {"STAGE_NAME": name, "STAGE_OUT_TYPE": out_type},
    }
    if hostname is not None:
        container["ContainerHostname"] = hostname
    return container


def create_model(sm: Any, name: str, containers: list[dict[str, Any]], mode: str | None) -> None:
    extra = {"InferenceExecutionConfig": {"Mode": mode}} if mode else {}
    sm.create_model(ModelName=name, Containers=containers, ExecutionRoleArn=ROLE, **extra)


def create_config(
    sm: Any, name: str, model: str, *, count: int = 1, strategy: str = "RANDOM", **extra: Any
) -> None:
    sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": model,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": count,
                "RoutingConfig": {"RoutingStrategy": strategy},
            }
        ],
        **extra,
    )


def deploy(
    sm: Any, name: str, containers: list[dict[str, Any]], mode: str | None, **kw: Any
) -> None:
    create_model(sm, name, containers, mode)
    create_config(sm, name, name, **kw)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(sm, name)


def invoke(
    gw: GatewayProcess, name: str, body: bytes, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """One request with no retries (boto3 retries 503s), over plain HTTP."""
    request = urllib.request.Request(
        f"{gw.url}/endpoints/{name}/invocations",
        data=body,
        method="POST",
        headers={"Content-Type": "text/csv", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def container_pids(gw: GatewayProcess) -> dict[str, int]:
    """Instance id -> PID of every instance process the gateway runs."""
    out = {}
    for pid in instance_pids(gw.process.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"SHIPYARD_INSTANCE_ID="):
                out[entry.split(b"=", 1)[1].decode()] = pid
    return out


SERIAL = [
    stage("a", "application/x-a", hostname="first"),
    stage("b", "application/x-b"),
    stage("c", "application/x-c", hostname="last"),
]


def test_a_serial_pipeline_hands_each_answer_to_the_next_container(
    gateway: GatewayProcess,
) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "pipe", SERIAL, None, strategy="LEAST_OUTSTANDING_REQUESTS")
    out = rt.invoke_endpoint(
        EndpointName="pipe", ContentType="text/csv", Accept="application/x-final", Body=b"1,2"
    )
    assert out["Body"].read() == (
        b"1,2|a(text/csv;application/x-final)|b(application/x-a;application/x-final)"
        b"|c(application/x-b;application/x-final)"
    )
    assert out["ContentType"] == "application/x-c"
    assert out["InvokedProductionVariant"] == "v1"
    # One instance is a group of three processes, one per container, each its own port.
    pids = container_pids(gateway)
    assert len(pids) == 3
    assert {i.rsplit("-", 1)[1] for i in pids} == {"first", "2", "last"}

    described = sm.describe_model(ModelName="pipe")
    assert described["InferenceExecutionConfig"] == {"Mode": "Serial"}
    assert [c.get("ContainerHostname") for c in described["Containers"]] == ["first", None, "last"]
    assert described["Containers"][1]["Environment"] == {
        "STAGE_NAME": "b",
        "STAGE_OUT_TYPE": "application/x-b",
    }
    assert described["Containers"][0]["Image"] == "shipyard/python"
    assert "PrimaryContainer" not in described

    # DesiredInstanceCount counts groups: two instances are six processes.
    sm.update_endpoint_weights_and_capacities(
        EndpointName="pipe",
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 2}],
    )
    wait_in_service(sm, "pipe")
    wait_until(lambda: len(container_pids(gateway)) == 6, "a second group of three")
    variant = sm.describe_endpoint(EndpointName="pipe")["ProductionVariants"][0]
    assert variant["CurrentInstanceCount"] == 2
    answers = {
        rt.invoke_endpoint(EndpointName="pipe", ContentType="text/csv", Body=b"x")["Body"].read()
        for _ in range(8)
    }
    assert answers == {
        b"x|a(text/csv;application/json)|b(application/x-a;application/json)"
        b"|c(application/x-b;application/json)"
    }


def test_a_failing_step_is_a_model_error_naming_its_container(gateway: GatewayProcess) -> None:
    deploy(gateway.sm, "failing", SERIAL, "Serial")
    with pytest.raises(ClientError) as err:
        gateway.rt.invoke_endpoint(EndpointName="failing", ContentType="text/csv", Body=b"fail:b")
    response = err.value.response
    assert response["Error"]["Code"] == "ModelError"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert response["OriginalStatusCode"] == 500
    assert "from container 2 with message" in response["Error"]["Message"]
    assert "step b refuses this input" in response["OriginalMessage"]
    status, headers, body = invoke(gateway, "failing", b"fail:c")
    assert status == 424 and headers["x-amzn-errortype"] == "ModelError"
    assert "from last with message" in json.loads(body)["Message"]
    # Naming a container is for Direct models only.
    status, headers, _ = invoke(
        gateway, "failing", b"x", **{"X-Amzn-SageMaker-Target-Container-Hostname": "first"}
    )
    assert status == 400 and headers["x-amzn-errortype"] == "ValidationError"
    assert invoke(gateway, "failing", b"ok")[0] == 200


def test_a_dead_container_is_restarted_with_its_group(gateway: GatewayProcess) -> None:
    deploy(gateway.sm, "dies", SERIAL, None)
    before = container_pids(gateway)
    status, _, _ = invoke(gateway, "dies", b"exit:b")  # the middle step's process ends
    assert status in (424, 503)
    dead = next(pid for iid, pid in before.items() if iid.endswith("-2"))
    wait_until(lambda: not alive(dead), "the middle container to end")

    def serves() -> bool:
        return invoke(gateway, "dies", b"again")[0] == 200

    wait_until(serves, "the group to serve again", timeout_s=30)
    after = container_pids(gateway)
    assert len(after) == 3
    assert after[next(iid for iid in after if iid.endswith("-2"))] != dead


def test_direct_invocation_picks_the_container_by_hostname(gateway: GatewayProcess) -> None:
    sm, rt = gateway.sm, gateway.rt
    containers = [stage("a", "application/x-a", "alpha"), stage("b", "application/x-b", "beta")]
    deploy(sm, "direct", containers, "Direct", count=2)
    out = rt.invoke_endpoint(
        EndpointName="direct",
        ContentType="text/csv",
        Accept="text/plain",
        Body=b"q",
        TargetContainerHostname="beta",
    )
    assert out["Body"].read() == b"q|b(text/csv;text/plain)"
    assert out["ContentType"] == "application/x-b"
    out = rt.invoke_endpoint(
        EndpointName="direct", ContentType="text/csv", Body=b"q", TargetContainerHostname="alpha"
    )
    assert out["Body"].read() == b"q|a(text/csv;application/json)"
    assert sm.describe_model(ModelName="direct")["InferenceExecutionConfig"] == {"Mode": "Direct"}

    with pytest.raises(ClientError) as err:
        rt.invoke_endpoint(EndpointName="direct", ContentType="text/csv", Body=b"q")
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "TargetContainerHostname" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        rt.invoke_endpoint(
            EndpointName="direct",
            ContentType="text/csv",
            Body=b"q",
            TargetContainerHostname="gamma",
        )
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "'gamma' is not a container of the model" in err.value.response["Error"]["Message"]
    assert "alpha, beta" in err.value.response["Error"]["Message"]

    # Blue/green: the endpoint moves to a Serial pipeline of the same containers.
    create_model(sm, "direct-serial", [stage("a", "application/x-a"), stage("b", "x/b")], None)
    create_config(sm, "direct-serial", "direct-serial")
    sm.update_endpoint(EndpointName="direct", EndpointConfigName="direct-serial")
    wait_in_service(sm, "direct")
    out = rt.invoke_endpoint(EndpointName="direct", ContentType="text/csv", Body=b"q")
    assert (
        out["Body"].read() == b"q|a(text/csv;application/json)|b(application/x-a;application/json)"
    )


def test_a_failing_direct_container_is_a_model_error_naming_its_hostname(
    gateway: GatewayProcess,
) -> None:
    """A failing container is named by its ContainerHostname in Direct mode
    too, whether its answer is read whole or streamed."""
    containers = [stage("a", "x/a", "ha"), stage("b", "x/b", "hb")]
    deploy(gateway.sm, "direct-fails", containers, "Direct")
    with pytest.raises(ClientError) as err:
        gateway.rt.invoke_endpoint(
            EndpointName="direct-fails",
            ContentType="text/csv",
            Body=b"fail:b",
            TargetContainerHostname="hb",
        )
    response = err.value.response
    assert response["Error"]["Code"] == "ModelError"
    assert response["OriginalStatusCode"] == 500
    assert "from hb with message" in response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        gateway.rt.invoke_endpoint_with_response_stream(
            EndpointName="direct-fails",
            ContentType="text/csv",
            Body=b"fail:b",
            TargetContainerHostname="hb",
        )
    assert err.value.response["Error"]["Code"] == "ModelError"
    assert "from hb with message" in err.value.response["Error"]["Message"]


def test_an_async_endpoint_runs_a_serial_pipeline(gateway: GatewayProcess, tmp_path: Path) -> None:
    sm = gateway.sm
    out = tmp_path / "out"
    create_model(sm, "apipe", SERIAL, None)
    create_config(
        sm,
        "apipe",
        "apipe",
        AsyncInferenceConfig={
            "OutputConfig": {
                "S3OutputPath": (out / "ok").as_uri(),
                "S3FailurePath": (out / "failed").as_uri(),
            }
        },
    )
    sm.create_endpoint(EndpointName="apipe", EndpointConfigName="apipe")
    wait_in_service(sm, "apipe")
    locations = {}
    for body in (b"in", b"fail:b"):
        source = tmp_path / f"{body.decode().replace(':', '-')}.csv"
        source.write_bytes(body)
        answer = gateway.rt.invoke_endpoint_async(
            EndpointName="apipe", InputLocation=source.as_uri(), ContentType="text/csv"
        )
        locations[body] = answer
    ok = Path(locations[b"in"]["OutputLocation"].removeprefix("file://"))
    failed = Path(locations[b"fail:b"]["FailureLocation"].removeprefix("file://"))
    deadline = time.monotonic() + 30
    while not (ok.exists() and failed.exists()):
        assert time.monotonic() < deadline, "the async results never landed"
        time.sleep(0.05)
    assert ok.read_bytes() == (
        b"in|a(text/csv;application/json)|b(application/x-a;application/json)"
        b"|c(application/x-b;application/json)"
    )
    assert "from container 2" in failed.read_text()


BAD_MODELS: list[tuple[dict[str, Any], str]] = [
    (
        {"PrimaryContainer": stage("a", "x/a"), "Containers": [stage("b", "x/b")]},
        "mutually exclusive",
    ),
    (
        {
            "Containers": [stage("a", "x/a", "alpha"), stage("b", "x/b")],
            "InferenceExecutionConfig": {"Mode": "Direct"},
        },
        "Containers.2.ContainerHostname must be provided",
    ),
    (
        {"Containers": [stage("a", "x/a", "same"), stage("b", "x/b", "same")]},
        "'same' is given to more than one container",
    ),
    (
        # Hostnames are compared as SageMaker compares them: whatever their case.
        {"Containers": [stage("a", "x/a", "ha"), stage("b", "x/b", "HA")]},
        "'HA' is given to more than one container",
    ),
    ({"Containers": [stage(str(n), "x/n") for n in range(16)]}, "less than or equal to 15"),
    (
        {"PrimaryContainer": stage("a", "x/a"), "InferenceExecutionConfig": {"Mode": "Direct"}},
        "Mode Direct needs Containers",
    ),
    (
        {"Containers": [stage("a", "x/a"), {"ModelDataUrl": STAGE}]},
        "Containers.2.Image must be provided",
    ),
    (
        {"Containers": [stage("a", "x/a"), {**stage("b", "x/b"), "Mode": "MultiModel"}]},
        "Containers.2.Mode MultiModel is not supported",
    ),
    ({"Containers": [stage("a", "x/a", "not_a_hostname")]}, "containerHostname"),
    (
        {"Containers": [stage("a", "x/a")], "InferenceExecutionConfig": {"Mode": "Parallel"}},
        "inferenceExecutionConfig.mode",
    ),
]


def test_create_model_refuses_bad_containers(gateway: GatewayProcess) -> None:
    sm = gateway.client("sagemaker", config_validation=False)
    for params, words in BAD_MODELS:
        with pytest.raises(ClientError) as err:
            sm.create_model(ModelName="bad", ExecutionRoleArn=ROLE, **params)
        assert err.value.response["Error"]["Code"] == "ValidationException", params
        assert words in err.value.response["Error"]["Message"], params
    with pytest.raises(ClientError):
        sm.describe_model(ModelName="bad")
