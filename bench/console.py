"""The console's server time with 100 endpoints and 1,000 jobs, and its cost to the data path.

    .venv/bin/python bench/console.py > bench/results/console.md
    # knobs: REPEAT=60 ROUNDS=5 DURATION=4 WARMUP=1 CONC=8

1. Fills a fresh home's store with 1,000 finished training jobs, written as the job service
   records them (JobStore, each with its state-change event), one with a 5,000-line log:
   running 1,000 real jobs would take an hour and measure nothing more.
2. Starts a gateway on it and creates 100 endpoints through the control plane: two real
   ones (an echo model; ``live-0`` with two variants, ``live-1`` with one) and 98 whose
   image is a container image, which the local backend refuses at once (Failed, with a
   reason: no instance process for them).
3. Times every console page and ``/console/api`` view (``REPEAT`` GETs each on one
   keep-alive connection, after 3 warm-ups), measured at the client over loopback, so an
   upper bound on the server's time.
4. Runs wrk against ``live-1`` three ways, alternated, five rounds: console idle;
   console polled as a busy operator would (4 views every 0.5 s, about 8 req/s, four
   times one open endpoint page); console hammered (its heaviest view, the jobs list,
   fetched back to back by one client). Invocations never reach the console's code (the
   gateway dispatches them before Starlette routes anything), so what the last column
   can cost is CPU share on this 2-core machine, not a place in the request path.
"""

from __future__ import annotations

import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gateway_overhead import write_echo
from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    cpu_seconds,
    entry,
    env_float,
    measure,
    post,
    require_wrk,
    start_gateway,
    table,
    time_budget,
)

JOBS = 1000
ENDPOINTS = 100
LOG_LINES = 5000


def fill_jobs(home: Path) -> str:
    """1,000 Completed jobs in the store, as the job service writes them; one job's name."""
    from shipyard.events.kinds import Announcer, training_job_event
    from shipyard.records import Job, JobStatus, StatusTransition
    from shipyard.settings import Settings
    from shipyard.storage.jobs import JobStore
    from shipyard.storage.metadata import MetadataStore

    home.mkdir(parents=True, exist_ok=True)
    store = MetadataStore(Settings(home=home).db_url)
    store.migrate()
    jobs = JobStore(store.engine)
    announce = Announcer(training_job_event, notify={})
    start = datetime.now(UTC) - timedelta(days=3)
    name = ""
    for n in range(JOBS):
        created = start + timedelta(minutes=4 * n)
        name = f"train-{n:04d}"
        steps = ("Starting", "Downloading", "Training", "Uploading", "Completed")
        transitions = tuple(
            StatusTransition(s, created + timedelta(seconds=30 * i), None, f"{s} step")
            for i, s in enumerate(steps)
        )
        job = Job(
            name=name,
            arn=f"arn:aws:sagemaker:us-east-1:000000000000:training-job/{name}",
            status=JobStatus.COMPLETED,
            secondary_status="Completed",
            request={"TrainingJobName": name, "HyperParameters": {"epochs": "3"}},
            created=created,
            modified=created + timedelta(minutes=3),
            job_type="model_a",
            model_artifacts=f"file:///srv/out/{name}/output/model.tar.gz",
            started=created,
            ended=created + timedelta(minutes=3),
            transitions=transitions,
        )
        jobs.create(job, limit=JOBS + 1, event_for=announce)
    log = home / "jobs" / name / "attempt-1" / "job.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        "".join(f"epoch {i // 100} step {i} loss {1 / (i + 1):.6f}\n" for i in range(LOG_LINES))
    )
    store.close()
    return name


def create_endpoints(control: Control, model_dir: Path) -> None:
    role = "arn:aws:iam::123456789012:role/bench"
    control.call(
        "CreateModel",
        {"ModelName": "echo", "PrimaryContainer": {"Image": "shipyard/python",
                                                    "ModelDataUrl": model_dir.as_uri()},
         "ExecutionRoleArn": role},
    )  # fmt: skip
    control.call(
        "CreateModel",
        {"ModelName": "container", "ExecutionRoleArn": role,
         "PrimaryContainer": {"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"}},
    )  # fmt: skip

    def variant(name: str, model: str, weight: float) -> dict[str, object]:
        return {"VariantName": name, "ModelName": model, "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1, "InitialVariantWeight": weight}  # fmt: skip

    configs = {
        "live-0": [variant("blue", "echo", 3), variant("green", "echo", 1)],
        "live-1": [variant("v1", "echo", 1)],
        **{f"ep-{n:03d}": [variant("v1", "container", 1)] for n in range(ENDPOINTS - 2)},
    }
    for name, variants in configs.items():
        control.call(
            "CreateEndpointConfig", {"EndpointConfigName": name, "ProductionVariants": variants}
        )
        control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        listed = control.call("ListEndpoints", {"MaxResults": 100})["Endpoints"]
        statuses = {e["EndpointName"]: e["EndpointStatus"] for e in listed}
        if statuses.get("live-0") == statuses.get("live-1") == "InService" and all(
            s in ("InService", "Failed") for s in statuses.values()
        ):
            return
        time.sleep(0.5)
    raise TimeoutError("endpoints did not settle")


class Client:
    """GETs on one keep-alive connection; each timed."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def get(self, path: str) -> tuple[float, int]:
        start = time.perf_counter()
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - start
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
        return elapsed, len(body)


def time_views(url: str, job: str, repeat: int, pid: int) -> list[list[object]]:
    client = Client(url)
    paths = [
        ("page", "/console"),
        ("page", "/console/endpoints/live-0"),
        ("page", f"/console/jobs/{job}"),
        ("static", "/console/static/console.js"),
        ("view", "/console/api/endpoints"),
        ("view", "/console/api/endpoints/live-0"),
        ("view", "/console/api/endpoints/ep-042"),
        ("json", "/console/api/endpoints/live-0/metrics"),
        ("view", "/console/api/jobs"),
        ("view", f"/console/api/jobs/{job}"),
        ("json", f"/console/api/jobs/{job}/log?offset=0"),
        ("json", f"/console/api/jobs/{job}/log?offset=tail"),
        ("view", "/console/api/events"),
        ("view", "/console/api/endpoints/live-0/history"),
        ("view", "/console/api/models"),
        ("view", "/console/api/endpoint-configs"),
        ("json", "/console/api/whoami"),
    ]
    rows: list[list[object]] = []
    for kind, path in paths:
        for _ in range(3):
            client.get(path)
        before = cpu_seconds(pid)
        samples = [client.get(path) for _ in range(repeat)]
        cpu_ms = (cpu_seconds(pid) - before) * 1000 / repeat
        ms = sorted(s[0] * 1000 for s in samples)
        p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
        size = f"{samples[0][1]:,}"
        rows.append([f"`{path}`", kind, size, cpu_ms, statistics.median(ms), p90, ms[-1]])
        print(f"  {path}: p50 {statistics.median(ms):.2f} ms", file=sys.stderr, flush=True)
    return rows


class Poller(threading.Thread):
    """Fetches console views in a loop until stopped: ``pause_s`` between rounds."""

    def __init__(self, url: str, paths: list[str], pause_s: float) -> None:
        super().__init__(daemon=True)
        self.client = Client(url)
        self.paths = paths
        self.pause_s = pause_s
        self.done = threading.Event()
        self.count = 0

    def run(self) -> None:
        while not self.done.is_set():
            for path in self.paths:
                self.client.get(path)
                self.count += 1
            if self.pause_s:
                self.done.wait(self.pause_s)


def data_path(
    url: str, duration_s: float, warmup_s: float, conc: int, rounds: int
) -> tuple[list[list[object]], list[list[object]]]:
    """Every round runs each mode once, in turn; returns the rounds and each mode's medians
    over them (robust to a burst of another process's work during one run)."""
    invoke = f"{url}/endpoints/live-1/invocations"
    modes = {
        "console idle": None,
        "console polled (~8 req/s)": (
            ["/console/api/endpoints", "/console/api/endpoints/live-1",
             "/console/api/endpoints/live-1/metrics", "/console/api/jobs"], 0.5),
        "console hammered (jobs list back to back)": (["/console/api/jobs"], 0.0),
    }  # fmt: skip
    rows: list[list[object]] = []
    for round_ in range(1, rounds + 1):
        for label, polling in modes.items():
            poller = Poller(url, *polling) if polling else None
            if poller:
                poller.start()
            try:
                result = measure(invoke, PEER_BODY, conc, warmup_s, duration_s)
            finally:
                if poller:
                    poller.done.set()
                    poller.join()
            rate = f"{poller.count / (duration_s + warmup_s):.0f}" if poller else "0"
            rows.append(
                [round_, label, rate, result.rps, result.p50_ms, result.p99_ms, result.errors]
            )
            print(f"  {label}: {result.rps:,.0f} req/s p99 {result.p99_ms:.2f} ms", file=sys.stderr)
    medians: list[list[object]] = []
    for label in modes:
        runs = [r for r in rows if r[1] == label]
        medians.append(
            [
                label,
                *(float(statistics.median(float(str(r[i])) for r in runs)) for i in (2, 3, 4, 5)),
            ]
        )
    return rows, medians


def main() -> int:
    require_wrk()
    repeat = int(env_float("REPEAT", 60))
    duration_s = env_float("DURATION", 4)
    warmup_s = env_float("WARMUP", 1)
    rounds = int(env_float("ROUNDS", 5))
    conc = int(env_float("CONC", 8))
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp, time_budget(900):
        work = Path(tmp)
        model_dir = work / "echo"
        write_echo(model_dir)
        print("filling the store with 1,000 jobs", file=sys.stderr, flush=True)
        job = fill_jobs(work / "home")
        gateway: ServerProcess | None = None
        try:
            # Each Failed endpoint still counts its desired instance against the quota.
            gateway, url = start_gateway(work / "home", env={"SHIPYARD_MAX_INSTANCES": "256"})
            control = Control(url)
            create_endpoints(control, model_dir)
            gateway.track()
            body = PEER_BODY.read_bytes()
            for name in ("live-0", "live-1"):
                for _ in range(50):
                    status, _answer = post(f"{url}/endpoints/{name}/invocations", body)
                    assert status == 200, status
            views = time_views(url, job, repeat, gateway.process.pid)
            load, medians = data_path(url, duration_s, warmup_s, conc, rounds)
        finally:
            if gateway is not None:
                gateway.stop()
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M")
    loadavg = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"## Console: server time and cost to the data path ({stamp}, {os.cpu_count()} cores)\n")
    print(f"Load average at the end of the run (1, 5, 15 min): {loadavg}.\n")
    print(
        f"Store: {ENDPOINTS} endpoints (2 serving, 98 Failed), {JOBS:,} training jobs with "
        f"their events, one job log of {LOG_LINES:,} lines. {repeat} GETs per path on one "
        "keep-alive connection after 3 warm-ups, timed at the client over loopback (ms), "
        "and the gateway process's own CPU time per GET (user + system, from /proc: "
        "steadier than wall time on a busy machine):\n"
    )
    print(table(["path", "kind", "bytes", "gateway CPU ms", "p50 ms", "p90 ms", "max ms"], views))
    print(
        f"\nData path: wrk -t1 -c{conc} on `live-1` (echo, one instance), "
        f"{warmup_s:g} s warm-up + {duration_s:g} s measured, body {PEER_BODY.name} "
        f"({len(PEER_BODY.read_bytes())} B), the three modes alternated, {rounds} rounds; "
        "medians over the rounds:\n"
    )
    print(table(["console", "console req/s", "req/s", "p50 ms", "p99 ms"], medians))
    print("\nEach round:\n")
    print(table(["round", "console", "console req/s", "req/s", "p50 ms", "p99 ms", "errors"], load))
    print(
        "\nCommand: `.venv/bin/python bench/console.py > bench/results/console.md`, at the "
        "commit that added this file's figures."
    )
    return 0


if __name__ == "__main__":
    entry(main)
