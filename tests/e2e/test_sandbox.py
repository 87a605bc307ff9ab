"""With ``auth:``, model and job code runs in a sandbox (DESIGN 2.9, ``auth.sandbox``).

Proven from inside: the probe model (tests/models/sandbox_probe) tries to read the
gateway's environment through ``/proc``, the gateway's store and a file outside the
roots, looks for the gateway's PID, and reports what it got. The same probe with
``sandbox: false`` sees all of it, so the test can fail.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, start_gateway, wait_until
from tests.e2e.test_auth import SECRETS, client, write_stack
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


def invoke_probe(gw: GatewayProcess, place: Path) -> dict[str, Any]:
    body = {"gateway_pid": gw.process.pid, "paths": paths(gw, place)}
    answer = client(gw, "sagemaker-runtime").invoke_endpoint(
        EndpointName="probe", ContentType="application/json", Body=json.dumps(body)
    )
    return dict(json.loads(answer["Body"].read()))


@needs_bwrap
def test_a_sandboxed_model_reads_its_roots_and_nothing_of_the_gateway(
    sandboxed: GatewayProcess, place: Path
) -> None:
    report = invoke_probe(sandboxed, place)
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
    try:
        deploy(client(gw, "sagemaker"), "probe", (place / "root" / "probe").as_uri())
        report = invoke_probe(gw, place)
    finally:
        gw.stop()
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
