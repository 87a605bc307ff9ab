"""The ray backend on a real two-node Ray cluster: a head and a worker, each in a network
namespace of its own (tests/ray/netns.py), so the nodes have different addresses.

The gateway runs in the head's namespace (a Ray driver joins through its host's node);
the test's S3 server listens on the bridge, where every node reaches it.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.conftest import Bucket, GatewayProcess, deploy, wait_until
from tests.ray.conftest import RayCluster, instance_processes, new_cluster, start_node
from tests.ray.netns import Subnet, netns_unavailable, new_subnet
from tests.ray.test_one_node import _tar, invoke, s3_model

# Three Ray nodes start in this test: 15 s each on an idle 2-core machine, more when busy.
pytestmark = pytest.mark.timeout(400)


@dataclass
class TwoNodes:
    cluster: RayCluster
    subnet: Subnet
    head_ns: str
    head_ip: str
    worker_ns: str
    worker_ip: str
    bucket: Bucket


@pytest.fixture
def two_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[TwoNodes]:
    """Head (8 vCPU, 32 GiB) and worker (4 vCPU, 16 GiB) in namespaces of their own, and
    a bucket on an S3 server on the bridge; all removed afterwards."""
    if (reason := netns_unavailable()) is not None:
        # Not a skip: only a missing Ray skips these tests, and CI runs as root.
        raise RuntimeError(f"the two-node Ray test makes network namespaces: {reason}")
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    subnet = new_subnet()
    cluster: RayCluster | None = None
    server: ThreadedMotoServer | None = None
    try:
        subnet.create()
        head_ns, head_ip = subnet.add("h")
        worker_ns, worker_ip = subnet.add("w")
        cluster = new_cluster(head_ip)
        # Several nodes: Ray's one-machine mode (127.0.0.1 everywhere) refuses workers,
        # and each node binds only inside its own namespace anyway.
        del cluster.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
        start_node(cluster, head_ip, head=True, wrap=["ip", "netns", "exec", head_ns])
        start_node(
            cluster,
            worker_ip,
            head=False,
            num_cpus=4,
            memory_gib=16,
            wrap=["ip", "netns", "exec", worker_ns],
        )
        server = ThreadedMotoServer(ip_address=subnet.gateway_ip, port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket="models")
        bucket = Bucket("models", url, client)
        yield TwoNodes(cluster, subnet, head_ns, head_ip, worker_ns, worker_ip, bucket)
    finally:
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.stop()
        subnet.delete()


def gateway_in(
    nodes: TwoNodes,
    home: Path,
    *,
    args: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> GatewayProcess:
    """A gateway in the head's namespace, on its address."""
    import subprocess

    from tests.conftest import GatewayProcess as Gw

    # A port free in the head's namespace, where the Ray head's processes bind theirs: one
    # free out here could be a Ray server's there, and answer /healthz for the gateway.
    probe = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    found = subprocess.check_output(
        ["ip", "netns", "exec", nodes.head_ns, sys.executable, "-c", probe]
    )
    port = int(found)
    home.mkdir(parents=True)
    env = {
        **os.environ,
        **nodes.cluster.env,
        "SHIPYARD_HEALTH_CHECK_PERIOD_S": "0.5",
        "SHIPYARD_S3_ENDPOINT_URL": nodes.bucket.endpoint_url,
        **(extra_env or {}),
    }
    argv = ["ip", "netns", "exec", nodes.head_ns, sys.executable, "-m", "shipyard", "serve"]
    argv += ["--host", nodes.head_ip, "--insecure", "--port", str(port), "--home", str(home)]
    argv += [*nodes.cluster.gateway_args(), *(args or [])]
    log_path = home / "gateway.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    gw = Gw(f"http://{nodes.head_ip}:{port}", home, process, log_path, env)
    try:
        wait_until(lambda: _healthy(gw), "the gateway answers", timeout_s=60)
    except AssertionError:
        gw.stop()
        raise AssertionError(gw.log()) from None
    return gw


def _healthy(gw: GatewayProcess) -> bool:
    assert gw.process.poll() is None, gw.log()
    try:
        return gw.get("/healthz")[0] == 200
    except OSError:
        return False


def _placed(gw: GatewayProcess) -> dict[str, str]:
    """Instance id to the address of the node it was last started on (gateway's log)."""
    found = re.findall(r"started instance (\S+) pid \d+ on ([\d.]+):\d+", gw.log())
    return dict(found)


def test_a_fleet_spreads_over_two_nodes_and_survives_the_loss_of_one(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    nodes = two_nodes
    gw = gateway_in(nodes, tmp_path / "home")
    try:
        began = time.monotonic()
        deploy(gw.sm, "ep", s3_model(nodes.bucket, "echo"), count=4)
        in_service_s = time.monotonic() - began
        placed = _placed(gw)
        assert sorted(set(placed.values())) == sorted([nodes.head_ip, nodes.worker_ip]), placed
        assert invoke(gw, "ep", {"x": 1}) == {"x": 1}

        client = gw.client("sagemaker-runtime", max_attempts=1, read_timeout=10)
        outcomes: list[tuple[float, bool]] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    client.invoke_endpoint(
                        EndpointName="ep", Body=b"[1]", ContentType="application/json"
                    )
                    outcomes.append((time.monotonic(), True))
                except Exception:
                    outcomes.append((time.monotonic(), False))

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        time.sleep(1.0)
        lost = [i for i, ip in placed.items() if ip == nodes.worker_ip]
        killed_at = time.monotonic()
        nodes.cluster.nodes[1].kill()
        # Its instances come back on the head, and all four serve again.
        wait_until(
            lambda: (
                all(_placed(gw).get(i) == nodes.head_ip for i in lost)
                and len(instance_processes(nodes.cluster)) == 4
            ),
            "the lost node's instances replaced on the head",
            timeout_s=60,
        )
        recovered_s = time.monotonic() - killed_at
        time.sleep(1.0)
        stop.set()
        thread.join(timeout=15)
        failed = sum(not ok for _, ok in outcomes)
        after = [ok for at, ok in outcomes if at > killed_at + recovered_s]
        assert after and all(after), "requests fail after the fleet recovered"
        log = gw.log()
        assert "its Ray actor was lost" in log or "failed its health checks" in log
        print(
            json.dumps(
                {
                    "in_service_4_instances_s": round(in_service_s, 2),
                    "lost_instances": len(lost),
                    "requests": len(outcomes),
                    "requests_failed": failed,
                    "seconds_to_full_capacity": round(recovered_s, 2),
                }
            )
        )
        a_job_on_a_lost_node_is_retried_from_its_checkpoint(nodes, gw)
    finally:
        gw.stop()


def a_job_on_a_lost_node_is_retried_from_its_checkpoint(
    nodes: TwoNodes, gw: GatewayProcess
) -> None:
    """The head is full (the endpoint's four instances), so a new worker takes the job;
    the endpoint goes, the worker is lost, and the job's next attempt runs on the head."""
    start_node(
        nodes.cluster,
        nodes.worker_ip,
        head=False,
        num_cpus=4,
        memory_gib=16,
        wrap=["ip", "netns", "exec", nodes.worker_ns],
    )
    bucket = nodes.bucket
    code = bucket.put("code/sourcedir.tar.gz", _tar(Path(__file__).parent / "job_code"))
    gw.sm.create_training_job(
        TrainingJobName="steps",
        AlgorithmSpecification={"TrainingImage": "shipyard/python", "TrainingInputMode": "File"},
        RoleArn="arn:aws:iam::123456789012:role/x",
        HyperParameters={
            "sagemaker_program": "steps.py",
            "sagemaker_submit_directory": code,
            "steps": "40",
        },
        OutputDataConfig={"S3OutputPath": f"s3://{bucket.name}/out"},
        CheckpointConfig={"S3Uri": f"s3://{bucket.name}/ckpt"},
        RetryStrategy={"MaximumRetryAttempts": 1},
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        StoppingCondition={"MaxRuntimeInSeconds": 300},
    )
    wait_until(
        lambda: (
            "KeyCount" in bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="ckpt/")
            and bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="ckpt/")["KeyCount"] > 0
        ),
        "a checkpoint synced to S3",
        timeout_s=60,
    )
    assert re.search(rf"job:steps/attempt-1 pid \d+ on {re.escape(nodes.worker_ip)}", gw.log())
    gw.sm.delete_endpoint(EndpointName="ep")
    nodes.cluster.nodes[-1].kill()
    wait_until(
        lambda: (
            gw.sm.describe_training_job(TrainingJobName="steps")["TrainingJobStatus"]
            != "InProgress"
        ),
        "the job ends",
        timeout_s=90,
    )
    job = gw.sm.describe_training_job(TrainingJobName="steps")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    assert "Restarting" in [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert re.search(rf"job:steps/attempt-2 pid \d+ on {re.escape(nodes.head_ip)}", gw.log())
    key = job["ModelArtifacts"]["S3ModelArtifacts"].removeprefix(f"s3://{bucket.name}/")
    body = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        member = tar.extractfile("result.json") or tar.extractfile("./result.json")
        assert member is not None
        assert json.loads(member.read())["resumed_from"] > 0
    # What the runners reported reached the gateway's folder (copied from their nodes).
    assert "step 40" in (gw.home / "jobs" / "steps" / "attempt-2" / "job.log").read_text()
