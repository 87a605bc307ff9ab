"""Soak of asynchronous inference, with the gateway killed twice, and its memory with
large inputs.

Part 1: ASYNC_SOAK_COUNT (2,000) InvokeEndpointAsync requests against a 2-instance
asynchronous endpoint (a concurrent container-contract server, 4 in flight per instance)
while the gateway is killed with SIGKILL twice and started again on the same home and
port. Every request must end with exactly one output or failure file and one
notification. Reported: throughput end to end (requests / time from the first
submission to the last notification), and the time requests waited in the queue
(p50/p99, from the store's received and started times).

Part 2: ASYNC_SOAK_BIG_COUNT (3) requests with ASYNC_SOAK_BIG_MB (200) MB inputs each,
answered with a 200 MB output each (the server echoes the body back). Reported: the
gateway's peak RSS (VmHWM) against its RSS before.

    .venv/bin/python bench/async_soak.py
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from harness import HERE, Control, ServerProcess, entry, free_port, start_gateway, time_budget

COUNT = int(os.environ.get("ASYNC_SOAK_COUNT", "2000"))
BIG_COUNT = int(os.environ.get("ASYNC_SOAK_BIG_COUNT", "3"))
BIG_MB = int(os.environ.get("ASYNC_SOAK_BIG_MB", "200"))
SERVER = HERE / "models" / "async_echo.py"
TOPIC = "arn:aws:sns:us-east-1:123456789012:results"


class Hook(BaseHTTPRequestHandler):
    """Counts InferenceResult notifications per InferenceId."""

    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        message = json.loads(body["message"])
        if message.get("eventName") == "InferenceResult":
            with self.lock:
                self.counts[message["inferenceId"]] += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class Gateway:
    def __init__(self, home: Path, stack: Path) -> None:
        self.home, self.stack, self.port = home, stack, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ServerProcess | None = None
        self.killed: list[ServerProcess] = []
        self.start()

    def start(self) -> None:
        self.server, _ = start_gateway(
            self.home, port=self.port, args=["--config", str(self.stack)]
        )

    def kill(self) -> None:
        assert self.server is not None
        self.server.track()  # its instances outlive it; stop() stops them by PID
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait()
        self.killed.append(self.server)

    def stop(self) -> None:
        for server in [*self.killed, *([self.server] if self.server else [])]:
            server.stop()


def deploy(url: str, name: str, out: Path, count: int) -> None:
    control = Control(url)
    control.call("CreateModel", {
        "ModelName": name,
        "PrimaryContainer": {"Image": f"cmd:python {SERVER}", "ModelDataUrl": str(SERVER.parent)},
    })  # fmt: skip
    control.call("CreateEndpointConfig", {
        "EndpointConfigName": name,
        "ProductionVariants": [{"VariantName": "v1", "ModelName": name,
                                "InstanceType": "ml.m5.large", "InitialInstanceCount": count}],
        "AsyncInferenceConfig": {
            "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
            "OutputConfig": {"S3OutputPath": str(out / "ok"), "S3FailurePath": str(out / "failed"),
                             "NotificationConfig": {"SuccessTopic": TOPIC, "ErrorTopic": TOPIC}},
        },
    })  # fmt: skip
    control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})
    deadline = time.monotonic() + 120
    while control.call("DescribeEndpoint", {"EndpointName": name})["EndpointStatus"] != "InService":
        if time.monotonic() > deadline:
            raise TimeoutError("endpoint not InService")
        time.sleep(0.2)


def invoke(url: str, name: str, location: str, inference_id: str) -> int:
    request = urllib.request.Request(
        f"{url}/endpoints/{name}/async-invocations", data=b"", method="POST"
    )
    request.add_header("X-Amzn-SageMaker-InputLocation", location)
    request.add_header("X-Amzn-SageMaker-Inference-Id", inference_id)
    request.add_header("X-Amzn-SageMaker-Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def submit(gw: Gateway, name: str, inputs: list[str], ids: list[str], kills_at: set[int]) -> None:
    for index, (location, inference_id) in enumerate(zip(inputs, ids, strict=True)):
        if index in kills_at:
            gw.kill()
            gw.start()
        while invoke(gw.url, name, location, inference_id) != 202:
            time.sleep(0.1)  # the gateway is restarting; the same Inference-Id is idempotent


def soak(root: Path, stack: Path) -> dict[str, Any]:
    gw = Gateway(root / "home", stack)
    name, out = "soak", root / "out"
    try:
        deploy(gw.url, name, out, count=2)
        inputs = []
        for i in range(COUNT):
            path = root / "in" / f"{i}.bin"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"x" * 1024)
            inputs.append(str(path))
        ids = [f"soak-{i}-{uuid.uuid4().hex[:6]}" for i in range(COUNT)]
        started = time.monotonic()
        kills = set() if os.environ.get("ASYNC_SOAK_NO_KILL") else {COUNT // 3, 2 * COUNT // 3}
        submit(gw, name, inputs, ids, kills)
        submitted = time.monotonic() - started
        deadline = time.monotonic() + 900
        outputs_at = None
        while time.monotonic() < deadline and any(Hook.counts[i] == 0 for i in ids):
            if outputs_at is None and len(list((out / "ok").glob("*.out"))) >= COUNT:
                outputs_at = time.monotonic() - started
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        time.sleep(2)
    finally:
        gw.stop()
    outputs = {p.name for p in (out / "ok").glob("*.out")}
    failures = {p.name for p in (out / "failed").glob("*-error.out")}
    ends = Counter((f"{i}.out" in outputs) + (f"{i}-error.out" in failures) for i in ids)
    waits = _queue_times(root / "home" / "shipyard.db")
    return {
        "requests": COUNT,
        "outputs": len(outputs),
        "failures": len(failures),
        "requests with exactly one outcome file": ends[1],
        "notified exactly once": sum(1 for i in ids if Hook.counts[i] == 1),
        "notified more than once": sum(1 for i in ids if Hook.counts[i] > 1),
        "throughput req/s (end to end)": round(COUNT / elapsed, 1),
        "wall s: all submitted / all outputs / all notified": [
            round(submitted, 1),
            round(outputs_at or elapsed, 1),
            round(elapsed, 1),
        ],
        "queue time p50 ms": round(statistics.median(waits) * 1000, 1),
        "queue time p99 ms": round(waits[int(len(waits) * 0.99) - 1] * 1000, 1),
    }


def _queue_times(db: Path) -> list[float]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT received, started FROM async_requests").fetchall()
    waits = sorted(
        (datetime.fromisoformat(s) - datetime.fromisoformat(r)).total_seconds()
        for r, s in rows
        if s is not None
    )
    return waits


def big_inputs(root: Path, stack: Path) -> dict[str, Any]:
    gw = Gateway(root / "home-big", stack)
    name, out = "big", root / "out-big"
    try:
        deploy(gw.url, name, out, count=1)
        assert gw.server is not None
        pid = gw.server.process.pid
        before = _rss_kb(pid, "VmRSS")
        path = root / "big.bin"
        with open(path, "wb") as f:
            for _ in range(BIG_MB):
                f.write(os.urandom(1 << 20))
        for i in range(BIG_COUNT):
            assert invoke(gw.url, name, str(path), f"big-{i}") == 202
        deadline = time.monotonic() + 600
        while len(list((out / "ok").glob("*.out"))) < BIG_COUNT and time.monotonic() < deadline:
            time.sleep(0.2)
        peak = _rss_kb(pid, "VmHWM")
        sizes = [p.stat().st_size for p in (out / "ok").glob("*.out")]
    finally:
        gw.stop()
    return {
        "inputs": f"{BIG_COUNT} x {BIG_MB} MB (outputs the same size)",
        "outputs complete": sum(1 for s in sizes if s == BIG_MB << 20),
        "gateway RSS before MB": round(before / 1024, 1),
        "gateway peak RSS MB": round(peak / 1024, 1),
    }


def _rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="async-soak-"))
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    stack = root / "stack.yaml"
    port = hook.server_address[1]
    stack.write_text(yaml.safe_dump({"topics": {"results": [f"json://127.0.0.1:{port}/"]}}))
    try:
        with time_budget(1800):
            result = soak(root, stack)
            print(json.dumps(result, indent=2))
            big = big_inputs(root, stack)
            print(json.dumps(big, indent=2))
    finally:
        hook.shutdown()
    ok = result["requests with exactly one outcome file"] == COUNT
    return 0 if ok and result["notified exactly once"] == COUNT else 1


if __name__ == "__main__":
    entry(main)
