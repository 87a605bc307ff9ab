"""A hung instance (stopped, deadlocked) is replaced, even with a request on it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.conftest import MODELS, GatewayProcess, deploy, unique
from tests.e2e.processes import alive, instance_pids


def test_a_stopped_instance_with_a_request_on_it_is_replaced(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    """Issue 9 finding 11: a SIGSTOPped instance was routed around but never replaced,
    and the request on it waited the whole invocation timeout."""
    gw = gateway_factory(
        extra_env={
            "SHIPYARD_UNHEALTHY_RESTART_AFTER_S": "2",
            "SHIPYARD_INVOCATION_TIMEOUT_S": "120",
        }
    )
    name = unique("hung")
    deploy(gw.sm, name, (MODELS / "sum").as_uri(), count=2)
    before = instance_pids(gw.process.pid)
    assert len(before) == 2
    hung = before[0]
    os.kill(hung, signal.SIGSTOP)
    answers: list[Any] = []
    rt = gw.client("sagemaker-runtime", max_attempts=1, read_timeout=120)

    def call() -> None:
        try:
            out = rt.invoke_endpoint(EndpointName=name, ContentType="application/json",
                                     Body=b"[[1, 2]]")  # fmt: skip
            answers.append(out["Body"].read())
        except Exception as exc:  # the request on the hung instance may fail, but not hang
            answers.append(exc)

    # Several at once, so that one of them lands on the stopped instance.
    callers = [threading.Thread(target=call) for _ in range(4)]
    try:
        for t in callers:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = instance_pids(gw.process.pid)
            if hung not in now and len(now) == 2:
                break
            time.sleep(0.2)
        assert hung not in instance_pids(gw.process.pid)
        assert not alive(hung)
        for t in callers:
            t.join(60)
            assert not t.is_alive()  # answered or failed, long before the 120 s timeout
        assert len(answers) == 4
        assert gw.sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"
        for _ in range(10):
            out = gw.rt.invoke_endpoint(EndpointName=name, ContentType="application/json",
                                        Body=b"[[1, 2]]")  # fmt: skip
            assert out["Body"].read() == b"[3.0]"
    finally:
        if alive(hung):
            os.kill(hung, signal.SIGKILL)
