"""A client that goes away while its request runs on an instance: the gateway closes its
exchange and gives the instance back, counts the request as cancelled, and a handler on
a handler thread sees ``context.cancelled``; a streamed answer's generator is closed at
once. Real gateway and instance processes, raw clients that hang up."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, in_flight, wait_until
from tests.e2e.test_admission import metric

CANCELLABLE = "cancellable"


@pytest.fixture
def gw(gateway_factory: Any) -> GatewayProcess:
    """A gateway serving the cancellable model on two handler threads."""
    gw = gateway_factory()
    deploy(
        gw.sm,
        CANCELLABLE,
        (MODELS / "cancellable").as_uri(),
        environment={"SAGEMAKER_MODEL_SERVER_WORKERS": "2"},
    )
    return gw


def notes(path: Path) -> list[str]:
    """The lines the model wrote to ``path`` (none yet: no file)."""
    return path.read_text().splitlines() if path.exists() else []


def cancelled(gw: GatewayProcess, stage: str) -> float:
    return metric(
        gw, "shipyard_cancelled_requests_total", endpoint=CANCELLABLE, variant="v1", stage=stage
    )


def test_a_client_that_leaves_while_its_request_runs_cancels_it(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    started, seen = tmp_path / "started", tmp_path / "cancelled"
    body = json.dumps({"started": str(started), "cancelled": str(seen)}).encode()
    address = urlsplit(gw.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as s:
        s.sendall(
            f"POST /endpoints/{CANCELLABLE}/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: notes(started), "the handler under way")
        assert in_flight(gw, CANCELLABLE) == 1
    # The work lasts 20 s unless the handler is told: told well before.
    wait_until(lambda: notes(seen), "the handler told it was cancelled", timeout_s=10)
    # The instance ran this worktree's runtime, the one that tells handlers.
    assert notes(started)[0].endswith("shipyard/__init__.py")
    wait_until(lambda: in_flight(gw, CANCELLABLE) == 0, "the instance given back")
    assert cancelled(gw, "running") == 1 and cancelled(gw, "queued") == 0
    # The instance is free again, and answers the next request.
    rt = gw.client("sagemaker-runtime", max_attempts=1)
    out = rt.invoke_endpoint(EndpointName=CANCELLABLE, Body=json.dumps({"work_s": 0}).encode())
    assert json.loads(out["Body"].read()) == {"cancelled": False}
    assert cancelled(gw, "running") == 1


def test_a_client_that_leaves_mid_stream_has_the_generator_closed_at_once(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """The generator works 20 s between its two chunks unless told; told, it yields its
    second, and is closed rather than pulled for more."""
    started, seen, closed = tmp_path / "started", tmp_path / "cancelled", tmp_path / "closed"
    request = {"stream": True, "started": str(started), "cancelled": str(seen)}
    request["closed"] = str(closed)
    address = urlsplit(gw.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    connection.request(
        "POST",
        f"/endpoints/{CANCELLABLE}/invocations-response-stream",
        body=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    assert answer.status == 200
    assert answer.read1(64)  # the first chunk's event is under way
    wait_until(lambda: notes(started), "the generator at work after its first chunk")
    connection.close()
    wait_until(lambda: notes(closed), "the generator closed", timeout_s=10)
    assert notes(seen), "the generator was told before it was closed"
    wait_until(lambda: in_flight(gw, CANCELLABLE) == 0, "the instance given back")
