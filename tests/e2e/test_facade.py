"""The one-call facade, ``POST /inference``, against a real gateway with a stack file."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import GatewayProcess
from tests.e2e.test_jobs import CODE, ENV, wait_final


def stack_file(tmp_path: Path, *, limit: int, topics: dict[str, list[str]] | None = None,
               notify: dict[str, list[str]] | None = None, seconds: str = "0") -> Path:  # fmt: skip
    """A stack file with job types ``quick`` (sleeps ``seconds``) and ``broken`` (fails)."""
    data = tmp_path / "in"
    data.mkdir(exist_ok=True)
    (data / "x.txt").write_text("2 3")

    def template(mode: str) -> dict[str, Any]:
        return {
            "AlgorithmSpecification": {
                "TrainingImage": "shipyard/python",
                "TrainingInputMode": "File",
            },
            "HyperParameters": {
                "sagemaker_program": "infer.py",
                "sagemaker_submit_directory": CODE.as_uri(),
                "mode": mode,
                "seconds": seconds,
            },
            "InputDataConfig": [
                {
                    "ChannelName": "data",
                    "DataSource": {
                        "S3DataSource": {"S3Uri": data.as_uri(), "S3DataType": "S3Prefix"}
                    },
                }
            ],  # fmt: skip
            "ResourceConfig": {
                "InstanceType": "ml.m5.large",
                "InstanceCount": 1,
                "VolumeSizeInGB": 1,
            },
        }

    stack = {
        "topics": topics or {},
        "jobs": {
            "limit": limit,
            "white_list": ["quick", "broken", "model_a"],
            "s3_bucket": (tmp_path / "jobs-out").as_uri(),
            "role_arn": "arn:aws:iam::123456789012:role/jobs",
            "templates": {
                "quick": template("ok" if seconds == "0" else "sleep"),
                "broken": template("fail"),
                "model_a": template("ok"),
            },  # fmt: skip
            "notify": notify or {},
        },
    }
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def post(gw: GatewayProcess, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(gw.url + "/inference", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_each_facade_answer_has_its_status_in_the_http_status_and_the_body(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(args=["--config", str(stack_file(tmp_path, limit=1, seconds="30"))],
                         extra_env=ENV)  # fmt: skip
    for bad in (b"not json", b"[1, 2]", b"{}", b'{"type": 3}', b'{"type": ""}'):
        status, body = post(gw, bad)
        assert status == 501 and body["status"] == 501, bad
        assert body["errMsg"]
    status, body = post(gw, b'{"type": "unknown"}')
    assert (status, body["status"]) == (510, 510)
    assert "unknown" in body["errMsg"]

    status, body = post(gw, b'{"type": "quick"}')
    assert (status, body["status"]) == (200, 200)
    name = body["jobName"]
    assert name.startswith("quick-")
    assert body["slotsRemaining"] == 0
    assert body["errMsg"] == (
        f"A new job [{name}] was scheduled successfully, and 0 slots remaining."
    )
    status, body = post(gw, b'{"type": "quick"}')
    assert (status, body["status"]) == (502, 502)
    assert body["errMsg"] == "Failed to schedule inference at the moment, due to reaching limit 1."

    job = gw.sm.describe_training_job(TrainingJobName=name)
    assert job["RoleArn"] == "arn:aws:iam::123456789012:role/jobs"
    assert job["OutputDataConfig"]["S3OutputPath"] == (tmp_path / "jobs-out").as_uri()
    gw.sm.stop_training_job(TrainingJobName=name)
    wait_final(gw.sm, name)
    status, body = post(gw, b'{"type": "model_a"}')
    assert status == 200 and body["jobName"].startswith("model-a-")
    assert wait_final(gw.sm, body["jobName"])["TrainingJobStatus"] == "Completed"


def test_twenty_simultaneous_requests_with_limit_three_schedule_exactly_three(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(args=["--config", str(stack_file(tmp_path, limit=3, seconds="30"))],
                         extra_env=ENV)  # fmt: skip
    results: list[tuple[int, dict[str, Any]]] = []
    barrier = threading.Barrier(20)

    def one() -> None:
        barrier.wait()
        results.append(post(gw, b'{"type": "quick"}'))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 3 + [502] * 17
    names = {body["jobName"] for status, body in results if status == 200}
    assert len(names) == 3
    assert sorted(body["slotsRemaining"] for s, body in results if s == 200) == [0, 1, 2]
    active = gw.sm.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    assert {j["TrainingJobName"] for j in active} == names
    for name in names:
        gw.sm.stop_training_job(TrainingJobName=name)


_HALF_A_TEMPLATE = {"AlgorithmSpecification": {"TrainingImage": "shipyard/python"}}
_MALFORMED = [
    # a hyperparameter is a string; a channel has a name; a count is a number
    {**_HALF_A_TEMPLATE, "HyperParameters": {"sagemaker_program": 5}},
    {**_HALF_A_TEMPLATE, "HyperParameters": {"sagemaker_program": "a.py"},
     "InputDataConfig": [{"DataSource": {"S3DataSource": {"S3Uri": "s3://b/x"}}}]},
    {**_HALF_A_TEMPLATE, "HyperParameters": {"sagemaker_program": "a.py"},
     "ResourceConfig": {"InstanceCount": "abc"}},
]  # fmt: skip


def _with_template(template: dict[str, Any]) -> dict[str, Any]:
    return {"white_list": ["t"], "s3_bucket": "s3://b/out", "templates": {"t": template}}


@pytest.mark.parametrize(
    "bad",
    [{"limit": 0}, {"white_list": ["x"]}, {"frobnicate": 1}, *map(_with_template, _MALFORMED)],
)
def test_a_bad_jobs_section_stops_the_gateway_at_start_with_the_field_named(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    import subprocess
    import sys

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"jobs": bad}))
    result = subprocess.run(
        [sys.executable, "-m", "shipyard", "serve", "--home", str(tmp_path / "h"),
         "--port", "0", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "jobs" in result.stderr
