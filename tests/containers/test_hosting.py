"""Endpoints whose Image is a container image, on a real engine: SageMaker's
hosting contract, checked from inside the container (images/serve.py reports what it
sees) and from the engine's side."""

from __future__ import annotations

import json
import signal
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, deploy, unique, wait_in_service, wait_until
from tests.containers.conftest import Engine, needs_engine

pytestmark = needs_engine

ROLE = "arn:aws:iam::123456789012:role/x"
SECRET = "SHIPYARD_TEST_GATEWAY_ONLY"
"""A variable of the gateway's environment that no container may see."""


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, str]:
    """The test images, built once."""
    repo = "localhost/shipyard-test"
    return {
        "v1": engine.build(f"{repo}/echo:1", lines=("ENV IMAGE_VERSION=1",)),
        "v2": engine.build(f"{repo}/echo:2", lines=("ENV IMAGE_VERSION=2",)),
        "bind": engine.build(
            f"{repo}/bind:1",
            lines=(
                "ENV IMAGE_VERSION=bind",
                'LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port="true"',
            ),
        ),
        "exit": engine.build(f"{repo}/exit:1", lines=("ENV IMAGE_MODE=exit",)),
        "noping": engine.build(f"{repo}/noping:1", lines=("ENV IMAGE_MODE=noping",)),
    }


@pytest.fixture
def artifact(tmp_path: Path) -> str:
    """A model.tar.gz holding answer.txt."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "answer.txt").write_text("42\n")
    path = tmp_path / "model.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(tmp_path / "model", arcname=".")
    return path.as_uri()


@pytest.fixture
def gateway(gateway_factory: Callable[..., GatewayProcess], engine: Engine) -> GatewayProcess:
    return gateway_factory(extra_env={**engine.env, SECRET: "not for containers"})


def invoke(gw: GatewayProcess, endpoint: str, body: bytes = b"hello") -> dict[str, Any]:
    answer = gw.rt.invoke_endpoint(EndpointName=endpoint, Body=body, ContentType="text/plain")
    return dict(json.loads(answer["Body"].read()))


def make_config(
    sm: Any, name: str, *, model: str | None = None, count: int = 1, **extra: Any
) -> None:
    """An endpoint config of one ml.m5.large variant ``v1`` of ``model`` (default ``name``)."""
    variant = {
        "VariantName": "v1",
        "ModelName": model or name,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": count,
    }
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant], **extra)


def answered(gw: GatewayProcess, endpoint: str) -> bool:
    """Whether the endpoint answers yet (after a restart, its first routing table)."""
    try:
        invoke(gw, endpoint)
    except gw.rt.exceptions.ModelNotReadyException:
        return False
    return True


def ours(engine: Engine, endpoint: str, *, running: bool = True) -> list[Any]:
    found = engine.containers(**{"dev.shipyard.endpoint": endpoint})
    return [c for c in found if c.status == "running"] if running else found


def test_an_image_serves_invocations_under_the_hosting_contract(
    gateway: GatewayProcess, engine: Engine, images: dict[str, str], artifact: str
) -> None:
    name = unique("img")
    deploy(gateway.sm, name, artifact, image=images["v1"], environment={"GREETING": "hi"})

    seen = invoke(gateway, name)
    assert seen["argv"] == ["serve"]
    assert seen["model"] == "42"  # the artifact, extracted, at /opt/ml/model
    assert seen["model_writable"] is False  # read-only
    assert seen["port"] == 8080  # no bind-to-port label: the contract's port
    assert seen["body"] == "hello"
    assert seen["environ"]["GREETING"] == "hi"
    assert SECRET not in seen["environ"]  # nothing of the gateway's environment
    assert "SAGEMAKER_BIND_TO_PORT" not in seen["environ"]

    # From the engine's side: labelled with its endpoint, limited to ml.m5.large's
    # 2 vCPUs and 8 GiB, published on loopback only, and no host folder but the model.
    (container,) = ours(engine, name)
    config = container.attrs["HostConfig"]
    assert config["NanoCpus"] == 2 * 10**9
    assert config["Memory"] == 8 << 30
    mounts = container.attrs["Mounts"]
    assert [(m["Destination"], m["RW"]) for m in mounts] == [("/opt/ml/model", False)]
    bindings = container.attrs["NetworkSettings"]["Ports"]["8080/tcp"]
    assert {b["HostIp"] for b in bindings} == {"127.0.0.1"}

    # Its output is the instance's log; a model's own error is the client's ModelError.
    logs = list((gateway.home / "logs" / name).glob("*.log"))
    wait_until(lambda: any("serving version 1" in p.read_text() for p in logs), "the log")
    with pytest.raises(gateway.rt.exceptions.ModelError) as failed:
        invoke(gateway, name, b"fail")
    assert failed.value.response["OriginalStatusCode"] == 500

    gateway.sm.delete_endpoint(EndpointName=name)
    wait_until(lambda: not ours(engine, name, running=False), "the container removed")


def test_two_instances_a_killed_container_and_a_blue_green_update(
    gateway: GatewayProcess, engine: Engine, images: dict[str, str], artifact: str
) -> None:
    name = unique("img")
    deploy(gateway.sm, name, artifact, image=images["v1"], count=2,
           strategy="LEAST_OUTSTANDING_REQUESTS")  # fmt: skip
    assert len({invoke(gateway, name)["hostname"] for _ in range(20)}) == 2

    # A container killed through the engine is replaced, as a dead process is.
    victim = ours(engine, name)[0]
    victim.kill()
    wait_until(
        lambda: (
            len(ours(engine, name)) == 2 and victim.id not in {c.id for c in ours(engine, name)}
        ),
        "the killed container replaced",
        timeout_s=60,
    )
    assert invoke(gateway, name)["version"] == "1"

    # Blue/green to a new tag: the new fleet serves, the old containers go.
    old = {c.id for c in ours(engine, name)}
    gateway.sm.create_model(
        ModelName=f"{name}-2",
        PrimaryContainer={"Image": images["v2"], "ModelDataUrl": artifact},
        ExecutionRoleArn=ROLE,
    )
    make_config(gateway.sm, f"{name}-2", count=2)
    gateway.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-2")
    wait_until(
        lambda: (
            gateway.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"
            and gateway.sm.describe_endpoint(EndpointName=name)["EndpointConfigName"] == f"{name}-2"
        ),
        "the update",
        timeout_s=90,
    )
    assert {invoke(gateway, name)["version"] for _ in range(10)} == {"2"}
    wait_until(lambda: not old & {c.id for c in ours(engine, name, running=False)}, "old gone")


def test_a_two_container_pipeline_of_images(
    gateway: GatewayProcess, images: dict[str, str], artifact: str
) -> None:
    name = unique("pipe")
    gateway.sm.create_model(
        ModelName=name,
        Containers=[
            {"Image": images["v1"], "ModelDataUrl": artifact, "ContainerHostname": "first"},
            {"Image": images["bind"], "ContainerHostname": "second"},
        ],
        ExecutionRoleArn=ROLE,
    )
    make_config(gateway.sm, name)
    gateway.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gateway.sm, name)
    second = invoke(gateway, name)
    first = json.loads(second["body"])  # the first container's answer was its request
    assert (first["hostname"], second["hostname"]) == ("first", "second")
    assert first["model"] == "42" and second["model"] is None
    # The image with the bind-to-port label is told its port, and listens there.
    assert second["environ"]["SAGEMAKER_BIND_TO_PORT"] == str(second["port"])
    assert second["environ"]["SAGEMAKER_SAFE_PORT_RANGE"]
    assert "SAGEMAKER_BIND_TO_PORT" not in first["environ"]


def test_a_multi_model_image_loads_its_target_models(
    gateway: GatewayProcess, engine: Engine, images: dict[str, str], tmp_path: Path
) -> None:
    prefix = tmp_path / "models"
    prefix.mkdir()
    for model, answer in (("a", "alpha"), ("b", "beta")):
        (tmp_path / model).mkdir()
        (tmp_path / model / "answer.txt").write_text(answer)
        with tarfile.open(prefix / f"{model}.tar.gz", "w:gz") as tar:
            tar.add(tmp_path / model, arcname=".")
    name = unique("mme")
    gateway.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": images["v1"],
            "Mode": "MultiModel",
            "ModelDataUrl": prefix.as_uri() + "/",
        },
        ExecutionRoleArn=ROLE,
    )
    make_config(gateway.sm, name)
    gateway.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gateway.sm, name)
    for model, answer in (("a.tar.gz", "alpha"), ("b.tar.gz", "beta"), ("a.tar.gz", "alpha")):
        reply = gateway.rt.invoke_endpoint(EndpointName=name, TargetModel=model, Body=b"x")
        seen = json.loads(reply["Body"].read())
        assert seen["model"] == answer
        assert seen["url"].startswith("/opt/ml/models/")  # where the container sees it
    (container,) = ours(engine, name)
    assert "SAGEMAKER_MULTI_MODEL=true" in container.attrs["Config"]["Env"]
    mounts = container.attrs["Mounts"]
    assert [(m["Destination"], m["RW"]) for m in mounts] == [("/opt/ml/models", False)]
    with pytest.raises(gateway.rt.exceptions.ClientError) as missing:
        gateway.rt.invoke_endpoint(EndpointName=name, TargetModel="none.tar.gz", Body=b"x")
    assert "none.tar.gz" in str(missing.value)


def test_an_async_endpoint_and_a_batch_transform_of_an_image(
    gateway: GatewayProcess, engine: Engine, images: dict[str, str], artifact: str, tmp_path: Path
) -> None:
    name = unique("async")
    gateway.sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": images["v1"], "ModelDataUrl": artifact},
        ExecutionRoleArn=ROLE,
    )
    make_config(
        gateway.sm,
        name,
        AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}},
    )
    gateway.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gateway.sm, name)
    (tmp_path / "in.txt").write_text("async body")
    answer = gateway.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=(tmp_path / "in.txt").as_uri(), ContentType="text/plain"
    )
    output = Path(answer["OutputLocation"].removeprefix("file://"))
    wait_until(output.exists, "the async output", timeout_s=60)
    seen = json.loads(output.read_text())
    assert (seen["model"], seen["body"]) == ("42", "async body")

    # A transform's instances get the batch variables; the image's execution parameters
    # are asked for, and every record is scored.
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "rows.csv").write_text("a,b\nc,d\ne,f\n")
    job = unique("transform")
    gateway.sm.create_transform_job(
        TransformJobName=job,
        ModelName=name,
        TransformInput={
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": (tmp_path / "input").as_uri(),
                }
            },
            "ContentType": "text/csv",
            "SplitType": "Line",
        },
        TransformOutput={"S3OutputPath": (tmp_path / "scored").as_uri(), "AssembleWith": "Line"},
        TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
    )
    wait_until(
        lambda: (
            gateway.sm.describe_transform_job(TransformJobName=job)["TransformJobStatus"]
            in ("Completed", "Failed", "Stopped")
        ),
        "the transform",
        timeout_s=120,
    )
    described = gateway.sm.describe_transform_job(TransformJobName=job)
    assert described["TransformJobStatus"] == "Completed", described.get("FailureReason")
    scored = (tmp_path / "scored" / "rows.csv.out").read_text().split()
    assert scored == ["A,B", "C,D", "E,F"]
    wait_until(
        lambda: any(
            "GET /execution-parameters" in p.read_text() for p in gateway.home.glob("logs/**/*.log")
        ),
        "the execution parameters asked for, in the instance's log",
    )


def test_framework_image_uris_run_their_image_when_the_setting_says_so(
    gateway_factory: Callable[..., GatewayProcess],
    engine: Engine,
    images: dict[str, str],
    artifact: str,
) -> None:
    framework = "localhost/sagemaker-scikit-learn:1.2-1-cpu-py3"
    engine.client.images.get(images["v1"]).tag(*framework.rsplit(":", 1))
    gw = gateway_factory(extra_env={**engine.env, "SHIPYARD_FRAMEWORK_IMAGES": "container"})
    name = unique("framework")
    deploy(gw.sm, name, artifact, image=framework)
    assert invoke(gw, name)["argv"] == ["serve"]  # the image's server, not the built-in one
    assert len(ours(engine, name)) == 1
    with pytest.raises(RuntimeError, match="framework_images"):
        gateway_factory(extra_env={"SHIPYARD_FRAMEWORK_IMAGES": "sometimes"})


def test_a_serverless_endpoint_of_an_image(
    gateway: GatewayProcess, engine: Engine, images: dict[str, str], artifact: str
) -> None:
    name = unique("serverless")
    deploy(
        gateway.sm,
        name,
        artifact,
        image=images["v1"],
        variants=[
            {
                "VariantName": "v1",
                "ModelName": name,
                "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 2},
            }
        ],
    )
    assert invoke(gateway, name)["model"] == "42"
    (container,) = ours(engine, name)
    assert container.attrs["HostConfig"]["Memory"] == 2048 << 20  # MemorySizeInMB


def test_a_containers_cpu_and_memory_reach_cloudwatch(
    gateway_factory: Callable[..., GatewayProcess],
    engine: Engine,
    images: dict[str, str],
    artifact: str,
) -> None:
    gw = gateway_factory(extra_env={**engine.env, "SHIPYARD_METRICS_TICK_S": "1"})
    name = unique("metrics")
    deploy(gw.sm, name, artifact, image=images["v1"])
    invoke(gw, name)
    client = gw.client("cloudwatch")
    started = time.time()

    def stat(metric: str) -> float | None:
        points = client.get_metric_statistics(
            Namespace="/aws/sagemaker/Endpoints", MetricName=metric,
            Dimensions=[{"Name": "EndpointName", "Value": name},
                        {"Name": "VariantName", "Value": "v1"}],
            StartTime=started - 600, EndTime=time.time() + 60, Period=3600,
            Statistics=["Maximum"],
        )["Datapoints"]  # fmt: skip
        return float(points[0]["Maximum"]) if points else None

    wait_until(lambda: stat("MemoryUtilization") is not None, "MemoryUtilization", timeout_s=60)
    memory = stat("MemoryUtilization")
    assert memory is not None and 0 < memory < 100  # of ml.m5.large's 8 GiB
    wait_until(lambda: stat("CPUUtilization") is not None, "CPUUtilization", timeout_s=60)


def test_under_auth_a_containers_model_is_fetched_within_the_file_roots(
    gateway_factory: Callable[..., GatewayProcess],
    engine: Engine,
    images: dict[str, str],
    tmp_path: Path,
) -> None:
    from tests.e2e.test_auth import SECRETS, client, write_stack

    root = tmp_path / "root"
    (root / "model").mkdir(parents=True)
    (root / "model" / "answer.txt").write_text("42")
    (root / "links").mkdir()
    (tmp_path / "secret.txt").write_text("outside the roots")
    (root / "links" / "answer.txt").symlink_to(tmp_path / "secret.txt")
    stack = write_stack(
        tmp_path / "stack.yaml",
        file_roots=[str(root)],
        allow_images=["localhost/shipyard-test/echo:*"],
    )
    gw = gateway_factory(extra_env={**engine.env, **SECRETS}, args=["--config", str(stack)])
    sm, rt = client(gw, "sagemaker"), client(gw, "sagemaker-runtime")
    good, bad = unique("inside"), unique("link")
    deploy(sm, good, (root / "model").as_uri(), image=images["v1"])
    answer = rt.invoke_endpoint(EndpointName=good, Body=b"x", ContentType="text/plain")
    assert json.loads(answer["Body"].read())["model"] == "42"
    # The link passes CreateModel (its URL is inside); it is refused where it is opened.
    deploy(sm, bad, (root / "links").as_uri(), image=images["v1"], wait=False)
    wait_until(
        lambda: sm.describe_endpoint(EndpointName=bad)["EndpointStatus"] == "Failed",
        "the endpoint of the link failed",
        timeout_s=60,
    )
    reason = sm.describe_endpoint(EndpointName=bad)["FailureReason"]
    assert "outside" in reason and "outside the roots" not in reason, reason
    assert not ours(engine, bad, running=False)


def test_images_that_cannot_serve_fail_their_endpoint_with_the_reason(
    gateway_factory: Callable[..., GatewayProcess],
    engine: Engine,
    images: dict[str, str],
    artifact: str,
) -> None:
    gw = gateway_factory(extra_env={**engine.env, "SHIPYARD_INSTANCE_START_TIMEOUT_S": "6"})
    cases = {
        "localhost/shipyard-test/absent:1": "could not be pulled",
        images["exit"]: "ends at once, on purpose",
        images["noping"]: "did not pass the /ping health check within 6 s",
    }
    names = {}
    for image in cases:
        names[image] = unique("bad")
        deploy(gw.sm, names[image], artifact, image=image, wait=False)
    for image, reason in cases.items():
        wait_until(
            lambda n=names[image]: (
                gw.sm.describe_endpoint(EndpointName=n)["EndpointStatus"] == "Failed"
            ),
            f"{image} failed",
            timeout_s=60,
        )
        described = gw.sm.describe_endpoint(EndpointName=names[image])
        assert reason in described["FailureReason"], described["FailureReason"]
    assert not [c for n in names.values() for c in ours(engine, n)]


def test_a_restarted_gateway_removes_its_containers_and_no_one_elses(
    gateway_factory: Callable[..., GatewayProcess],
    engine: Engine,
    images: dict[str, str],
    artifact: str,
    tmp_path: Path,
) -> None:
    from docker.types import Ulimit

    from shipyard.backends.containers import host_ulimits

    foreign = engine.client.containers.run(
        images["v1"],
        ["serve"],
        detach=True,
        name=unique("foreign"),
        ulimits=[Ulimit(name=n, soft=v, hard=v) for n, v in host_ulimits().items()],
    )
    home = tmp_path / "home"
    gw = gateway_factory(home, extra_env=engine.env)
    name = unique("img")
    deploy(gw.sm, name, artifact, image=images["v1"])
    (before,) = ours(engine, name)

    # Killed, the gateway cannot stop its containers: the next one on its home does.
    gw.stop(signal.SIGKILL)
    assert before.id in {c.id for c in ours(engine, name)}
    gw = gateway_factory(home, extra_env=engine.env)
    wait_until(lambda: answered(gw, name), "the endpoint back", timeout_s=60)
    assert invoke(gw, name)["model"] == "42"
    (after,) = ours(engine, name, running=False)
    assert after.id != before.id

    # Stopped politely, it stops them; someone else's container is never touched.
    gw.stop()
    assert not ours(engine, name, running=False)
    foreign.reload()
    assert foreign.status == "running"
    foreign.remove(force=True)
