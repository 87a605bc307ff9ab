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

from tests.conftest import MODELS, Bucket, GatewayProcess, deploy, wait_in_service, wait_until
from tests.e2e.processes import instance_pids
from tests.ray.conftest import RayCluster, instance_processes

JOB_CODE = Path(__file__).parents[1] / "e2e" / "job_code"


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


def test_an_endpoint_is_deployed_updated_scaled_and_deleted_on_ray(
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


def test_an_instance_whose_process_is_killed_is_replaced(
    ray_cluster: RayCluster, ray_gateway: Callable[..., GatewayProcess], bucket: Bucket
) -> None:
    gw = ray_gateway(s3_env(bucket))
    deploy(gw.sm, "kill", s3_model(bucket, "echo"))
    (old,) = instance_processes(ray_cluster).values()
    os.kill(old, signal.SIGKILL)
    wait_until(
        lambda: instance_processes(ray_cluster).get("kill-v1-1") not in (None, old),
        "a new process for the instance",
        timeout_s=30,
    )
    wait_until(lambda: _answers(gw, "kill"), "the endpoint answers again", timeout_s=30)
    assert "instance kill-v1-1 exited: the process exited with code -9" in gw.log()


def _answers(gw: GatewayProcess, name: str) -> bool:
    try:
        return bool(invoke(gw, name, [1]) == [1])
    except Exception:
        return False


def test_a_variant_no_node_can_hold_stays_creating_then_fails_saying_why(
    ray_gateway: Callable[..., GatewayProcess],
) -> None:
    gw = ray_gateway({"SHIPYARD_INSTANCE_START_TIMEOUT_S": "6"})
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
    time.sleep(2)
    assert sm.describe_endpoint(EndpointName="huge")["EndpointStatus"] == "Creating"
    wait_until(
        lambda: sm.describe_endpoint(EndpointName="huge")["EndpointStatus"] == "Failed",
        "the endpoint fails",
        timeout_s=30,
    )
    reason = sm.describe_endpoint(EndpointName="huge")["FailureReason"]
    assert "could not be placed on the Ray cluster within 6 s" in reason
    assert "it needs 96 vCPU and 384 GiB of memory" in reason
    assert "127.0.0.1: 8 vCPU, 32 GiB" in reason
    assert "waits for a Ray node with 96 vCPU" in gw.log()


def test_a_training_job_runs_on_a_node_and_reports_back(
    ray_gateway: Callable[..., GatewayProcess], bucket: Bucket
) -> None:
    gw = ray_gateway({**s3_env(bucket), "SHIPYARD_JOB_POLL_PERIOD_S": "0.2"})
    bucket.put("data/a.txt", b"1 2 3")
    bucket.put("data/part/b.txt", b"4")
    code = bucket.put("code/sourcedir.tar.gz", _tar(JOB_CODE))
    gw.sm.create_training_job(
        TrainingJobName="sum-job",
        AlgorithmSpecification={"TrainingImage": "shipyard/python", "TrainingInputMode": "File"},
        RoleArn="arn:aws:iam::123456789012:role/x",
        HyperParameters={"sagemaker_program": "infer.py", "sagemaker_submit_directory": code},
        InputDataConfig=[
            {
                "ChannelName": "data",
                "DataSource": {
                    "S3DataSource": {
                        "S3Uri": f"s3://{bucket.name}/data/",
                        "S3DataType": "S3Prefix",
                    }
                },
            }
        ],
        OutputDataConfig={"S3OutputPath": f"s3://{bucket.name}/out"},
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        StoppingCondition={"MaxRuntimeInSeconds": 120},
    )
    wait_until(
        lambda: (
            gw.sm.describe_training_job(TrainingJobName="sum-job")["TrainingJobStatus"]
            != "InProgress"
        ),
        "the job ends",
        timeout_s=60,
    )
    job = gw.sm.describe_training_job(TrainingJobName="sum-job")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    artifact = job["ModelArtifacts"]["S3ModelArtifacts"]
    key = artifact.removeprefix(f"s3://{bucket.name}/")
    body = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        member = tar.extractfile("result.json") or tar.extractfile("./result.json")
        assert member is not None
        assert json.loads(member.read()) == {"total": 10.0}
    # The job's log reached the gateway (copied from the node with its status lines).
    assert "total 10.0" in (gw.home / "jobs" / "sum-job" / "attempt-1" / "job.log").read_text()
