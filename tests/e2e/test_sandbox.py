"""With ``auth:``, model and job code runs in a sandbox (``auth.sandbox``).

Proven from inside: the probe model (tests/models/sandbox_probe) tries to read the
gateway's environment through ``/proc``, the gateway's store and a file outside the
roots, to write under a root, looks for the gateway's PID, and reports what it got. The
same probe with ``sandbox: false`` sees all of it, so the test can fail. And from the
gateway's side: what a job's code leaves in its own folder (a link in place of its log)
does not lead the gateway out, and a job still writes its output and checkpoints where
its call said, under a root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, start_gateway, wait_until
from tests.e2e.test_auth import SECRETS, client, signed_http, write_stack
from tests.e2e.test_jobs import CODE, ENV, job_request, wait_final, wait_secondary

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap (bwrap) is not installed; make install-dev installs it",
)


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a root (the probe's code, a data file) and a secret beside it."""
    base = tmp_path_factory.mktemp("sandbox")
    root = base / "root"
    shutil.copytree(MODELS / "sandbox_probe", root / "probe")
    shutil.copytree(CODE, root / "job_code")
    (root / "data").mkdir()
    (root / "data" / "inside.txt").write_text("granted data")
    (base / "secret.txt").write_text("not for models")
    return base


def gateway(place: Path, name: str, **auth: Any) -> GatewayProcess:
    stack = write_stack(place / f"{name}.yaml", file_roots=[str(place / "root")], **auth)
    return start_gateway(place / name, extra_env={**SECRETS, **ENV}, args=["--config", str(stack)])


@pytest.fixture(scope="module")
def sandboxed(place: Path) -> Iterator[GatewayProcess]:
    gw = gateway(place, "sandboxed")  # sandbox: true is the default with auth:
    try:
        deploy(client(gw, "sagemaker"), "probe", (place / "root" / "probe").as_uri())
        yield gw
    finally:
        gw.stop()


def paths(gw: GatewayProcess, place: Path) -> dict[str, str]:
    return {
        "store": str(gw.home / "shipyard.db"),
        "secret": str(place / "secret.txt"),
        "inside": str(place / "root" / "data" / "inside.txt"),
    }


def invoke_probe(
    gw: GatewayProcess, place: Path, writes: dict[str, str] | None = None
) -> dict[str, Any]:
    body = {"gateway_pid": gw.process.pid, "paths": paths(gw, place), "writes": writes or {}}
    answer = client(gw, "sagemaker-runtime").invoke_endpoint(
        EndpointName="probe", ContentType="application/json", Body=json.dumps(body)
    )
    return dict(json.loads(answer["Body"].read()))


@needs_bwrap
def test_a_sandboxed_model_reads_its_roots_and_nothing_of_the_gateway(
    sandboxed: GatewayProcess, place: Path
) -> None:
    theirs = place / "root" / "data" / "by-model.txt"
    report = invoke_probe(sandboxed, place, {"root": str(theirs)})
    assert "Read-only file system" in report["wrote"]["root"]["error"], report["wrote"]
    assert not theirs.exists(), "a root is read-only to a model"
    read = report["read"]
    assert "error" in read["environ"], read["environ"]
    assert "error" in read["store"], read["store"]
    assert "error" in read["secret"], read["secret"]
    assert read["inside"] == {"ok": "granted data"}
    assert not report["sees_gateway"]
    assert max(report["pids"]) < 100, "only the sandbox's own processes are listed"
    assert (report["uid"], report["gid"]) == (65534, 65534)


@needs_bwrap
def test_without_the_sandbox_the_same_probe_sees_the_gateway(place: Path) -> None:
    """The control: ``sandbox: false`` shows the probe what the sandbox hides."""
    gw = gateway(place, "open", sandbox=False)
    written = place / "root" / "data" / "by-open-model.txt"
    try:
        deploy(client(gw, "sagemaker"), "probe", (place / "root" / "probe").as_uri())
        report = invoke_probe(gw, place, {"root": str(written)})
    finally:
        gw.stop()
        written.unlink(missing_ok=True)
    assert report["wrote"]["root"] == {"ok": str(written)}
    assert report["sees_gateway"]
    assert SECRETS["SHIPYARD_KEY_OPS"] in report["read"]["environ"]["ok"]
    assert report["read"]["secret"] == {"ok": "not for models"}
    assert "ok" in report["read"]["store"]


@needs_bwrap
def test_a_sandboxed_training_job_cannot_see_the_gateway_and_uploads_its_model(
    sandboxed: GatewayProcess, place: Path
) -> None:
    sm = client(sandboxed, "sagemaker")
    out = place / "root" / "out"
    request = job_request("probe-job", out)
    request["HyperParameters"] = {
        "sagemaker_program": "inference.py",
        "sagemaker_submit_directory": (place / "root" / "probe" / "code").as_uri(),
        "gateway_pid": str(sandboxed.process.pid),
        "paths": json.dumps(paths(sandboxed, place)),
        "writes": json.dumps({"data": str(place / "root" / "data" / "by-job.txt")}),
    }
    sm.create_training_job(**request)
    job = wait_final(sm, "probe-job")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    with tarfile.open(out / "probe-job" / "output" / "model.tar.gz") as tar:
        member = tar.extractfile("probe.json")
        assert member is not None
        report = json.load(member)
    read = report["read"]
    assert "error" in read["environ"], read["environ"]
    assert "error" in read["store"], read["store"]
    assert "error" in read["secret"], read["secret"]
    assert read["inside"] == {"ok": "granted data"}
    assert not report["sees_gateway"]
    assert report["uid"] == 65534
    assert "error" in report["wrote"]["data"], "a job writes only its own output folders"
    assert not (place / "root" / "data" / "by-job.txt").exists()


@needs_bwrap
def test_a_stopped_sandboxed_job_gets_sigterm_and_saves_its_model(
    sandboxed: GatewayProcess, place: Path
) -> None:
    """StopTrainingJob reaches the runner inside the sandbox (not only bwrap, which a
    SIGTERM would kill at once), which stops the script politely and uploads."""
    sm = client(sandboxed, "sagemaker")
    out = place / "root" / "out"
    request = job_request("sleeper", out, mode="sleep", seconds="60")
    code = (place / "root" / "job_code").as_uri()
    request["HyperParameters"]["sagemaker_submit_directory"] = code
    sm.create_training_job(**request)
    wait_secondary(sm, "sleeper", "Training")
    log = sandboxed.home / "jobs" / "sleeper" / "attempt-1" / "job.log"
    wait_until(lambda: log.exists() and "sleeping" in log.read_text(), "the script's handler")
    sm.stop_training_job(TrainingJobName="sleeper")
    job = wait_final(sm, "sleeper")
    assert job["TrainingJobStatus"] == "Stopped", job.get("FailureReason")
    with tarfile.open(out / "sleeper" / "output" / "model.tar.gz") as tar:
        assert "stopped.json" in tar.getnames()


LINKER = """
import argparse, os, pathlib
parser = argparse.ArgumentParser()
parser.add_argument("--secret")
args = parser.parse_args()
log = pathlib.Path.cwd().parent.parent / "job.log"  # the script runs in <attempt>/ml/code
print("replacing my log", flush=True)
os.remove(log)
os.symlink(args.secret, log)
"""


@needs_bwrap
def test_a_job_that_replaces_its_log_with_a_link_does_not_have_the_gateway_read_it(
    sandboxed: GatewayProcess, place: Path
) -> None:
    """The job's folder is its own to write: a link it puts in place of job.log, to a
    file outside the roots it cannot read itself, is not followed by the gateway's log
    readers (GET /jobs/{name}/logs, GetLogEvents, the console's log view)."""
    code = place / "root" / "linker"
    code.mkdir(exist_ok=True)
    (code / "linker.py").write_text(LINKER)
    secret = place / "secret.txt"
    sm = client(sandboxed, "sagemaker")
    request = job_request("linker", place / "root" / "out")
    request["HyperParameters"] = {
        "sagemaker_program": "linker.py",
        "sagemaker_submit_directory": code.as_uri(),
        "secret": str(secret),
    }
    sm.create_training_job(**request)
    job = wait_final(sm, "linker")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    log = sandboxed.home / "jobs" / "linker" / "attempt-1" / "job.log"
    assert log.is_symlink() and log.read_text() == secret.read_text(), "the job made its link"
    status, _, body = signed_http(sandboxed, "GET", "/jobs/linker/logs")
    assert status == 200 and b"not for models" not in body, body
    status, _, body = signed_http(sandboxed, "GET", "/console/api/jobs/linker/log?offset=0")
    assert status == 200 and b"not for models" not in body, body
    logs = client(sandboxed, "logs")
    group = "/aws/sagemaker/TrainingJobs"
    streams = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix="linker/")
    stream = streams["logStreams"][0]["logStreamName"]
    events = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True)
    assert not any("not for models" in e["message"] for e in events["events"]), events


@needs_bwrap
def test_a_sandboxed_job_writes_its_checkpoints_under_a_root_and_resumes_from_them(
    sandboxed: GatewayProcess, place: Path
) -> None:
    """A job is granted its own output and checkpoint folders under a root (the rest of
    the root is read-only to it): a job whose runner is lost resumes from the
    checkpoints it synced there, and uploads its model there."""
    sm = client(sandboxed, "sagemaker")
    out, checkpoints = place / "root" / "out", place / "root" / "checkpoints" / "resumed"
    request = job_request("resumed", out, mode="steps", steps="40")
    code = (place / "root" / "job_code").as_uri()
    request["HyperParameters"]["sagemaker_submit_directory"] = code
    request["CheckpointConfig"] = {"S3Uri": checkpoints.as_uri()}
    request["RetryStrategy"] = {"MaximumRetryAttempts": 1}
    sm.create_training_job(**request)
    wait_until(lambda: (checkpoints / "step.txt").exists(), "a synced checkpoint")
    # The runner is lost: its sandbox's bwrap, recorded by the gateway, is killed whole.
    record = sandboxed.home / "jobs" / "resumed" / "attempt-1.sandbox"
    os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
    job = wait_final(sm, "resumed")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    assert "Restarting" in [t["Status"] for t in job["SecondaryStatusTransitions"]]
    with tarfile.open(out / "resumed" / "output" / "model.tar.gz") as tar:
        member = tar.extractfile("result.json")
        assert member is not None
        assert json.load(member)["resumed_from"] > 0


LINK_MODELS = """
import os, pathlib, runpy, sys
try:  # the gateway fetches models into .models here: a link would lead its writes out
    if os.path.lexists(".models"):
        os.rename(".models", "moved")
    os.symlink(sys.argv[1], ".models")
    print("replaced .models", flush=True)
except OSError as exc:
    print("could not replace .models:", exc, flush=True)
runpy.run_path(sys.argv[2], run_name="__main__")
"""


@needs_bwrap
def test_a_sandboxed_multi_model_server_is_served_models_it_cannot_redirect(
    place: Path,
) -> None:
    """A cmd: multi-model server's folder is its own, but for ``.models``, where the
    gateway fetches its models (routing/model_agent.py): read-only inside, so the server
    cannot put a link there that the gateway's fetches and deletes would follow."""
    from tests.e2e.test_multimodel import MME_SERVER
    from tests.runtime.mme_models import COUNTER_ENV, write_model

    code, prefix = place / "root" / "mme", place / "root" / "mme-models"
    code.mkdir(exist_ok=True)
    (code / "server.py").write_text(MME_SERVER)
    (code / "link.py").write_text(LINK_MODELS)
    elsewhere = place / "elsewhere"
    elsewhere.mkdir()
    model = write_model(prefix, "a.tar.gz")
    command = f"{sys.executable} {code / 'link.py'} {elsewhere} {code / 'server.py'}"
    gw = gateway(place, "commands", allow_commands=True)
    try:
        sm = client(gw, "sagemaker")
        sm.create_model(
            ModelName="mme",
            PrimaryContainer={
                "Image": f"cmd:{command}",
                "Mode": "MultiModel",
                "ModelDataUrl": prefix.as_uri(),
                "Environment": {COUNTER_ENV: "loads.txt", "MAX_MODELS": "2"},
            },
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
        variant = {"VariantName": "v1", "ModelName": "mme", "InitialInstanceCount": 1}
        sm.create_endpoint_config(
            EndpointConfigName="mme",
            ProductionVariants=[{**variant, "InstanceType": "ml.m5.large"}],
        )
        sm.create_endpoint(EndpointName="mme", EndpointConfigName="mme")
        wait_until(
            lambda: sm.describe_endpoint(EndpointName="mme")["EndpointStatus"] != "Creating",
            "the endpoint's start",
            60,
        )
        described = sm.describe_endpoint(EndpointName="mme")
        assert described["EndpointStatus"] == "InService", described.get("FailureReason")
        answer = client(gw, "sagemaker-runtime").invoke_endpoint(
            EndpointName="mme",
            ContentType="application/json",
            Body=b"[[1, 2]]",
            TargetModel="a.tar.gz",
        )
        assert json.loads(answer["Body"].read())["model"] == model.name
        log = (gw.home / "logs" / "mme").glob("*.log")
        assert "could not replace .models" in "".join(p.read_text() for p in log)
    finally:
        gw.stop()
    assert list(elsewhere.iterdir()) == [], "the gateway wrote nothing through a link"


def test_a_gateway_that_cannot_sandbox_refuses_to_start(place: Path, tmp_path: Path) -> None:
    """No bwrap on the gateway's PATH: it says what to install, or how to turn it off."""
    stack = write_stack(tmp_path / "stack.yaml", file_roots=[str(place / "root")])
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(RuntimeError, match="gateway exited early") as info:
        start_gateway(
            tmp_path / "home",
            extra_env={**SECRETS, "PATH": str(empty)},
            args=["--config", str(stack)],
        )
    assert "apt-get install bubblewrap" in str(info.value)
    assert "auth.sandbox: false" in str(info.value)
