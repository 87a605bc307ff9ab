"""``shipyard serve --demo``: the demo endpoint, deployed again on every start."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.conftest import GatewayProcess, wait_in_service


def invoke_when_routed(gw: GatewayProcess) -> bytes:
    # After a restart the endpoint is InService in the store while its instance starts
    # again, and the runtime does not know it until then.
    deadline = time.monotonic() + 30
    while True:
        status, body = post(gw.url + "/endpoints/demo/invocations", b'{"instances": [[1, 2]]}')
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, body
            return body
        time.sleep(0.1)


def post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_demo_endpoint_serves_after_a_restart_on_the_same_home(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    for _ in range(2):  # the second start finds the demo's resources already there
        gw = gateway_factory(tmp_path / "home", args=["--demo"])
        wait_in_service(gw.sm, "demo")
        assert json.loads(invoke_when_routed(gw)) == {"predictions": [3]}
        assert "Traceback" not in gw.log()
        gw.stop()
