"""Instance processes never outlive their gateway, even one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import MODELS, GatewayProcess, deploy
from tests.e2e.processes import alive, instance_pids


def wait_gone(pids: list[int], timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def wait_count(gateway_pid: int, count: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while (found := len(instance_pids(gateway_pid))) != count:
        if time.monotonic() > deadline:
            return found
        time.sleep(0.1)
    return found


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
        # An endpoint reads InService from the store while the new gateway's
        # reconciler still starts its instances: wait for all three.
        assert wait_count(again.process.pid, 3) == 3
    finally:
        for pid in first + children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
