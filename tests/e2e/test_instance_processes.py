"""Instance processes: what they are given, and that none outlives its gateway."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import MODELS, GatewayProcess, deploy, unique
from tests.e2e.processes import alive, instance_pids
from tests.e2e.test_jobs import ENV as JOB_ENV
from tests.e2e.test_jobs import job_request, wait_final

SECRETS = {
    "MY_DB_PASSWORD": "hunter2",
    "SHIPYARD_KEY_OPS": "ops-secret",
    "AWS_SECRET_ACCESS_KEY": "gateway-aws-secret",
}


def test_an_instance_gets_its_own_variables_not_the_gateways(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory(extra_env=SECRETS)
    name = unique("env")
    deploy(gw.sm, name, (MODELS / "env_dump").as_uri(), environment={"MODEL_SETTING": "on"})
    out = gw.rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=b"{}")
    env = json.loads(out["Body"].read())
    for secret in SECRETS:
        assert secret not in env
    assert env["MODEL_SETTING"] == "on"
    assert "SAGEMAKER_BIND_TO_PORT" in env and "PATH" in env
    assert env["HOME"].startswith(str(gw.home))


def test_a_job_script_gets_its_own_variables_not_the_gateways(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env={**SECRETS, **JOB_ENV})
    name = unique("envjob")
    gw.sm.create_training_job(**job_request(name, tmp_path / "out", mode="env"))
    job = wait_final(gw.sm, name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    logs = "".join(p.read_text() for p in gw.home.glob(f"jobs/{name}/**/*.log"))
    seen = json.loads(logs.split("ENV ", 1)[1].splitlines()[0])
    for secret in SECRETS:
        assert secret not in seen
    assert "SM_MODEL_DIR" in seen


def wait_gone(pids: list[int], timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def test_instances_do_not_outlive_a_sigkilled_gateway(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Issue 9 finding 10: after kill -9 of the gateway its instances stayed, and the
    restarted gateway started new ones beside them."""
    pid_dir = tmp_path / "forked"
    pid_dir.mkdir()
    gw = gateway_factory(tmp_path / "home")
    deploy(gw.sm, "built-in", (MODELS / "sum").as_uri(), count=2)
    server = MODELS / "forking" / "server.py"
    deploy(
        gw.sm,
        "forking",
        (MODELS / "forking").as_uri(),
        image=f"cmd:exec {sys.executable} {server}",
        environment={"FORKING_PID_DIR": str(pid_dir)},
    )
    first = instance_pids(gw.process.pid)
    children = [int(p.name.removeprefix("child-")) for p in pid_dir.iterdir()]
    assert len(first) == 3 and len(children) == 1
    try:
        os.kill(gw.process.pid, signal.SIGKILL)
        gw.process.wait()
        # The built-in instances die with the gateway (the kernel kills them).
        assert wait_gone(first) == []
        again = gateway_factory(tmp_path / "home")
        for name in ("built-in", "forking"):
            again.sm.get_waiter("endpoint_in_service").wait(EndpointName=name)
        # What a cmd: server forked is stopped by the next gateway, found by its PID.
        assert wait_gone(children) == []
        assert len(instance_pids(again.process.pid)) == 3
    finally:
        for pid in first + children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
