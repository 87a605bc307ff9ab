"""CloudWatch Logs' calls on the gateway: job and instance logs for boto3's ``logs``
client, ``aws logs tail`` and the sagemaker SDK's ``logs_for_job``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, unique
from tests.e2e.test_jobs import ENV, job_request, wait_final

GROUP = "/aws/sagemaker/TrainingJobs"


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory(extra_env=ENV)


def _finished_job(gw: GatewayProcess, tmp_path: Path) -> str:
    data = tmp_path / "data"
    data.mkdir()
    (data / "n.txt").write_text("1 2 3")
    name = unique("logged")
    gw.sm.create_training_job(**job_request(name, tmp_path / "out", data))
    assert wait_final(gw.sm, name)["TrainingJobStatus"] == "Completed"
    return name


def test_a_jobs_log_is_a_stream_of_the_training_jobs_group(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    name = _finished_job(gw, tmp_path)
    logs = gw.client("logs")
    streams = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=name + "/")
    [stream] = streams["logStreams"]
    assert stream["logStreamName"].startswith(f"{name}/algo-1-")
    first = logs.get_log_events(
        logGroupName=GROUP, logStreamName=stream["logStreamName"], startFromHead=True, limit=2
    )
    rest = logs.get_log_events(
        logGroupName=GROUP,
        logStreamName=stream["logStreamName"],
        startFromHead=True,
        nextToken=first["nextForwardToken"],
    )
    messages = [e["message"] for e in first["events"] + rest["events"]]
    assert len(first["events"]) == 2
    assert "total 6.0" in messages  # the script's own print, once, in order
    assert messages.count("total 6.0") == 1
    again = logs.get_log_events(
        logGroupName=GROUP,
        logStreamName=stream["logStreamName"],
        nextToken=rest["nextForwardToken"],
    )
    assert again["events"] == []  # nothing new: a follower waits, it does not repeat


def test_unknown_groups_and_streams_are_resource_not_found(gw: GatewayProcess) -> None:
    logs = gw.client("logs")
    with pytest.raises(ClientError) as missing:
        logs.describe_log_streams(logGroupName="/aws/sagemaker/Endpoints/nope")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    with pytest.raises(ClientError) as missing:
        logs.get_log_events(logGroupName=GROUP, logStreamName="nope/algo-1-1")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_instance_logs_are_streams_of_the_endpoints_group(
    gw: GatewayProcess, model_tarball: Any
) -> None:
    deploy(gw.sm, "shown", model_tarball("echo"))
    logs = gw.client("logs")
    group = "/aws/sagemaker/Endpoints/shown"
    [stream] = logs.describe_log_streams(logGroupName=group)["logStreams"]
    assert stream["logStreamName"].startswith("v1/shown-v1-")
    events = logs.filter_log_events(logGroupName=group)["events"]
    assert any("serving" in e["message"] for e in events)
    assert {e["logStreamName"] for e in events} == {stream["logStreamName"]}


def _env(gw: GatewayProcess, tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": gw.url,
        "AWS_ENDPOINT_URL_SAGEMAKER": gw.url,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
    }


def test_the_aws_cli_reads_a_jobs_log(gw: GatewayProcess, tmp_path: Path) -> None:
    """AWS CLI v1 (the dev extras'): ``aws logs tail`` is v2's, over the same calls."""
    name = _finished_job(gw, tmp_path)
    aws = [sys.executable, "-m", "awscli", "logs"]
    env = _env(gw, tmp_path)
    found = subprocess.run(
        [*aws, "filter-log-events", "--log-group-name", GROUP, "--log-stream-name-prefix", name],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    events = json.loads(found.stdout)["events"]
    assert "total 6.0" in [e["message"] for e in events]
    stream = events[0]["logStreamName"]
    read = subprocess.run(
        [*aws, "get-log-events", "--log-group-name", GROUP, "--log-stream-name", stream,
         "--start-from-head"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert "total 6.0" in [e["message"] for e in json.loads(read.stdout)["events"]]


SDK_LOGS = """
import sys
import boto3, sagemaker
session = sagemaker.Session(boto_session=boto3.Session(region_name="us-east-1"))
session.logs_for_job(sys.argv[1], wait=True, poll=1)
"""


def test_the_sdk_prints_a_jobs_log(gw: GatewayProcess, tmp_path: Path) -> None:
    name = _finished_job(gw, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", SDK_LOGS, name],
        capture_output=True,
        text=True,
        env=_env(gw, tmp_path),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "total 6.0" in out.stdout
