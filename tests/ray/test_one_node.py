"""The ray backend on a real one-node Ray cluster (127.0.0.1, token authentication).

Instances are processes under Ray actors on the node, not the gateway's children, and
fetch their artifacts from S3 (moto's server) on the node; the gateway reaches them at
the address each reports.
"""

from __future__ import annotations

import io
import json
import os
import signal
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import MODELS, Bucket, GatewayProcess, deploy, wait_in_service, wait_until
from tests.e2e.processes import instance_pids
from tests.ray.conftest import RayCluster, instance_processes

# Starting a Ray node takes 15 s on an idle 2-core machine, and several times that on a busy one.
pytestmark = pytest.mark.timeout(300)


def s3_model(bucket: Bucket, model: str) -> str:
    """tests/models/<model> as model.tar.gz in the bucket; its s3:// URI."""
    return bucket.put(f"{model}/model.tar.gz", _tar(MODELS / model))


def _tar(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def invoke(gw: GatewayProcess, name: str, body: Any) -> Any:
    answer = gw.rt.invoke_endpoint(
        EndpointName=name, Body=json.dumps(body), ContentType="application/json"
    )
    return json.loads(answer["Body"].read())


def s3_env(bucket: Bucket) -> dict[str, str]:
    return {"SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url}


def test_an_endpoint_is_deployed_healed_updated_scaled_and_deleted_on_ray(
    ray_cluster: RayCluster, ray_gateway: Callable[..., GatewayProcess], bucket: Bucket
) -> None:
    gw = ray_gateway(s3_env(bucket))
    sm = gw.sm
    deploy(sm, "ep", s3_model(bucket, "echo"), count=2)
    assert invoke(gw, "ep", {"hello": 1}) == {"hello": 1}
    running = instance_processes(ray_cluster)
    assert sorted(running) == ["ep-v1-1", "ep-v1-2"]
    assert instance_pids(gw.process.pid) == []  # under Ray's actors, not the gateway
    # The artifact came from S3 into the node's own cache, not from the gateway's disk.
    cmdline = psutil.Process(running["ep-v1-1"]).cmdline()
    assert cmdline[cmdline.index("--model-url") + 1].startswith("s3://")
    assert str(gw.home) not in " ".join(cmdline)
    # Its log is copied from its node into the gateway's logs folder.
    log = gw.home / "logs" / "ep" / "ep-v1-2.log"
    wait_until(lambda: log.exists() and "serving" in log.read_text(), "the instance's log copied")

    # An instance whose process is killed is replaced.
    os.kill(running["ep-v1-1"], signal.SIGKILL)
    wait_until(
        lambda: instance_processes(ray_cluster).get("ep-v1-1") not in (None, running["ep-v1-1"]),
        "a new process for the instance",
        timeout_s=60,
    )
    wait_until(lambda: _answers(gw, "ep"), "the endpoint answers again", timeout_s=30)
    assert "instance ep-v1-1 exited: the process exited with code -9" in gw.log()

    sm.create_model(
        ModelName="sum",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": s3_model(bucket, "sum")},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    sm.create_endpoint_config(
        EndpointConfigName="sum",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "sum",
                "InstanceType": "ml.t2.medium",
                "InitialInstanceCount": 1,
            }
        ],
    )
    sm.update_endpoint(EndpointName="ep", EndpointConfigName="sum")
    wait_until(
        lambda: sm.describe_endpoint(EndpointName="ep")["EndpointStatus"] == "Updating",
        "the update begins",
    )
    wait_in_service(sm, "ep")
    assert invoke(gw, "ep", [[1, 2], [3, 4]]) == [3.0, 7.0]
    wait_until(lambda: set(instance_processes(ray_cluster)) == {"ep-v1-3"}, "old fleet gone")

    sm.update_endpoint_weights_and_capacities(
        EndpointName="ep",
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 3}],
    )
    wait_until(
        lambda: (
            sm.describe_endpoint(EndpointName="ep")["ProductionVariants"][0]["CurrentInstanceCount"]
            == 3
        ),
        "scaled out to 3",
        timeout_s=60,
    )
    assert len(instance_processes(ray_cluster)) == 3
    assert invoke(gw, "ep", [[5, 5]]) == [10.0]

    sm.delete_endpoint(EndpointName="ep")
    wait_until(lambda: not instance_processes(ray_cluster), "instances stopped", timeout_s=30)


def _answers(gw: GatewayProcess, name: str) -> bool:
    try:
        return bool(invoke(gw, name, {"x": 1}) == {"x": 1})
    except Exception:
        return False


def test_a_variant_no_node_can_hold_stays_creating_then_fails_saying_why(
    ray_gateway: Callable[..., GatewayProcess],
) -> None:
    gw = ray_gateway({"SHIPYARD_INSTANCE_START_TIMEOUT_S": "4"})
    sm = gw.sm
    sm.create_model(
        ModelName="huge",
        PrimaryContainer={"Image": "shipyard/python"},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    sm.create_endpoint_config(
        EndpointConfigName="huge",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "huge",
                "InstanceType": "ml.m5.24xlarge",
                "InitialInstanceCount": 1,
            }
        ],
    )
    sm.create_endpoint(EndpointName="huge", EndpointConfigName="huge")
    time.sleep(1)
    assert sm.describe_endpoint(EndpointName="huge")["EndpointStatus"] == "Creating"
    wait_until(
        lambda: sm.describe_endpoint(EndpointName="huge")["EndpointStatus"] == "Failed",
        "the endpoint fails",
        timeout_s=30,
    )
    reason = sm.describe_endpoint(EndpointName="huge")["FailureReason"]
    assert "could not be placed on the Ray cluster within 4 s" in reason
    assert "it needs 96 vCPU and 384 GiB of memory" in reason
    assert "127.0.0.1: 8 vCPU, 32 GiB" in reason
    assert "waits for a Ray node with 96 vCPU" in gw.log()


def test_multi_model_and_serverless_variants_run_on_ray(
    ray_cluster: RayCluster, ray_gateway: Callable[..., GatewayProcess], bucket: Bucket
) -> None:
    """A multi-model instance loads its TargetModels from S3 into a cache of its node's;
    a serverless variant starts its instance on Ray when a request comes."""
    gw = ray_gateway(s3_env(bucket))
    sm = gw.sm
    s3_model(bucket, "echo")
    s3_model(bucket, "sum")
    sm.create_model(
        ModelName="many",
        PrimaryContainer={
            "Image": "shipyard/python",
            "Mode": "MultiModel",
            "ModelDataUrl": f"s3://{bucket.name}/",
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    sm.create_model(
        ModelName="lazy",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": s3_model(bucket, "sum")},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    sm.create_endpoint_config(
        EndpointConfigName="many",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "many",
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
    )
    sm.create_endpoint_config(
        EndpointConfigName="lazy",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "lazy",
                "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 2},
            }
        ],
    )
    sm.create_endpoint(EndpointName="many", EndpointConfigName="many")
    sm.create_endpoint(EndpointName="lazy", EndpointConfigName="lazy")
    wait_in_service(sm, "many")
    wait_in_service(sm, "lazy")
    for target, body, expected in (
        ("sum/model.tar.gz", [[1, 2]], [3.0]),
        ("echo/model.tar.gz", {"e": 1}, {"e": 1}),
    ):
        answer = gw.rt.invoke_endpoint(
            EndpointName="many",
            TargetModel=target,
            Body=json.dumps(body),
            ContentType="application/json",
        )
        assert json.loads(answer["Body"].read()) == expected
    # The instance's model cache is its node's, not a folder of the gateway's.
    assert not any((gw.home / "instances").rglob("*.py"))
    assert invoke(gw, "lazy", [[2, 2]]) == [4.0]
    assert "lazy-v1-" in " ".join(instance_processes(ray_cluster))


def test_an_async_endpoint_on_ray_reads_and_writes_s3(
    ray_gateway: Callable[..., GatewayProcess], bucket: Bucket
) -> None:
    gw = ray_gateway(s3_env(bucket))
    sm = gw.sm
    sm.create_model(
        ModelName="later",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": s3_model(bucket, "sum")},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    sm.create_endpoint_config(
        EndpointConfigName="later",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "later",
                "InstanceType": "ml.t2.medium",
                "InitialInstanceCount": 1,
            }
        ],
        AsyncInferenceConfig={
            "OutputConfig": {
                "S3OutputPath": f"s3://{bucket.name}/async/ok",
                "S3FailurePath": f"s3://{bucket.name}/async/failed",
            }
        },
    )
    sm.create_endpoint(EndpointName="later", EndpointConfigName="later")
    wait_in_service(sm, "later")
    source = bucket.put("async/in/1.json", b"[[1, 2, 3]]")
    answer = gw.rt.invoke_endpoint_async(
        EndpointName="later", InputLocation=source, ContentType="application/json"
    )
    key = answer["OutputLocation"].removeprefix(f"s3://{bucket.name}/")

    def output() -> bytes | None:
        try:
            return bytes(bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read())
        except bucket.client.exceptions.NoSuchKey:
            return None

    wait_until(lambda: output() is not None, "the async answer in S3", timeout_s=60)
    assert json.loads(output() or b"") == [6.0]


def test_inference_component_copies_run_on_ray_and_a_session_follows_its_copy(
    ray_cluster: RayCluster, ray_gateway: Callable[..., GatewayProcess], bucket: Bucket
) -> None:
    """Each copy is an instance process under a Ray actor on the node, reserving the
    component's cores and memory; requests name the component, and a session stays on
    the copy that opened it."""
    gw = ray_gateway(s3_env(bucket))
    sm, role = gw.sm, "arn:aws:iam::123456789012:role/x"
    sm.create_model(
        ModelName="envs",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": s3_model(bucket, "env_dump")},
        ExecutionRoleArn=role,
    )
    sm.create_endpoint_config(
        EndpointConfigName="hosts", ExecutionRoleArn=role,
        ProductionVariants=[{"VariantName": "AllTraffic", "InstanceType": "ml.m5.large",
                             "InitialInstanceCount": 1}],
    )  # fmt: skip
    sm.create_endpoint(EndpointName="hosts", EndpointConfigName="hosts")
    wait_in_service(sm, "hosts")
    sm.create_inference_component(
        InferenceComponentName="on-ray", EndpointName="hosts", VariantName="AllTraffic",
        Specification={"ModelName": "envs", "ComputeResourceRequirements": {
            "NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 256}},
        RuntimeConfig={"CopyCount": 2},
    )  # fmt: skip
    wait_until(
        lambda: (
            sm.describe_inference_component(InferenceComponentName="on-ray")[
                "InferenceComponentStatus"
            ]
            == "InService"
        ),
        "on-ray in service",
        timeout_s=180,
    )
    copies = {i: pid for i, pid in instance_processes(ray_cluster).items() if "on-ray" in i}
    assert len(copies) == 2, copies

    def ask(**extra: Any) -> tuple[dict[str, str], Any]:
        out = gw.rt.invoke_endpoint(
            EndpointName="hosts", InferenceComponentName="on-ray", Body=b"{}", **extra
        )
        return json.loads(out["Body"].read()), out

    env, opened = ask(SessionId="NEW_SESSION")
    assert env["SHIPYARD_INFERENCE_COMPONENT"] == "on-ray"
    assert env["SHIPYARD_INSTANCE_ID"] in copies
    session = opened["NewSessionId"].split(";")[0]
    followed = {ask(SessionId=session)[0]["SHIPYARD_INSTANCE_ID"] for _ in range(5)}
    assert followed == {env["SHIPYARD_INSTANCE_ID"]}
    sm.delete_inference_component(InferenceComponentName="on-ray")
    wait_until(
        lambda: not any("on-ray" in i for i in instance_processes(ray_cluster)),
        "the copies stopped on the node",
        timeout_s=60,
    )
