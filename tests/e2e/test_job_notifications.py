"""Job notifications end to end: a real gateway, real jobs, a real webhook receiver and a
real SMTP server; each job's end is announced exactly once per subscriber."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import GatewayProcess, wait_dispatched
from tests.e2e.test_facade import post, stack_file
from tests.e2e.test_jobs import ENV, wait_final

NOTIFY = {"Completed": ["done"], "Failed": ["arn:aws:sns:us-east-1:000000000000:done"]}


def delivered(webhook: Any) -> list[Any]:
    return [r for r in webhook.requests if r.status == 200]


def about(requests: list[Any], name: str) -> list[Any]:
    return [r for r in requests if f"Job: {name}" in r.body["message"]]


def test_a_completed_job_is_announced_once_by_webhook_and_by_email(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any, smtp: Any
) -> None:
    topics = {"done": [webhook.url.replace("http://", "json://") + "/hook", smtp.mailto()]}
    stack = stack_file(tmp_path, limit=2, topics=topics, notify=NOTIFY)
    gw = gateway_factory(args=["--config", str(stack)], extra_env=ENV)
    status, body = post(gw, b'{"type": "model_a"}')
    assert status == 200
    name = body["jobName"]
    job = wait_final(gw.sm, name)
    assert job["TrainingJobStatus"] == "Completed"

    [hook] = webhook.wait_for(1)
    assert hook.path == "/hook"
    assert hook.body["title"] == f"Job {name} Completed"
    message = hook.body["message"]
    for line in (f"Job: {name}", "Type: model_a", "Status: Completed (Completed)",
                 "Started: ", "Ended: ", "Duration: ",
                 f"Output: {job['ModelArtifacts']['S3ModelArtifacts']}"):  # fmt: skip
        assert line in message, (line, message)
    assert hook.headers.get("x-shipyard-delivery-key")
    [mail] = smtp.wait_for(1)
    assert mail.subject == f"Job {name} Completed"
    assert f"Job: {name}" in mail.body

    # A restart replays nothing: the deliveries are recorded as sent before the kill, and
    # a job after the restart is announced alone (its dispatcher passed the whole outbox).
    wait_dispatched(gw)
    gw.stop(signal.SIGKILL)
    again = gateway_factory(tmp_path / "home", args=["--config", str(stack)], extra_env=ENV)
    later = post(again, b'{"type": "model_a"}')[1]["jobName"]
    assert wait_final(again.sm, later)["TrainingJobStatus"] == "Completed"
    webhook.wait_for(2)
    smtp.wait_for(2)
    wait_dispatched(again)
    assert len(about(webhook.requests, name)) == 1
    assert len(about(webhook.requests, later)) == 1
    assert [m.subject for m in smtp.messages] == [f"Job {name} Completed", f"Job {later} Completed"]


def test_a_failed_job_is_announced_with_its_reason_through_an_sns_arn(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    stack = stack_file(tmp_path, limit=2, topics={"done": [webhook.url + "/x"]}, notify=NOTIFY)
    gw = gateway_factory(args=["--config", str(stack)], extra_env=ENV)
    status, body = post(gw, b'{"type": "broken"}')
    assert status == 200
    assert wait_final(gw.sm, body["jobName"])["TrainingJobStatus"] == "Failed"
    [hook] = webhook.wait_for(1)
    assert hook.body["title"] == f"Job {body['jobName']} Failed"
    assert "Reason: bad input: the data channel is empty" in hook.body["message"]


def test_a_subscriber_that_fails_is_retried_and_hears_the_job_once(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    webhook.fail_next(2)
    stack = stack_file(tmp_path, limit=4, topics={"done": [webhook.url]}, notify=NOTIFY)
    gw = gateway_factory(args=["--config", str(stack)], extra_env=ENV)
    names = [post(gw, b'{"type": "model_a"}')[1]["jobName"] for _ in range(3)]
    for name in names:
        wait_final(gw.sm, name)
    wait_dispatched(gw)  # every announcement settled: nothing more will be sent
    ok = delivered(webhook)
    assert sorted(len(about(ok, n)) for n in names) == [1, 1, 1]
    assert len(webhook.requests) == 5  # two refused, then one each
    keys = {r.headers["x-shipyard-delivery-key"] for r in webhook.requests}
    assert len(keys) == 3  # a retry carries the same key


def test_a_job_that_ends_while_the_gateway_is_down_is_announced_once_after_restart(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    stack = stack_file(
        tmp_path, limit=2, topics={"done": [webhook.url]}, notify=NOTIFY, seconds="2"
    )
    gw = gateway_factory(args=["--config", str(stack)], extra_env=ENV)
    name = post(gw, b'{"type": "quick"}')[1]["jobName"]
    deadline = time.monotonic() + 20
    while gw.sm.describe_training_job(TrainingJobName=name)["SecondaryStatus"] != "Training":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    gw.stop(signal.SIGKILL)
    status = tmp_path / "home" / "jobs" / name / "attempt-1" / "status.jsonl"
    deadline = time.monotonic() + 30
    while '"final"' not in (status.read_text() if status.exists() else ""):
        assert time.monotonic() < deadline, "the job never ended"  # while the gateway is down
        time.sleep(0.05)
    assert webhook.requests == []
    again = gateway_factory(tmp_path / "home", args=["--config", str(stack)], extra_env=ENV)
    job = wait_final(again.sm, name)
    assert job["TrainingJobStatus"] == "Completed"
    [hook] = webhook.wait_for(1)
    assert f"Job: {name}" in hook.body["message"]
    wait_dispatched(again)
    assert len(webhook.requests) == 1
