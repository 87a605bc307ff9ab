"""Processing jobs under ``auth:``: held to the file roots, the commands allowed and the
sandbox, as training jobs are; the script still finds its files at /opt/ml."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, start_gateway, stop_job_processes, unique
from tests.e2e.test_auth import SECRETS, client, write_stack
from tests.e2e.test_processing_jobs import ENV, SKLEARN, wait_final

CODE = Path(__file__).parent / "processing_code"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("processing-guards")
    root = base / "root"
    shutil.copytree(CODE, root / "code")
    (root / "data").mkdir()
    (root / "data" / "inside.txt").write_text("granted data")
    (base / "secret.txt").write_text("not for jobs")
    return base


@pytest.fixture(scope="module")
def guarded(place: Path) -> Iterator[GatewayProcess]:
    stack = write_stack(place / "stack.yaml", file_roots=[str(place / "root")])
    gw = start_gateway(place / "home", extra_env={**SECRETS, **ENV}, args=["--config", str(stack)])
    try:
        yield gw
    finally:
        gw.stop()
        stop_job_processes(gw.home)


def probe_request(name: str, place: Path, gw: GatewayProcess, **changes: Any) -> dict[str, Any]:
    root = place / "root"
    request: dict[str, Any] = {
        "ProcessingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/x",
        "AppSpecification": {
            "ImageUri": SKLEARN,
            "ContainerEntrypoint": ["python3", "/opt/ml/processing/input/code/probe.py"],
        },
        "ProcessingInputs": [
            {
                "InputName": "code",
                "S3Input": {
                    "S3Uri": (root / "code" / "probe.py").as_uri(),
                    "LocalPath": "/opt/ml/processing/input/code",
                    "S3DataType": "S3Prefix",
                    "S3InputMode": "File",
                },
            },
            {
                "InputName": "data",
                "S3Input": {
                    "S3Uri": changes.pop("data", (root / "data").as_uri()),
                    "LocalPath": "/opt/ml/processing/input/data",
                    "S3DataType": "S3Prefix",
                    "S3InputMode": "File",
                },
            },
        ],
        "ProcessingOutputConfig": {
            "Outputs": [
                {
                    "OutputName": "report",
                    "S3Output": {
                        "S3Uri": (root / "out" / name).as_uri(),
                        "LocalPath": "/opt/ml/processing/output/report",
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
        "Environment": {
            "SM_SECRET": str(place / "secret.txt"),
            "SM_STORE": str(gw.home / "shipyard.db"),
        },
    }
    request["AppSpecification"].update(changes)
    return request


def test_a_sandboxed_job_sees_its_opt_ml_and_its_roots_only(
    guarded: GatewayProcess, place: Path
) -> None:
    sm, name = client(guarded, "sagemaker"), unique("probe")
    sm.create_processing_job(**probe_request(name, place, guarded))

    job = wait_final(sm, name)

    assert job["ProcessingJobStatus"] == "Completed", job.get("FailureReason")
    report = json.loads((place / "root" / "out" / name / "report.json").read_text())
    assert report["data"] == "granted data"
    assert report["secret"] is False
    assert report["store"] is False


def refusal(guarded: GatewayProcess, request: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ClientError) as caught:
        client(guarded, "sagemaker").create_processing_job(**request)
    return caught.value.response["Error"]["Code"], caught.value.response["Error"]["Message"]


def test_an_input_outside_the_file_roots_is_refused_naming_it(
    guarded: GatewayProcess, place: Path
) -> None:
    request = probe_request(unique("probe"), place, guarded, data=(place / "secret.txt").as_uri())

    code, message = refusal(guarded, request)

    assert code == "ValidationException"
    assert "ProcessingInputs.2.S3Input.S3Uri" in message and "auth.file_roots" in message


def test_a_command_other_than_python_on_its_own_script_is_refused(
    guarded: GatewayProcess, place: Path
) -> None:
    request = probe_request(
        unique("probe"), place, guarded, ContainerEntrypoint=["/bin/sh", "-c", "id"]
    )

    code, message = refusal(guarded, request)

    assert code == "ValidationException"
    assert "ContainerEntrypoint" in message


def test_the_analyzer_runs_sandboxed_with_its_own_settings(
    guarded: GatewayProcess, place: Path
) -> None:
    sm, name = client(guarded, "sagemaker"), unique("baseline")
    root = place / "root"
    (root / "baseline").mkdir(exist_ok=True)
    rows = ["label,a"] + [f"{i % 2},{i}" for i in range(50)]
    (root / "baseline" / "train.csv").write_text("\n".join(rows) + "\n")
    sm.create_processing_job(
        ProcessingJobName=name,
        RoleArn="arn:aws:iam::123456789012:role/x",
        AppSpecification={
            "ImageUri": "156813124566.dkr.ecr.us-east-1.amazonaws.com/"
            "sagemaker-model-monitor-analyzer"
        },
        ProcessingInputs=[
            {
                "InputName": "baseline_dataset_input",
                "S3Input": {
                    "S3Uri": (root / "baseline").as_uri(),
                    "LocalPath": "/opt/ml/processing/input/baseline_dataset_input",
                    "S3DataType": "S3Prefix",
                    "S3InputMode": "File",
                },
            }
        ],
        ProcessingOutputConfig={
            "Outputs": [
                {
                    "OutputName": "monitoring_output",
                    "S3Output": {
                        "S3Uri": (root / "out" / name).as_uri(),
                        "LocalPath": "/opt/ml/processing/output",
                        "S3UploadMode": "EndOfJob",
                    },
                }
            ]
        },
        ProcessingResources={
            "ClusterConfig": {
                "InstanceCount": 1,
                "InstanceType": "ml.m5.large",
                "VolumeSizeInGB": 1,
            }
        },
        Environment={
            "dataset_format": json.dumps({"csv": {"header": True}}),
            "dataset_source": "/opt/ml/processing/input/baseline_dataset_input",
            "output_path": "/opt/ml/processing/output",
            "publish_cloudwatch_metrics": "Disabled",
        },
    )

    job = wait_final(sm, name)

    assert job["ProcessingJobStatus"] == "Completed", job.get("FailureReason")
    constraints = json.loads((root / "out" / name / "constraints.json").read_text())
    assert [f["name"] for f in constraints["features"]] == ["label", "a"]
