"""Long-running jobs end to end: boto3's CreateTrainingJob family against a real gateway,
real runner processes and real files."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, unique, wait_until

CODE = Path(__file__).parent / "job_code"
FINAL = ("Completed", "Failed", "Stopped")
ENV = {"SHIPYARD_JOB_POLL_PERIOD_S": "0.2", "SHIPYARD_JOB_STOP_GRACE_S": "5"}


def job_request(name: str, out: Path, data: Path | None = None, **hps: str) -> dict[str, Any]:
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": "shipyard/python", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/x",
        "HyperParameters": {
            "sagemaker_program": "infer.py",
            "sagemaker_submit_directory": CODE.as_uri(),
            **hps,
        },
        "OutputDataConfig": {"S3OutputPath": out.as_uri()},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {},
    }
    if data is not None:
        request["InputDataConfig"] = [
            {
                "ChannelName": "data",
                "DataSource": {"S3DataSource": {"S3Uri": data.as_uri(), "S3DataType": "S3Prefix"}},
            }
        ]
    return request


def wait_final(sm: Any, name: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = sm.describe_training_job(TrainingJobName=name)
        if job["TrainingJobStatus"] in FINAL:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {name} did not end: {job['TrainingJobStatus']}")


def wait_secondary(sm: Any, name: str, status: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sm.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {name} never reached {status}")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "part").mkdir(parents=True)
    (data / "a.txt").write_text("1 2 3")
    (data / "part" / "b.txt").write_text("4")
    return data


@pytest.fixture
def jobs_gateway(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory(extra_env=ENV)


def test_a_script_mode_job_runs_to_completion_and_uploads_its_model(
    jobs_gateway: GatewayProcess, tmp_path: Path, data_dir: Path
) -> None:
    sm = jobs_gateway.sm
    name = unique("ok")
    out = tmp_path / "out"
    arn = sm.create_training_job(**job_request(name, out, data_dir, mode="ok"))["TrainingJobArn"]
    assert arn.endswith(f"training-job/{name}")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    job = sm.describe_training_job(TrainingJobName=name)
    assert job["TrainingJobStatus"] == "Completed"
    assert job["SecondaryStatus"] == "Completed"
    steps = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert steps == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    assert all("EndTime" in t for t in job["SecondaryStatusTransitions"])
    assert job["TrainingStartTime"] <= job["TrainingEndTime"]
    model = out / name / "output" / "model.tar.gz"
    assert job["ModelArtifacts"]["S3ModelArtifacts"] == model.as_uri()
    with tarfile.open(model) as tar:
        assert json.load(tar.extractfile("result.json")) == {"total": 10.0}  # type: ignore[arg-type]
    with tarfile.open(out / name / "output" / "output.tar.gz") as tar:
        assert tar.extractfile("summary.txt").read() == b"total 10.0\n"  # type: ignore[union-attr]
    assert job["HyperParameters"]["mode"] == "ok"
    listed = sm.list_training_jobs(NameContains=name)["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in listed] == [name]
    status, log = jobs_gateway.get(f"/jobs/{name}/logs")
    assert status == 200 and b"total 10.0" in log


def test_a_failing_job_reports_the_failure_file_or_the_traceback(
    jobs_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = jobs_gateway.sm
    with_file, with_traceback = unique("fail"), unique("crash")
    sm.create_training_job(**job_request(with_file, tmp_path / "out", mode="fail"))
    sm.create_training_job(**job_request(with_traceback, tmp_path / "out", mode="crash"))
    job = wait_final(sm, with_file)
    assert job["TrainingJobStatus"] == "Failed"
    assert "bad input: the data channel is empty" in job["FailureReason"]
    job = wait_final(sm, with_traceback)
    assert job["TrainingJobStatus"] == "Failed"
    assert "RuntimeError: the model exploded" in job["FailureReason"]
    assert job["SecondaryStatusTransitions"][-1]["Status"] == "Failed"


def test_a_stopped_job_gets_sigterm_saves_its_model_and_ends_stopped(
    jobs_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = jobs_gateway.sm
    name = unique("stop")
    out = tmp_path / "out"
    sm.create_training_job(**job_request(name, out, mode="sleep", seconds="60"))
    wait_secondary(sm, name, "Training")
    log = jobs_gateway.home / "jobs" / name / "attempt-1" / "job.log"
    # The script prints "sleeping" once its SIGTERM handler is in place.
    wait_until(lambda: log.exists() and "sleeping" in log.read_text(), "the script's handler")
    sm.stop_training_job(TrainingJobName=name)
    assert sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] in (
        "Stopping",
        "Stopped",
    )
    job = wait_final(sm, name)
    assert job["TrainingJobStatus"] == "Stopped"
    assert "Stopping" in [t["Status"] for t in job["SecondaryStatusTransitions"]]
    with tarfile.open(out / name / "output" / "model.tar.gz") as tar:
        assert "stopped.json" in tar.getnames()
    with pytest.raises(ClientError) as err:
        sm.stop_training_job(TrainingJobName=name)
    assert err.value.response["Error"]["Code"] == "ValidationException"


def test_max_runtime_stops_the_job_with_max_runtime_exceeded(
    jobs_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = jobs_gateway.sm
    name = unique("maxrt")
    request = job_request(name, tmp_path / "out", mode="sleep", seconds="60")
    request["StoppingCondition"] = {"MaxRuntimeInSeconds": 2}
    sm.create_training_job(**request)
    job = wait_final(sm, name)
    assert job["TrainingJobStatus"] == "Stopped"
    assert job["SecondaryStatus"] == "MaxRuntimeExceeded"


def test_unknown_jobs_and_unrunnable_requests_get_sagemaker_errors(
    jobs_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = jobs_gateway.sm
    with pytest.raises(ClientError) as err:
        sm.describe_training_job(TrainingJobName="nope")
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "Requested resource not found" in err.value.response["Error"]["Message"]
    request = job_request(unique("img"), tmp_path / "out")
    request["AlgorithmSpecification"]["TrainingImage"] = "123.dkr.ecr.us-east-1.amazonaws.com/x:1"
    sm.create_training_job(**request)  # a training image: it fails where no engine answers
    job = wait_final(sm, request["TrainingJobName"])
    assert job["TrainingJobStatus"] == "Failed"
    assert "No container engine answers" in job["FailureReason"]
    request = job_request(unique("noprog"), tmp_path / "out")
    del request["HyperParameters"]["sagemaker_program"]
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**request)
    assert "sagemaker_program" in err.value.response["Error"]["Message"]


def test_create_beyond_the_limit_is_resource_limit_exceeded(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env={**ENV, "SHIPYARD_MAX_ACTIVE_JOBS": "1"})
    sm = gw.sm
    first = unique("first")
    sm.create_training_job(**job_request(first, tmp_path / "out", mode="sleep", seconds="60"))
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**job_request(unique("second"), tmp_path / "out"))
    assert err.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    name = unique("dup")
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**job_request(first, tmp_path / "out"))
    assert err.value.response["Error"]["Code"] in ("ResourceInUse", "ResourceLimitExceeded")
    sm.stop_training_job(TrainingJobName=first)
    wait_final(sm, first)
    sm.create_training_job(**job_request(name, tmp_path / "out", mode="fail"))
    assert wait_final(sm, name)["TrainingJobStatus"] == "Failed"


def test_a_job_keeps_running_across_a_gateway_restart(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    gw = gateway_factory(home, extra_env=ENV)
    name = unique("survive")
    gw.sm.create_training_job(**job_request(name, tmp_path / "out", mode="steps", steps="15"))
    wait_secondary(gw.sm, name, "Training")
    gw.stop(signal.SIGKILL)
    log = home / "jobs" / name / "attempt-1" / "job.log"
    size = log.stat().st_size
    wait_until(lambda: log.stat().st_size > size, "the job going on with no gateway")
    again = gateway_factory(home, extra_env=ENV)
    job = wait_final(again.sm, name)
    assert job["TrainingJobStatus"] == "Completed"
    with tarfile.open(tmp_path / "out" / name / "output" / "model.tar.gz") as tar:
        assert json.load(tar.extractfile("result.json")) == {"resumed_from": 0}  # type: ignore[arg-type]


def test_a_running_job_whose_handle_the_store_lacks_is_adopted_without_repeating_its_history(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """A gateway upgraded past migration 0005 (PIDs dropped for handles) finds a job that
    was running without a handle: it adopts the runner from the job's folder, and the
    status lines already recorded are not recorded a second time."""
    home = tmp_path / "home"
    gw = gateway_factory(home, extra_env=ENV)
    name = unique("adopt")
    gw.sm.create_training_job(**job_request(name, tmp_path / "out", mode="steps", steps="15"))
    wait_secondary(gw.sm, name, "Training")
    gw.stop(signal.SIGKILL)
    with sqlite3.connect(home / "shipyard.db") as db:
        db.execute("UPDATE jobs SET runner = NULL WHERE name = ?", (name,))
    runner_pid = int((home / "jobs" / name / "attempt-1" / "runner.pid").read_text())
    again = gateway_factory(home, extra_env=ENV)
    job = wait_final(again.sm, name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    statuses = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert statuses == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    with sqlite3.connect(home / "shipyard.db") as db:
        (runner,) = db.execute("SELECT runner FROM jobs WHERE name = ?", (name,)).fetchone()
    assert runner.startswith(f"local:{runner_pid}:")


def _kill_runner(gw: GatewayProcess, name: str, attempt: int = 1) -> None:
    workdir = gw.home / "jobs" / name / f"attempt-{attempt}"
    # "Training" is told just before the script starts and its PID file is written
    # (whole, by a rename).
    script = workdir / "script.pid"
    wait_until(script.exists, "the script started", timeout_s=30)
    for pid_file in ("runner.pid", "script.pid"):
        os.killpg(int((workdir / pid_file).read_text()), signal.SIGKILL)


def test_a_lost_job_resumes_from_its_checkpoint_when_its_retry_strategy_allows(
    jobs_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = jobs_gateway.sm
    name = unique("resume")
    request = job_request(name, tmp_path / "out", mode="steps", steps="40")
    request["CheckpointConfig"] = {"S3Uri": (tmp_path / "ckpt").as_uri()}
    request["RetryStrategy"] = {"MaximumRetryAttempts": 1}
    sm.create_training_job(**request)
    synced = tmp_path / "ckpt" / "step.txt"
    deadline = time.monotonic() + 30
    while not synced.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert synced.exists(), "no checkpoint was synced"
    _kill_runner(jobs_gateway, name)
    job = wait_final(sm, name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    assert "Restarting" in [t["Status"] for t in job["SecondaryStatusTransitions"]]
    with tarfile.open(tmp_path / "out" / name / "output" / "model.tar.gz") as tar:
        resumed = json.load(tar.extractfile("result.json"))["resumed_from"]  # type: ignore[arg-type]
    assert resumed > 0


def test_a_lost_job_without_retry_strategy_fails_with_a_reason(
    jobs_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = jobs_gateway.sm
    name = unique("lost")
    sm.create_training_job(**job_request(name, tmp_path / "out", mode="sleep", seconds="60"))
    wait_secondary(sm, name, "Training")
    _kill_runner(jobs_gateway, name)
    job = wait_final(sm, name)
    assert job["TrainingJobStatus"] == "Failed"
    assert "no RetryStrategy" in job["FailureReason"]
