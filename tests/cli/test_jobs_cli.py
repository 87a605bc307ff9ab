"""``shipyard jobs`` and ``shipyard logs`` run as real processes against a real gateway."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from shipyard.cli.client import Gateway
from tests.conftest import GatewayProcess, free_port

SCRIPTS = Path(__file__).parent / "scripts"
ENV = {"SHIPYARD_JOB_POLL_PERIOD_S": "0.2", "SHIPYARD_JOB_STOP_GRACE_S": "5"}
SCHEDULED = re.compile(r"Scheduled job (\S+) \((\d+) slots? remaining\)")


def template(**hyperparameters: str) -> dict[str, Any]:
    return {
        "AlgorithmSpecification": {"TrainingImage": "shipyard/python", "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": "job.py",
            "sagemaker_submit_directory": SCRIPTS.as_uri(),
            **hyperparameters,
        },
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    }


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayProcess], tmp_path: Path) -> GatewayProcess:
    """A gateway whose job types are ``lines``, ``slow_lines``, ``fail`` and ``sleep``."""
    templates = {
        "lines": template(mode="lines", count="3"),
        "slow_lines": template(mode="lines", count="15"),
        "fail": template(mode="fail"),
        "sleep": template(mode="sleep"),
    }
    stack = {
        "jobs": {
            "limit": 2,
            "white_list": list(templates),
            "s3_bucket": (tmp_path / "jobs-out").as_uri(),
            "templates": templates,
        }
    }
    stack_file = tmp_path / "stack.yaml"
    stack_file.write_text(yaml.safe_dump(stack))
    return gateway_factory(args=["--config", str(stack_file)], extra_env=ENV)


def shipyard(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a process, pointed at ``gw`` through SHIPYARD_URL."""
    env = {**os.environ, "SHIPYARD_URL": gw.url}
    return subprocess.run(
        [sys.executable, "-m", "shipyard", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def submit(gw: GatewayProcess, job_type: str) -> str:
    done = shipyard(gw, "jobs", "submit", job_type)
    assert done.returncode == 0, done.stderr
    match = SCHEDULED.search(done.stdout)
    assert match, done.stdout
    return match.group(1)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for word in words:
        assert word in done.stderr


def wait_secondary(gw: GatewayProcess, name: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while gw.sm.describe_training_job(TrainingJobName=name)["SecondaryStatus"] != status:
        assert time.monotonic() < deadline, f"{name} never reached {status}"
        time.sleep(0.1)


def test_a_submitted_job_is_followed_listed_described_and_its_log_printed(
    gw: GatewayProcess,
) -> None:
    done = shipyard(gw, "jobs", "submit", "lines", "--follow")
    assert done.returncode == 0, done.stderr
    match = SCHEDULED.search(done.stdout)
    assert match, done.stdout
    name, slots = match.groups()
    assert name.startswith("lines-") and slots == "1"
    assert "Completed" in done.stdout and "Status transitions" in done.stdout

    listed = shipyard(gw, "jobs", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if name in line)
    assert "Completed" in row

    described = shipyard(gw, "jobs", "describe", name, "--json")
    assert described.returncode == 0, described.stderr
    job = json.loads(described.stdout)
    assert job["TrainingJobName"] == name and job["TrainingJobStatus"] == "Completed"
    assert datetime.fromisoformat(job["CreationTime"]) <= datetime.fromisoformat(
        job["TrainingEndTime"]
    )
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]][-1] == "Completed"

    table = shipyard(gw, "jobs", "describe", name)
    assert table.returncode == 0 and "Training" in table.stdout and name in table.stdout

    log = shipyard(gw, "jobs", "logs", name)
    assert log.returncode == 0
    assert re.search(r"line 1 of 3\n.*line 2 of 3\n.*line 3 of 3\n", log.stdout, re.DOTALL)


def test_list_follows_next_token_newest_first_and_stops_at_max(gw: GatewayProcess) -> None:
    first, second = submit(gw, "slow_lines"), submit(gw, "lines")
    paged = Gateway(gw.url, page_size=1).list_jobs()
    assert [job["TrainingJobName"] for job in paged] == [second, first]
    newest = shipyard(gw, "jobs", "list", "--max", "1")
    assert second in newest.stdout and first not in newest.stdout


def test_logs_follow_prints_lines_as_they_come_and_returns_when_the_job_ends(
    gw: GatewayProcess,
) -> None:
    name = submit(gw, "slow_lines")
    assert gw.sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
    followed = shipyard(gw, "logs", name, "--follow")
    assert followed.returncode == 0, followed.stderr
    lines = [line for line in followed.stdout.splitlines() if line.startswith("line ")]
    assert lines == [f"line {n} of 15" for n in range(1, 16)]
    assert gw.sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Completed"


def test_a_failed_job_ends_the_follow_with_exit_1_and_its_reason(gw: GatewayProcess) -> None:
    done = shipyard(gw, "jobs", "submit", "fail", "--follow")
    assert done.returncode == 1
    assert SCHEDULED.search(done.stdout) and "Failed" in done.stdout
    assert "no data to infer on" in done.stderr and "Traceback" not in done.stderr


def test_stop_ends_a_sleeping_job_stopped(gw: GatewayProcess) -> None:
    name = submit(gw, "sleep")
    wait_secondary(gw, name, "Training")
    stopped = shipyard(gw, "jobs", "stop", name)
    assert stopped.returncode == 0, stopped.stderr
    assert name in stopped.stdout
    watched = shipyard(gw, "jobs", "watch", name)
    assert watched.returncode == 1
    assert "Stopped" in watched.stdout and f"{name} was stopped." in watched.stderr
    listed = shipyard(gw, "jobs", "list", "--status", "Stopped", "--name-contains", "sleep")
    assert name in listed.stdout
    assert name not in shipyard(gw, "jobs", "list", "--status", "Completed").stdout


def test_a_refused_submission_exits_1_with_the_gateway_message(gw: GatewayProcess) -> None:
    done = shipyard(gw, "jobs", "submit", "nope")
    assert_one_line_error(done, "The type [nope] is not in the white list.")
    assert done.stdout == ""


def test_an_unknown_job_or_gateway_is_one_red_line_and_exit_1(gw: GatewayProcess) -> None:
    for command in ("describe", "stop", "logs", "watch"):
        assert_one_line_error(shipyard(gw, "jobs", command, "no-such-job"), "no-such-job")
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert_one_line_error(shipyard(gw, "jobs", "list", "--url", nowhere), nowhere)
