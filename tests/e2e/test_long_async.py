"""A long asynchronous request completes on the instance it started on.

The router counts it in flight like any other request, so the instance is busy (never
replaced for being slow) and /metrics shows the work; the built-in runtime answers
``/ping`` while the handler runs, so the gateway never takes it for hung.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import GatewayProcess, in_flight, unique
from tests.e2e.test_async import deploy_async, put_input, wait_file, wait_results

LONG_S = 60


def test_a_sixty_second_async_request_completes_on_a_busy_instance(
    gateway_factory: Callable[..., GatewayProcess],
    model_tarball: Callable[[str], str],
    tmp_path: Path,
    webhook: Any,
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    # An instance that stopped answering /ping would be replaced within 3 s.
    gw = gateway_factory(
        args=["--config", str(stack)],
        extra_env={"SHIPYARD_UNHEALTHY_RESTART_AFTER_S": "3"},
    )
    name = unique("long")
    deploy_async(gw.sm, name, tmp_path / "out", model_url=model_tarball("sleepy"))
    assert in_flight(gw, name) == 0

    # The instance's PID before: the model answers with the PID it was loaded in.
    quick = gw.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 0})
    )
    before = json.loads(wait_file(quick["OutputLocation"]))["pid"]

    started = time.monotonic()
    long = gw.rt.invoke_endpoint_async(
        EndpointName=name,
        InputLocation=put_input(tmp_path, {"sleep": LONG_S}),
        InvocationTimeoutSeconds=LONG_S * 3,
    )
    deadline = time.monotonic() + 10
    while in_flight(gw, name) != 1:
        assert time.monotonic() < deadline, "the request never counted as in flight"
        time.sleep(0.1)

    answer = json.loads(wait_file(long["OutputLocation"], timeout_s=LONG_S * 2))
    assert answer == {"pid": before, "slept": LONG_S}
    assert time.monotonic() - started >= LONG_S
    assert in_flight(gw, name) == 0
    assert not Path(long["FailureLocation"].removeprefix("file://")).exists()
    done = wait_results(webhook, 2, timeout_s=10)
    assert {m["inferenceId"] for m in done} == {quick["InferenceId"], long["InferenceId"]}
    assert all(m["invocationStatus"] == "Completed" for m in done)
    assert "replacing it" not in gw.log()
