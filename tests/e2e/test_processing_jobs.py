"""Processing jobs end to end: boto3's CreateProcessingJob family against a real gateway,
real runner processes, bubblewrap's private /opt/ml and real files."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, unique, wait_until

CODE = Path(__file__).parent / "processing_code"
FINAL = ("Completed", "Failed", "Stopped")
ENV = {"SHIPYARD_JOB_POLL_PERIOD_S": "0.2", "SHIPYARD_JOB_STOP_GRACE_S": "5"}
SKLEARN = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def processing_request(
    name: str, data: Path, out: Path, *arguments: str, environment: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "ProcessingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/x",
        "AppSpecification": {
            "ImageUri": SKLEARN,
            "ContainerEntrypoint": ["python3", "/opt/ml/processing/input/code/prepare.py"],
            **({"ContainerArguments": list(arguments)} if arguments else {}),
        },
        "ProcessingInputs": [
            {
                "InputName": "code",
                "S3Input": {
                    "S3Uri": (CODE / "prepare.py").as_uri(),
                    "LocalPath": "/opt/ml/processing/input/code",
                    "S3DataType": "S3Prefix",
                    "S3InputMode": "File",
                },
            },
            {
                "InputName": "data",
                "S3Input": {
                    "S3Uri": data.as_uri(),
                    "LocalPath": "/opt/ml/processing/input/data",
                    "S3DataType": "S3Prefix",
                    "S3InputMode": "File",
                },
            },
        ],
        "ProcessingOutputConfig": {
            "Outputs": [
                {
                    "OutputName": "train",
                    "S3Output": {
                        "S3Uri": out.as_uri(),
                        "LocalPath": "/opt/ml/processing/output/train",
                        "S3UploadMode": "EndOfJob",
                    },
                }
            ]
        },
        "ProcessingResources": {
            "ClusterConfig": {
                "InstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "VolumeSizeInGB": 1,
            }
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Environment": environment or {"GREETING": "hello"},
    }


def wait_final(sm: Any, name: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = sm.describe_processing_job(ProcessingJobName=name)
        if job["ProcessingJobStatus"] in FINAL:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {name} did not end: {job['ProcessingJobStatus']}")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "part").mkdir(parents=True)
    (data / "a.txt").write_text("1 2 3")
    (data / "part" / "b.txt").write_text("4")
    return data


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory(extra_env=ENV)


def test_a_script_that_hard_codes_opt_ml_runs_and_its_outputs_are_uploaded(
    gw: GatewayProcess, data_dir: Path, tmp_path: Path
) -> None:
    name, out = unique("proc"), tmp_path / "out"
    request = processing_request(name, data_dir, out)
    arn = gw.sm.create_processing_job(**request)["ProcessingJobArn"]
    assert arn.startswith("arn:aws:sagemaker:us-east-1:")
    assert arn.endswith(f":processing-job/{name}")

    job = wait_final(gw.sm, name)

    assert job["ProcessingJobStatus"] == "Completed", job.get("FailureReason")
    assert job["ExitMessage"] == "done: 10"
    assert job["AppSpecification"] == request["AppSpecification"]
    assert job["ProcessingInputs"][1]["S3Input"]["S3Uri"] == data_dir.as_uri()
    assert job["ProcessingStartTime"] <= job["ProcessingEndTime"]
    assert (out / "total.txt").read_text() == "10"
    assert (out / "name.txt").read_text() == name
    environment = json.loads((out / "nested" / "env.json").read_text())
    assert environment["GREETING"] == "hello"
    assert "SHIPYARD_HOME" not in environment and "AWS_SECRET_ACCESS_KEY" not in environment
    summaries = gw.sm.list_processing_jobs(NameContains=name)["ProcessingJobSummaries"]
    assert [(s["ProcessingJobName"], s["ProcessingJobStatus"]) for s in summaries] == [
        (name, "Completed")
    ]
    logs = gw.client("logs")
    streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/ProcessingJobs")
    stream = next(s for s in streams["logStreams"] if s["logStreamName"].startswith(name + "/"))
    events = logs.get_log_events(
        logGroupName="/aws/sagemaker/ProcessingJobs", logStreamName=stream["logStreamName"]
    )["events"]
    assert "total 10" in [e["message"] for e in events]


def test_a_failing_script_fails_with_its_exit_code_and_stderr_and_uploads_nothing(
    gw: GatewayProcess, data_dir: Path, tmp_path: Path
) -> None:
    name, out = unique("proc"), tmp_path / "out"
    gw.sm.create_processing_job(**processing_request(name, data_dir, out, "--fail"))

    job = wait_final(gw.sm, name)

    assert job["ProcessingJobStatus"] == "Failed"
    assert job["FailureReason"].startswith("AlgorithmError: ExitCode 3")
    assert "something broke" in job["FailureReason"]
    assert job["ExitMessage"] == "gave up"
    assert not out.exists()


def test_a_stopped_job_ends_stopped_once_its_script_has_exited(
    gw: GatewayProcess, data_dir: Path, tmp_path: Path
) -> None:
    name, out = unique("proc"), tmp_path / "out"
    gw.sm.create_processing_job(**processing_request(name, data_dir, out, "--sleep", "300"))
    log = gw.home / "processing" / name / "attempt-1" / "job.log"
    wait_until(lambda: log.exists() and "sleeping" in log.read_text(), "the script to start")

    gw.sm.stop_processing_job(ProcessingJobName=name)

    job = wait_final(gw.sm, name, timeout_s=30)
    assert job["ProcessingJobStatus"] == "Stopped"
    assert not out.exists()
    with pytest.raises(ClientError) as stopped_again:
        gw.sm.stop_processing_job(ProcessingJobName=name)
    assert stopped_again.value.response["Error"]["Code"] == "ValidationException"
    assert name in stopped_again.value.response["Error"]["Message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda r: r["ProcessingInputs"][1]["S3Input"].update(LocalPath="/tmp/data"),
            "ProcessingInputs.2.S3Input.LocalPath",
        ),
        (
            lambda r: r["ProcessingInputs"][1]["S3Input"].update(
                LocalPath="/opt/ml/processing/input/code/data"
            ),
            "ProcessingInputs.2.S3Input.LocalPath",
        ),
        (
            lambda r: r["ProcessingInputs"][1]["S3Input"].update(S3InputMode="Pipe"),
            "ProcessingInputs.2.S3Input.S3InputMode",
        ),
        (
            lambda r: r["ProcessingResources"]["ClusterConfig"].update(InstanceCount=2),
            "InstanceCount",
        ),
        (lambda r: r["AppSpecification"].pop("ContainerEntrypoint"), "ContainerEntrypoint"),
    ],
)
def test_what_cannot_run_is_refused_naming_the_field(
    gw: GatewayProcess,
    data_dir: Path,
    tmp_path: Path,
    change: Callable[[dict[str, Any]], object],
    field: str,
) -> None:
    request = processing_request(unique("proc"), data_dir, tmp_path / "out")
    change(request)

    with pytest.raises(ClientError) as refused:
        gw.sm.create_processing_job(**request)

    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert field in refused.value.response["Error"]["Message"]


def test_a_taken_name_is_in_use_and_an_unknown_job_is_named(
    gw: GatewayProcess, data_dir: Path, tmp_path: Path
) -> None:
    name = unique("proc")
    gw.sm.create_processing_job(**processing_request(name, data_dir, tmp_path / "out"))

    with pytest.raises(ClientError) as taken:
        gw.sm.create_processing_job(**processing_request(name, data_dir, tmp_path / "out"))
    with pytest.raises(ClientError) as unknown:
        gw.sm.describe_processing_job(ProcessingJobName="no-such-job")

    assert taken.value.response["Error"]["Code"] == "ResourceInUse"
    assert name in taken.value.response["Error"]["Message"]
    assert unknown.value.response["Error"]["Code"] == "ValidationException"
    assert "no-such-job" in unknown.value.response["Error"]["Message"]
    wait_final(gw.sm, name)


def test_a_job_running_across_a_gateway_restart_completes_as_the_same_job(
    gateway_factory: Callable[..., GatewayProcess], data_dir: Path, tmp_path: Path
) -> None:
    first = gateway_factory(extra_env=ENV)
    name, out = unique("proc"), tmp_path / "out"
    first.sm.create_processing_job(**processing_request(name, data_dir, out, "--sleep", "4"))
    log = first.home / "processing" / name / "attempt-1" / "job.log"
    wait_until(lambda: log.exists() and "sleeping" in log.read_text(), "the script to start")

    assert first.stop() in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    second = gateway_factory(home=first.home, extra_env=ENV)

    job = wait_final(second.sm, name)
    assert job["ProcessingJobStatus"] == "Completed", job.get("FailureReason")
    assert (out / "total.txt").read_text() == "10"
    assert log.read_text().count("Started the job") == 1


def test_a_job_past_its_max_runtime_is_stopped(
    gw: GatewayProcess, data_dir: Path, tmp_path: Path
) -> None:
    name, out = unique("proc"), tmp_path / "out"
    request = processing_request(name, data_dir, out, "--sleep", "300")
    request["StoppingCondition"] = {"MaxRuntimeInSeconds": 2}

    gw.sm.create_processing_job(**request)

    job = wait_final(gw.sm, name, timeout_s=30)
    assert job["ProcessingJobStatus"] == "Stopped"
    assert not out.exists()
