"""An instance told to stop (SIGTERM): what it was answering is answered first (also an
answer its client has not read yet, and a request the ping standby accepted while a call
held the loop), and an idle one closes its connections and exits.

Each test starts its own runtime process, since each stops it, and stops it by its PID
should the test fail first.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from tests.conftest import wait_until
from tests.e2e.processes import listening
from tests.runtime.test_runtime_contract import (
    Reply,
    Runtime,
    free_port,
    runtime_argv,
    spawn,
    stop,
    wait_ready,
)

CODE = """
import os
import time


def transform_fn(model, body, content_type, accept):
    if body.startswith(b"slow:"):
        open(os.environ["STARTED_FILE"], "w").close()
        time.sleep(float(body[5:]))
    if body.startswith(b"big:"):
        open(os.environ["STARTED_FILE"], "w").close()
        return b"x" * int(body[4:]), "application/octet-stream"
    return b"done:" + body, "text/plain"
"""


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Runtime]]:
    model_dir = tmp_path / "model"
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "code" / "inference.py").write_text(CODE)
    started: list[Runtime] = []

    def start(**env: str) -> Runtime:
        port = free_port()
        stderr_path = tmp_path / f"runtime-{port}.log"
        environ = {**os.environ, "STARTED_FILE": str(tmp_path / "started"), **env}
        process = spawn(runtime_argv(model_dir, port), environ, stderr_path)
        runtime = Runtime(port, process, stderr_path)
        started.append(runtime)
        wait_ready(runtime)
        return runtime

    try:
        yield start
    finally:
        for runtime in started:
            stop(runtime.process)


def exited_when_told(process: subprocess.Popen[bytes]) -> bool:
    """Whether it exited as uvicorn does after a clean shutdown on SIGTERM: the signal
    raised again once it is done."""
    return process.wait(timeout=10) in (0, -signal.SIGTERM)


@pytest.mark.parametrize("workers", ["1", "2"], ids=["inline", "threads"])
def test_a_request_in_flight_when_told_to_stop_is_answered_before_the_instance_exits(
    start: Callable[..., Runtime], tmp_path: Path, workers: str
) -> None:
    runtime = start(SAGEMAKER_MODEL_SERVER_WORKERS=workers)
    replies: list[Reply] = []
    caller = threading.Thread(target=lambda: replies.append(runtime.invoke(b"slow:1.0")))
    caller.start()
    try:
        wait_until(lambda: (tmp_path / "started").exists(), "the model began", 10)
        runtime.process.send_signal(signal.SIGTERM)
    finally:
        caller.join(timeout=15)
    assert replies and replies[0].status == 200
    assert replies[0].body == b"done:slow:1.0"
    assert exited_when_told(runtime.process)


def test_an_idle_instance_told_to_stop_closes_its_kept_alive_connections_and_exits(
    start: Callable[..., Runtime],
) -> None:
    runtime = start()
    kept = http.client.HTTPConnection("127.0.0.1", runtime.port, timeout=10)
    try:
        kept.request("POST", "/invocations", body=b"ping", headers={"Content-Type": "text/plain"})
        answer = kept.getresponse()
        assert (answer.status, answer.read()) == (200, b"done:ping")
        assert answer.getheader("connection", "keep-alive").lower() != "close"
        runtime.process.send_signal(signal.SIGTERM)
        assert exited_when_told(runtime.process)
        assert kept.sock is not None
        kept.sock.settimeout(10)
        assert kept.sock.recv(1) == b"", "the kept-alive connection is closed"
    finally:
        kept.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", runtime.port), 1):
        pass


def test_an_answer_not_yet_read_when_told_to_stop_arrives_whole(
    start: Callable[..., Runtime], tmp_path: Path
) -> None:
    size = 32 << 20  # far more than the sockets' buffers hold: most waits in the instance
    runtime = start()
    with socket.create_connection(("127.0.0.1", runtime.port), 10) as client:
        body = f"big:{size}".encode()
        head = f"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
        client.sendall(head.encode() + body)
        wait_until(lambda: (tmp_path / "started").exists(), "the model began", 10)
        runtime.process.send_signal(signal.SIGTERM)
        # Stopping (its port closed) while the answer waits for this client to read it.
        wait_until(lambda: not listening(runtime.process.pid), "the instance stopped listening", 10)
        client.settimeout(10)
        received = bytearray()
        while chunk := client.recv(1 << 20):
            received += chunk
    head_end = received.index(b"\r\n\r\n") + 4
    assert received.startswith(b"HTTP/1.1 200 ")
    assert len(received) - head_end == size
    assert exited_when_told(runtime.process)


def socket_count(pid: int) -> int:
    return len(psutil.Process(pid).net_connections(kind="tcp"))


def test_a_request_the_ping_standby_took_while_a_call_held_the_loop_is_answered(
    start: Callable[..., Runtime], tmp_path: Path
) -> None:
    runtime = start()  # one worker: handlers run inline, and the standby stands in
    replies: dict[str, Reply] = {}

    def call(tag: str, body: bytes) -> None:
        replies[tag] = runtime.invoke(body)

    slow = threading.Thread(target=call, args=("slow", b"slow:3.0"))
    slow.start()
    wait_until(lambda: (tmp_path / "started").exists(), "the model began", 10)
    sockets = socket_count(runtime.process.pid)
    later = threading.Thread(target=call, args=("later", b"later"))
    later.start()
    try:
        # The standby accepts it (one more socket in the instance) while the call holds
        # the loop, and hands it to the loop, which takes it only once the call is over.
        wait_until(lambda: socket_count(runtime.process.pid) > sockets, "the standby took it", 10)
        runtime.process.send_signal(signal.SIGTERM)
    finally:
        slow.join(timeout=15)
        later.join(timeout=15)
    assert replies["slow"].status == 200
    assert (replies["later"].status, replies["later"].body) == (200, b"done:later")
    assert exited_when_told(runtime.process)
