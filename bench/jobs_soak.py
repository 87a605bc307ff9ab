"""Soak of long-running jobs through ``POST /inference``, with the gateway killed twice.

200 short jobs (JOBS_SOAK_COUNT) are submitted through the facade with ``limit: 4``
while a watcher samples how many are active, and the gateway is killed with SIGKILL
twice mid-run and started again on the same home. At the end every job must be in a
final state, the number active at once must never have passed 4, and the webhook
subscriber must have heard each job's end exactly once.

Then the job start latency on the embedded default: the time from sending
``POST /inference`` to the runner process recording its first status line, over 20
sequential submissions on an idle gateway.

    .venv/bin/python bench/jobs_soak.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from harness import Control, ServerProcess, entry, free_port, post, start_gateway, time_budget

COUNT = int(os.environ.get("JOBS_SOAK_COUNT", "200"))
LIMIT = 4
SCRIPT = """\
import os, random, time
time.sleep(random.uniform(0.1, 0.4))
open(os.path.join(os.environ["SM_MODEL_DIR"], "done"), "w").write("ok")
"""
ENV = {"SHIPYARD_JOB_POLL_PERIOD_S": "0.2"}


class Hook(BaseHTTPRequestHandler):
    """Counts notifications per job name (apprise json:// posts title and message), and
    distinct delivery keys per job (what a receiver that drops redeliveries sees)."""

    counts: Counter[str] = Counter()
    keys: dict[str, set[str]] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        match = re.search(r"Job: (\S+)", body.get("message", ""))
        name = match.group(1) if match else "?"
        with self.lock:
            self.counts[name] += 1
            self.keys.setdefault(name, set()).add(self.headers.get("X-Shipyard-Delivery-Key", ""))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def write_stack(root: Path, hook_port: int) -> Path:
    code = root / "code"
    code.mkdir()
    (code / "short.py").write_text(SCRIPT)
    template = {
        "AlgorithmSpecification": {"TrainingImage": "shipyard/python", "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": "short.py",
            "sagemaker_submit_directory": code.as_uri(),
        },
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    }
    stack = {
        "topics": {"done": [f"json://127.0.0.1:{hook_port}/hook"]},
        "jobs": {
            "limit": LIMIT,
            "white_list": ["short"],
            "s3_bucket": (root / "out").as_uri(),
            "templates": {"short": template},
            "notify": {"Completed": ["done"], "Failed": ["done"], "Stopped": ["done"]},
        },
    }
    path = root / "stack.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def jobs(url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"MaxResults": 100}
    while True:
        page = Control(url).call("ListTrainingJobs", params)
        out += page["TrainingJobSummaries"]
        if "NextToken" not in page:
            return out
        params["NextToken"] = page["NextToken"]


class Gateway:
    """The gateway under test, restartable on the same home and port."""

    def __init__(self, home: Path, stack: Path) -> None:
        self.home, self.stack, self.port = home, stack, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ServerProcess | None = None
        self.start()

    def start(self) -> None:
        args = ["--config", str(self.stack)]
        self.server, _ = start_gateway(self.home, port=self.port, args=args, env=ENV)

    def kill(self) -> None:
        assert self.server is not None
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait()


def submit_all(gw: Gateway, kills_at: set[int]) -> tuple[list[str], int]:
    names: list[str] = []
    refusals = 0
    while len(names) < COUNT:
        if len(names) in kills_at:
            kills_at.discard(len(names))
            gw.kill()
            gw.start()
        try:
            status, body = post(gw.url + "/inference", b'{"type": "short"}', timeout_s=10)
        except OSError:
            time.sleep(0.1)
            continue
        if status == 200:
            names.append(json.loads(body)["jobName"])
        else:
            refusals += 1
            time.sleep(0.05)
    return names, refusals


def watch(gw: Gateway, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        try:
            active = [
                j for j in jobs(gw.url) if j["TrainingJobStatus"] in ("InProgress", "Stopping")
            ]
            peak[0] = max(peak[0], len(active))
        except Exception:
            pass  # the gateway is down between a kill and its restart
        time.sleep(0.05)


def soak(root: Path, hook_port: int) -> dict[str, Any]:
    gw = Gateway(root / "home", write_stack(root, hook_port))
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=watch, args=(gw, stop, peak), daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        names, refusals = submit_all(gw, {COUNT // 3, 2 * COUNT // 3})
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            final = [
                j
                for j in jobs(gw.url)
                if j["TrainingJobStatus"] in ("Completed", "Failed", "Stopped")
            ]
            if len(final) >= len(names):
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        # Deliveries held by a killed gateway are taken again once their lease passes.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(Hook.counts[n] == 0 for n in names):
            time.sleep(0.5)
        notified_s = time.monotonic() - started
        time.sleep(2)
        stop.set()
        summary = jobs(gw.url)
        for job in summary:
            if job["TrainingJobStatus"] != "Completed":
                described = Control(gw.url).call(
                    "DescribeTrainingJob", {"TrainingJobName": job["TrainingJobName"]}
                )
                print(
                    job["TrainingJobName"], job["TrainingJobStatus"], described.get("FailureReason")
                )
    finally:
        stop.set()
        if gw.server is not None:
            gw.server.stop()
    statuses = Counter(j["TrainingJobStatus"] for j in summary)
    notified = [Hook.counts[n] for n in names]
    return {
        "jobs": len(names),
        "refusals (502, retried)": refusals,
        "statuses": dict(statuses),
        "peak active": peak[0],
        "notified exactly once": sum(1 for c in notified if c == 1),
        "notified twice or more": sum(1 for c in notified if c > 1),
        "not notified": sum(1 for c in notified if c == 0),
        "distinct delivery keys per job": dict(Counter(len(Hook.keys.get(n, ())) for n in names)),
        "wall time s (all final)": round(elapsed, 1),
        "wall time s (all notified)": round(notified_s, 1),
        "jobs/s": round(len(names) / elapsed, 2),
    }


def start_latency(root: Path, hook_port: int) -> dict[str, float]:
    gw = Gateway(root / "home-latency", write_stack(root / "lat", hook_port))
    latencies = []
    try:
        for _ in range(20):
            sent = time.time()
            status, body = post(gw.url + "/inference", b'{"type": "short"}')
            assert status == 200, body
            name = json.loads(body)["jobName"]
            status_file = gw.home / "jobs" / name / "attempt-1" / "status.jsonl"
            while not status_file.exists() or not status_file.read_text().strip():
                time.sleep(0.005)
            first = json.loads(status_file.read_text().splitlines()[0])
            latencies.append(first["time"] - sent)
            while any(j["TrainingJobStatus"] == "InProgress" for j in jobs(gw.url)):
                time.sleep(0.05)
    finally:
        if gw.server is not None:
            gw.server.stop()
    latencies.sort()
    return {
        "p50 ms": round(statistics.median(latencies) * 1000, 1),
        "max ms": round(latencies[-1] * 1000, 1),
    }


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="jobs-soak-"))
    (root / "lat").mkdir()
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        with time_budget(1200):
            latency = start_latency(root, hook.server_address[1])
            print("job start latency (request -> runner's first status line):", latency)
            result = soak(root, hook.server_address[1])
            print(json.dumps(result, indent=2))
    finally:
        hook.shutdown()
        _stop_leftover_jobs(root)
        if not os.environ.get("JOBS_SOAK_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
        else:
            print("kept", root)
    ok = (
        result["peak active"] <= LIMIT
        and result["notified exactly once"] == result["jobs"]
        and sum(result["statuses"].values()) == result["jobs"]
    )
    return 0 if ok else 1


def _stop_leftover_jobs(root: Path) -> None:
    for pid_file in root.glob("home*/jobs/*/attempt-*/*.pid"):
        try:
            pid = int(pid_file.read_text())
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(pid_file.parent)):
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    entry(main)
