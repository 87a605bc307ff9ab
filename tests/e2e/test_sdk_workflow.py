"""The sagemaker SDK v2, unchanged, end to end against a real gateway and a moto S3:
an SKLearn estimator's fit() with its logs, estimator.deploy, a MultiDataModel, an
AsyncPredictor, a serverless endpoint and a Transformer, reached through the
AWS_ENDPOINT_URL_* variables alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import MODELS, Bucket, GatewayProcess

SCRIPT = Path(__file__).with_name("sdk_workflow.py")


def sdk_env(gw: GatewayProcess, bucket: Bucket, tmp_path: Path) -> dict[str, str]:
    """The environment of a process running the SDK against ``gw`` and ``bucket`` only."""
    config = tmp_path / "sagemaker.yaml"
    config.write_text(  # the SDK would otherwise send telemetry to AWS
        "SchemaVersion: '1.0'\n"
        "SageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
    )
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_SAGEMAKER": gw.url,
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": gw.url,
        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": gw.url,
        "AWS_ENDPOINT_URL_S3": bucket.endpoint_url,
        "AWS_ENDPOINT_URL_STS": bucket.endpoint_url,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
    }


@pytest.mark.timeout(300)
def test_fit_deploy_multi_model_and_async_with_the_sdk(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    gw = gateway_factory(
        extra_env={
            "SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url,
            "SHIPYARD_JOB_POLL_PERIOD_S": "0.2",
            "SHIPYARD_ACCOUNT_ID": "123456789012",  # what moto's STS tells the SDK
        }
    )
    bucket.put("data/part-1.txt", b"1 2")
    env = sdk_env(gw, bucket, tmp_path)
    argv = [sys.executable, str(SCRIPT), bucket.name, str(MODELS / "sdk_sklearn")]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=280)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    lines = {line.split(" ", 1)[0]: line for line in out.stdout.splitlines() if " " in line}
    assert "trained factor 3.0" in out.stdout  # fit() printed the job's own log
    assert json.loads(lines["REALTIME"].split(" ", 1)[1]) == [9.0]
    assert json.loads(lines["MME"].split(" ", 1)[1]) == [9.0]
    assert json.loads(lines["ASYNC"].split(" ", 1)[1]) == [21.0]
    assert json.loads(lines["SERVERLESS"].split(" ", 1)[1]) == [15.0]
    assert json.loads(lines["TRANSFORM"].split(" ", 1)[1]) == [9.0, 21.0]
