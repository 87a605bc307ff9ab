"""Training jobs in a training image, on a real engine: SageMaker's training
contract, checked through what images/train.py leaves in the model it uploads."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, unique, wait_until
from tests.containers.conftest import Engine, needs_engine
from tests.e2e.test_jobs import ENV, wait_final

pytestmark = needs_engine


@pytest.fixture(scope="module")
def image(engine: Engine) -> str:
    return engine.build("localhost/shipyard-test/train:1", script="train.py")


@pytest.fixture
def gateway(gateway_factory: Callable[..., GatewayProcess], engine: Engine) -> GatewayProcess:
    return gateway_factory(extra_env={**engine.env, **ENV})


def request(name: str, image: str, place: Path, **hps: str) -> dict[str, Any]:
    """A job on the two channels ``train`` and ``test`` under ``place``."""
    channels = []
    for channel, numbers in (("train", "1 2 3"), ("test", "10 20")):
        folder = place / "data" / channel
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "part-0.txt").write_text(numbers)
        source = {"S3DataType": "S3Prefix", "S3Uri": folder.as_uri()}
        channels.append({"ChannelName": channel, "DataSource": {"S3DataSource": source}})
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/x",
        "HyperParameters": hps,
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": (place / "out").as_uri()},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Environment": {"GREETING": "hi"},
    }


def model_of(job: dict[str, Any], place: Path) -> dict[str, Any]:
    artifact = Path(job["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("file://"))
    with tarfile.open(artifact) as tar:
        member = tar.extractfile("model.json")
        assert member is not None
        return dict(json.loads(member.read()))


def test_a_training_image_gets_its_channels_config_and_uploads_its_model(
    gateway: GatewayProcess, engine: Engine, image: str, tmp_path: Path
) -> None:
    name = unique("train")
    gateway.sm.create_training_job(**request(name, image, tmp_path, alpha="0.5", steps="2"))
    job = wait_final(gateway.sm, name, timeout_s=90)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    model = model_of(job, tmp_path)
    assert model["argv"] == ["train"]
    assert model["hyperparameters"] == {"alpha": "0.5", "steps": "2"}
    assert model["sums"] == {"train": 6.0, "test": 30.0}
    assert model["host"] == "algo-1"
    assert (model["job"], model["greeting"]) == (name, "hi")
    output = tmp_path / "out" / name / "output" / "output.tar.gz"
    with tarfile.open(output) as tar:
        assert "report.txt" in tar.getnames()
    # The container's output is the job's log, and the container is gone.
    log = next((gateway.home / "jobs" / name).glob("attempt-*/job.log")).read_text()
    assert "training done" in log
    assert not engine.containers(**{"dev.shipyard.job": name})


def test_network_isolation_leaves_a_training_container_no_network(
    gateway: GatewayProcess, image: str, tmp_path: Path
) -> None:
    isolated, open_ = unique("isolated"), unique("open")
    gateway.sm.create_training_job(
        **request(isolated, image, tmp_path / "a"), EnableNetworkIsolation=True
    )
    gateway.sm.create_training_job(**request(open_, image, tmp_path / "b"))
    interfaces = {}
    for name, place in ((isolated, tmp_path / "a"), (open_, tmp_path / "b")):
        job = wait_final(gateway.sm, name, timeout_s=90)
        assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
        interfaces[name] = model_of(job, place)["interfaces"]
    assert interfaces[isolated] == ["lo"]
    assert len(interfaces[open_]) > 1  # loopback and the engine's bridge


def test_a_failure_file_is_the_failure_reason_and_a_missing_image_says_so(
    gateway: GatewayProcess, image: str, tmp_path: Path
) -> None:
    failing = unique("fail")
    gateway.sm.create_training_job(**request(failing, image, tmp_path / "a", fail="row 7"))
    missing = unique("missing")
    gateway.sm.create_training_job(
        **request(missing, "localhost/shipyard-test/absent:1", tmp_path / "b")
    )
    job = wait_final(gateway.sm, failing, timeout_s=90)
    assert (job["TrainingJobStatus"], job["FailureReason"]) == ("Failed", "bad data: row 7")
    job = wait_final(gateway.sm, missing, timeout_s=90)
    assert job["TrainingJobStatus"] == "Failed"
    assert (
        "absent:1 is not on the container engine and could not be pulled" in (job["FailureReason"])
    )


def test_a_killed_container_is_retried_from_its_checkpoints(
    gateway: GatewayProcess, engine: Engine, image: str, tmp_path: Path
) -> None:
    name = unique("resume")
    # A LocalPath outside /opt/ml, where the image writes its checkpoints.
    job = request(name, image, tmp_path, steps="100", step_s="0.2", checkpoint_dir="/ckpt")
    checkpoints = tmp_path / "checkpoints"
    job["CheckpointConfig"] = {"S3Uri": checkpoints.as_uri(), "LocalPath": "/ckpt"}
    job["RetryStrategy"] = {"MaximumRetryAttempts": 1}
    gateway.sm.create_training_job(**job)

    def synced_step() -> int:
        try:
            return int((checkpoints / "step").read_text())
        except (OSError, ValueError):
            return 0

    wait_until(lambda: synced_step() >= 3, "a checkpoint synced", timeout_s=60)
    (container,) = [
        c for c in engine.containers(**{"dev.shipyard.job": name}) if c.status == "running"
    ]
    container.kill()
    described = wait_final(gateway.sm, name, timeout_s=120)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert model_of(described, tmp_path)["resumed_from"] >= 3
    secondary = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert "Restarting" in secondary


@pytest.mark.parametrize("exit_code", ["1", "0"])
def test_links_a_training_image_makes_lead_nowhere_on_the_host(
    gateway: GatewayProcess, image: str, tmp_path: Path, exit_code: str
) -> None:
    secret = tmp_path / "host" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("host secret")
    name = unique("hostile")
    job = request(name, image, tmp_path, hostile=str(secret), exit=exit_code)
    job["CheckpointConfig"] = {"S3Uri": (tmp_path / "checkpoints").as_uri()}
    gateway.sm.create_training_job(**job)
    described = wait_final(gateway.sm, name, timeout_s=90)
    assert described["TrainingJobStatus"] == "Failed"
    assert "host secret" not in described["FailureReason"]
    if exit_code == "0":  # a model folder that is a link is not uploaded
        assert "model is a link" in described["FailureReason"]
    else:
        assert described["FailureReason"].startswith("AlgorithmError: ExitCode 1")
    uploaded = [
        path
        for where in (tmp_path / "out", tmp_path / "checkpoints")
        for path in where.rglob("*")
        if path.is_file()
    ]
    assert uploaded or exit_code == "0"  # output.tar.gz of the failed one
    for path in uploaded:
        if path.suffix == ".gz":
            with tarfile.open(path) as tar:
                assert "secret.txt" not in tar.getnames(), path
        else:
            assert b"host secret" not in path.read_bytes(), path
    assert not (tmp_path / "checkpoints" / "leak").exists()
    assert not (tmp_path / "checkpoints" / "secret.txt").exists()


def test_container_entrypoint_and_arguments_replace_train(
    gateway: GatewayProcess, image: str, tmp_path: Path
) -> None:
    name = unique("entry")
    job = request(name, image, tmp_path)
    job["AlgorithmSpecification"]["ContainerEntrypoint"] = [
        "python3",
        "/opt/program/train.py",
    ]
    job["AlgorithmSpecification"]["ContainerArguments"] = ["fit", "--fast"]
    gateway.sm.create_training_job(**job)
    described = wait_final(gateway.sm, name, timeout_s=90)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert model_of(described, tmp_path)["argv"] == ["fit", "--fast"]


def test_under_auth_a_training_image_runs_and_its_runner_keeps_to_the_file_roots(
    gateway_factory: Callable[..., GatewayProcess], engine: Engine, image: str, tmp_path: Path
) -> None:
    from tests.e2e.test_auth import SECRETS, client, write_stack

    root = tmp_path / "root"
    root.mkdir()
    stack = write_stack(  # sandbox: true, as with every auth: section by default
        tmp_path / "stack.yaml",
        file_roots=[str(root)],
        allow_environment=["GREETING"],
        allow_images=["localhost/shipyard-test/*"],
    )
    gw = gateway_factory(extra_env={**engine.env, **ENV, **SECRETS}, args=["--config", str(stack)])
    sm = client(gw, "sagemaker")
    name = unique("authed")
    sm.create_training_job(**request(name, image, root, steps="1"))
    job = wait_final(sm, name, timeout_s=90)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    assert model_of(job, root)["sums"] == {"train": 6.0, "test": 30.0}

    # A channel whose folder holds a link out of the roots: refused where it is read.
    (tmp_path / "secret.txt").write_text("1000")
    linked = request(unique("linked"), image, root / "linked")
    (root / "linked" / "data" / "train" / "part-1.txt").symlink_to(tmp_path / "secret.txt")
    sm.create_training_job(**linked)
    job = wait_final(sm, linked["TrainingJobName"], timeout_s=90)
    assert job["TrainingJobStatus"] == "Failed"
    assert "file_roots" in job["FailureReason"] or "outside" in job["FailureReason"]


def test_a_framework_training_image_finds_its_submit_directory_in_the_container(
    gateway_factory: Callable[..., GatewayProcess], engine: Engine, image: str, tmp_path: Path
) -> None:
    framework = "localhost/sagemaker-scikit-learn:1.2-1-cpu-py3-train"
    engine.client.images.get(image).tag(*framework.rsplit(":", 1))
    gw = gateway_factory(extra_env={**engine.env, **ENV, "SHIPYARD_FRAMEWORK_IMAGES": "container"})
    code = tmp_path / "code"
    code.mkdir()
    (code / "entry.py").write_text("print('the script')\n")
    name = unique("framework")
    # The sagemaker SDK's script mode: the code's location, JSON-encoded.
    gw.sm.create_training_job(
        **request(
            name,
            framework,
            tmp_path,
            sagemaker_program='"entry.py"',
            sagemaker_submit_directory=json.dumps(code.as_uri()),
        )
    )
    job = wait_final(gw.sm, name, timeout_s=90)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    model = model_of(job, tmp_path)
    assert model["hyperparameters"]["sagemaker_submit_directory"] == '"/opt/ml/code"'
    assert "entry.py" in model["code"]
