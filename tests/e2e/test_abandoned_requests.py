"""A request still waiting at the gateway for an instance when its client disconnects
leaves the queue: it is never sent to the model, it is counted as cancelled, and the
requests behind it move up. One already pipelined to the instance behind a running one
is left to run (the instance reads it whatever happens to the connection), uncounted:
each leaver is either cancelled or seen by the model, never both."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.conftest import MODELS, GatewayProcess, deploy, in_flight, wait_until
from tests.e2e.test_admission import metric


def cancelled(gw: GatewayProcess, endpoint: str) -> float:
    """Requests of ``endpoint`` cancelled by their clients, queued or running."""
    return metric(gw, "shipyard_cancelled_requests_total", endpoint=endpoint)


def seen(started: Path) -> int:
    """Leavers the model started, read now (one pipelined may start after the busy one)."""
    return started.read_text().split().count("gone")


def post_and_leave(gw: GatewayProcess, body: bytes, after_s: float) -> None:
    """POST ``body`` to endpoint ``queued``, then close the connection unanswered."""
    address = urlsplit(gw.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as s:
        s.sendall(
            b"POST /endpoints/queued/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(after_s)


def queued_endpoint(
    gateway_factory: Any, model_tarball: Any, tmp_path: Path
) -> tuple[GatewayProcess, Path, Any]:
    """A gateway with endpoint ``queued`` (the sleepy model, LEAST_OUTSTANDING_REQUESTS,
    one handler thread: the instance gets one request plus one pipelined, the gateway
    holds the rest), the file where the model notes each request it starts, and a
    runtime client."""
    gw = gateway_factory()
    started = tmp_path / "started"
    started.touch()
    deploy(
        gw.sm,
        "queued",
        model_tarball("sleepy"),
        strategy="LEAST_OUTSTANDING_REQUESTS",
        environment={"SLEEPY_STARTED_FILE": str(started), "SAGEMAKER_MODEL_SERVER_WORKERS": "1"},
    )
    return gw, started, gw.client("sagemaker-runtime", max_attempts=1)


def test_a_client_that_leaves_while_queued_is_never_served(
    gateway_factory: Any, model_tarball: Any, tmp_path: Path
) -> None:
    gw, started, rt = queued_endpoint(gateway_factory, model_tarball, tmp_path)
    answers: list[Any] = []

    def invoke(body: dict[str, Any]) -> None:
        out = rt.invoke_endpoint(EndpointName="queued", Body=json.dumps(body).encode())
        answers.append(json.loads(out["Body"].read()))

    busy = threading.Thread(target=invoke, args=({"sleep": 3, "tag": "busy"},))
    busy.start()
    wait_until(lambda: "busy" in started.read_text(), "the first request under way")
    leavers = [
        threading.Thread(target=post_and_leave, args=(gw, b'{"tag": "gone"}', 0.5))
        for _ in range(3)
    ]
    for leaver in leavers:
        leaver.start()
        time.sleep(0.05)
    for leaver in leavers:
        leaver.join()
    invoke({"tag": "stayed"})  # queued behind the leavers, answered after the busy one
    busy.join()
    # Nothing in flight or waiting at the gateway: nothing more can reach the instance.
    wait_until(lambda: in_flight(gw, "queued") == 0, "nothing left in flight")
    lines = started.read_text().split()
    assert lines.count("busy") == 1 and lines.count("stayed") == 1
    # At most the one request already pipelined to the instance was sent; the two (or
    # three) queued at the gateway left with their clients, each counted.
    assert lines.count("gone") <= 1, lines
    wait_until(lambda: cancelled(gw, "queued") + seen(started) == 3, "all counted")
    assert len(answers) == 2


def test_many_clients_that_leave_while_queued_leave_nothing_behind(
    gateway_factory: Any, model_tarball: Any, tmp_path: Path
) -> None:
    """Forty clients queue behind a busy instance and hang up at scattered times: none is
    served, none is left counted in flight or waiting, and the next client is served."""
    gw, started, rt = queued_endpoint(gateway_factory, model_tarball, tmp_path)

    def invoke(body: dict[str, Any]) -> dict[str, Any]:
        out = rt.invoke_endpoint(EndpointName="queued", Body=json.dumps(body).encode())
        return json.loads(out["Body"].read())

    answers: list[dict[str, Any]] = []
    busy = threading.Thread(target=lambda: answers.append(invoke({"sleep": 3, "tag": "busy"})))
    busy.start()
    wait_until(lambda: "busy" in started.read_text(), "the first request under way")
    leavers = [
        threading.Thread(
            target=post_and_leave, args=(gw, b'{"tag": "gone"}', 0.05 + 0.02 * (n % 20))
        )
        for n in range(40)
    ]
    for leaver in leavers:
        leaver.start()
    for leaver in leavers:
        leaver.join()
    # Everyone who came after the busy request has left; only it is in flight (and at most
    # one request pipelined behind it, already at the instance).
    wait_until(lambda: in_flight(gw, "queued") <= 2, "the leavers gone from the queue")
    busy.join()
    assert invoke({"tag": "stayed"})["slept"] == 0
    wait_until(lambda: in_flight(gw, "queued") == 0, "nothing left in flight")
    lines = started.read_text().split()
    assert lines.count("busy") == 1 and lines.count("stayed") == 1
    assert lines.count("gone") <= 1, lines
    wait_until(lambda: cancelled(gw, "queued") + seen(started) == 40, "all counted")
    assert len(answers) == 1


def _oip_body(seconds: float, tag: str) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "SLEEP", "shape": [1], "datatype": "FP32", "data": [seconds]},
                {"name": "TAG", "shape": [1], "datatype": "BYTES", "data": [tag]},
            ]
        }
    ).encode()


def test_an_oip_client_that_leaves_while_queued_is_never_served(
    gateway_factory: Any, tmp_path: Path
) -> None:
    """The Open Inference Protocol's REST door watches its clients as InvokeEndpoint
    does: an inference still waiting for an instance when its client hangs up is never
    sent to the model."""
    gw = gateway_factory()
    started = tmp_path / "started"
    started.touch()
    deploy(
        gw.sm,
        "tensors",
        (MODELS / "tensor_add").as_uri(),
        strategy="LEAST_OUTSTANDING_REQUESTS",
        environment={"TENSOR_STARTED_FILE": str(started), "SAGEMAKER_MODEL_SERVER_WORKERS": "1"},
    )
    address = urlsplit(gw.url)
    path = "/v2/models/tensors/infer"

    def infer(seconds: float, tag: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        conn.request("POST", path, _oip_body(seconds, tag), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
        return dict(json.loads(answer.read()))

    def infer_and_leave() -> None:
        body = _oip_body(0, "gone")
        with socket.create_connection((address.hostname, address.port), timeout=10) as s:
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.5)

    answers: list[dict[str, Any]] = []
    busy = threading.Thread(target=lambda: answers.append(infer(3, "busy")))
    busy.start()
    wait_until(lambda: "busy" in started.read_text(), "the first inference under way")
    leavers = [threading.Thread(target=infer_and_leave) for _ in range(3)]
    for leaver in leavers:
        leaver.start()
        time.sleep(0.05)
    for leaver in leavers:
        leaver.join()
    assert infer(0, "stayed")["outputs"][0]["name"] == "SLEPT"
    busy.join()
    lines = started.read_text().split()
    assert lines.count("busy") == 1 and lines.count("stayed") == 1
    # At most the one pipelined to the instance already was sent; the others left.
    assert lines.count("gone") <= 1, lines
    wait_until(lambda: cancelled(gw, "tensors") + seen(started) == 3, "all counted")
    assert len(answers) == 1
    wait_until(lambda: in_flight(gw, "tensors") == 0, "nothing left in flight")
