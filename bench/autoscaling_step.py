"""Target tracking under a step load: how fast a variant reaches 3 instances, what fails.

    .venv/bin/python bench/autoscaling_step.py
    # RATE=120 TAIL_RATE=10 PRE=5 STEADY=30 POLICIES="concurrency invocations concurrency-lor"

One gateway (``SHIPYARD_AUTOSCALING_PERIOD_S=1``, ``_WINDOW_S=10``), a model whose
``transform_fn`` sleeps 20 ms (one handler thread per instance: ~50 req/s each), and an
open-loop client: a pacer thread puts one request on a queue every 1/RATE s and 256
worker threads, each with its own keep-alive ``http.client`` connection, send them.
A request's latency runs from the moment it was due, so a late send counts against the
server (no coordinated omission). Every non-200 answer and every connection error is a
failure.

For each policy in POLICIES, an endpoint of 1 instance (RANDOM routing) is registered
with MinCapacity 1, MaxCapacity 3 and one target-tracking policy (ScaleOutCooldown 0,
ScaleInCooldown 10):

- ``concurrency``: SageMakerVariantConcurrentRequestsPerModelHighResolution, target 0.8
  requests in flight per instance (RATE x 20 ms = 2.4 in flight: 3 instances);
- ``invocations``: SageMakerVariantInvocationsPerInstance, target 2,400 per instance per
  minute (40 req/s, 80 % of one instance: RATE 120 asks for 3);
- ``concurrency-lor``: as ``concurrency``, on an endpoint routed LEAST_OUTSTANDING_REQUESTS
  (which holds requests at the gateway rather than on a busy instance).

The load is PRE s of nothing, then RATE req/s until the variant has 3 healthy instances
and STEADY s more, then TAIL_RATE req/s (a load one instance carries, so the scale-in
happens with requests in flight; 0 for none) until it is back to 1 instance. A thread
polls ``shipyard_instances{state="healthy"}`` on /metrics and DescribeEndpoint every
0.2 s. Last, an endpoint of 3 instances and no policy takes RATE for as long as the
longest step, and its latencies are cut into the same windows: the ramp (step to 3
healthy), the first SETTLE_S s at 3 (what queued during the ramp drains) and the rest.
"""

from __future__ import annotations

import http.client
import os
import queue
import re
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from harness import (
    Control,
    ServerProcess,
    entry,
    env_float,
    start_gateway,
    table,
    time_budget,
    wait_until,
)
from serverless_cold_start import percentile

RESULTS = Path(__file__).resolve().parent / "results" / "autoscaling_step.md"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
WORKERS = 256
BODY = b'{"x": 1}'
GATEWAY_ENV = {
    "SHIPYARD_AUTOSCALING_PERIOD_S": "1",
    "SHIPYARD_AUTOSCALING_WINDOW_S": "10",
}
SLEEPY_CODE = '''"""Sleeps 20 ms, then answers the body."""

import time


def transform_fn(model, body, content_type, accept):
    time.sleep(0.02)
    return body, "application/json"
'''
POLICIES = {
    "concurrency": ("SageMakerVariantConcurrentRequestsPerModelHighResolution", 0.8, "RANDOM"),
    "invocations": ("SageMakerVariantInvocationsPerInstance", 2400.0, "RANDOM"),
    "concurrency-lor": (
        "SageMakerVariantConcurrentRequestsPerModelHighResolution",
        0.8,
        "LEAST_OUTSTANDING_REQUESTS",
    ),
}
"""Policy name -> (PredefinedMetricType, TargetValue, the endpoint's RoutingStrategy)."""
SETTLE_S = 10.0
"""The steady part is cut in two: its first SETTLE_S s (the backlog drains), then the rest."""
COOLDOWNS = {"ScaleOutCooldown": 0, "ScaleInCooldown": 10}


# ----------------------------------------------------------------------------- /metrics
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the gateway's /metrics: (name, labels, value)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is not None:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def healthy(url: str, endpoint: str) -> int:
    return int(
        sum(
            v
            for name, labels, v in scrape(url)
            if name == "shipyard_instances"
            and labels.get("endpoint") == endpoint
            and labels.get("state") == "healthy"
        )
    )


# ----------------------------------------------------------------------------- the load
@dataclass(frozen=True, slots=True)
class Sample:
    due: float
    """When the request was due (monotonic); latency runs from here."""
    sent: float
    done: float
    status: int
    """HTTP status; 0 for a connection error."""
    error: str

    @property
    def latency_ms(self) -> float:
        return (self.done - self.due) * 1000


class OpenLoop:
    """A fixed-rate client: the pacer puts due times on a queue, workers send them."""

    def __init__(self, url: str, path: str, workers: int = WORKERS) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.path = path
        self.samples: list[Sample] = []
        self._due: queue.SimpleQueue[float | None] = queue.SimpleQueue()
        self._rate = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._pace, daemon=True)]
        self._threads += [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]

    def __repr__(self) -> str:
        return f"OpenLoop({self.path!r}, rate={self._rate:g}, samples={len(self.samples)})"

    def __enter__(self) -> OpenLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for _ in self._threads:
            self._due.put(None)
        for thread in self._threads:
            thread.join(timeout=70)

    def rate(self, per_s: float) -> None:
        self._rate = per_s

    def _pace(self) -> None:
        next_at: float | None = None
        while not self._stop.is_set():
            rate = self._rate
            now = time.monotonic()
            if rate <= 0:
                next_at = None
                time.sleep(0.005)
                continue
            if next_at is None:
                next_at = now
            if next_at > now:
                time.sleep(min(next_at - now, 0.005))
                continue
            self._due.put(next_at)
            next_at += 1 / rate

    def _work(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        headers = {"Content-Type": "application/json"}
        while (due := self._due.get()) is not None:
            sent = time.monotonic()
            try:
                conn.request("POST", self.path, BODY, headers)
                response = conn.getresponse()
                body = response.read()
                status = response.status
                error = "" if status == 200 else response.getheader("x-amzn-ErrorType") or ""
                if status != 200 and not error:
                    error = body[:80].decode(errors="replace")
            except (OSError, http.client.HTTPException) as exc:
                status, error = 0, type(exc).__name__
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            self.samples.append(Sample(due, sent, time.monotonic(), status, error))
        conn.close()


class Watch:
    """Every 0.2 s: healthy instances (/metrics) and DescribeEndpoint's counts."""

    def __init__(self, url: str, endpoint: str) -> None:
        self.url = url
        self.endpoint = endpoint
        self.control = Control(url)
        self.points: list[tuple[float, int, int, int]] = []
        """(monotonic, healthy, CurrentInstanceCount, DesiredInstanceCount)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __repr__(self) -> str:
        return f"Watch({self.endpoint!r}, points={len(self.points)})"

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            variant = self.control.call("DescribeEndpoint", {"EndpointName": self.endpoint})[
                "ProductionVariants"
            ][0]
            self.points.append(
                (
                    at,
                    healthy(self.url, self.endpoint),
                    int(variant.get("CurrentInstanceCount", -1)),
                    int(variant["DesiredInstanceCount"]),
                )
            )
            self._stop.wait(0.2)

    def last(self) -> tuple[float, int, int, int]:
        return self.points[-1] if self.points else (0.0, -1, -1, -1)

    def first(self, after: float, healthy: int) -> float | None:
        """When ``healthy`` instances were first seen at or after ``after``."""
        return next((p[0] for p in self.points if p[0] >= after and p[1] == healthy), None)

    def first_current(self, after: float, count: int) -> float | None:
        return next((p[0] for p in self.points if p[0] >= after and p[2] == count), None)


# ----------------------------------------------------------------------------- runs
@dataclass
class Run:
    name: str
    step: float
    """Monotonic time of the step; every offset below is from it."""
    step_wall: float
    three: float
    """When 3 healthy instances were first seen."""
    end: float
    """End of the step (the load drops to TAIL_RATE)."""
    back: float | None
    """When 1 healthy instance (and CurrentInstanceCount 1) was seen again."""
    samples: list[Sample]
    watch: list[tuple[float, int, int, int]]
    activities: list[dict[str, Any]] = field(default_factory=list)
    three_current: float | None = None


def window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return [s for s in samples if start <= s.due < end]


def latencies(samples: list[Sample]) -> tuple[str, str, int]:
    ok = [s.latency_ms for s in samples if s.status == 200]
    if not ok:
        return "-", "-", 0
    return f"{percentile(ok, 0.5):.1f}", f"{percentile(ok, 0.99):.1f}", len(ok)


def failures(samples: list[Sample]) -> str:
    bad: dict[str, int] = {}
    for s in samples:
        if s.status != 200:
            key = f"{s.status} {s.error}".strip()
            bad[key] = bad.get(key, 0) + 1
    return ", ".join(f"{n} × {k}" for k, n in sorted(bad.items())) or "0"


def scaling_client(url: str) -> Any:
    return boto3.client(
        "application-autoscaling",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


def deploy(
    control: Control, name: str, model_dir: Path, count: int, strategy: str = "RANDOM"
) -> None:
    environment = {"SAGEMAKER_MODEL_SERVER_WORKERS": "1"}
    control.deploy(
        name, model_dir.as_uri(), count=count, strategy=strategy, environment=environment
    )


def autoscaled(url: str, model_dir: Path, policy: str, cfg: dict[str, float]) -> Run:
    control = Control(url)
    name = f"step-{policy}"
    metric, value, strategy = POLICIES[policy]
    deploy(control, name, model_dir, 1, strategy)
    aas = scaling_client(url)
    resource = f"endpoint/{name}/variant/v1"
    target = {
        "ServiceNamespace": "sagemaker",
        "ResourceId": resource,
        "ScalableDimension": DIMENSION,
    }
    aas.register_scalable_target(**target, MinCapacity=1, MaxCapacity=3)
    aas.put_scaling_policy(
        **target,
        PolicyName=policy,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": value,
            "PredefinedMetricSpecification": {"PredefinedMetricType": metric},
            **COOLDOWNS,
        },
    )
    with Watch(url, name) as watch, OpenLoop(url, f"/endpoints/{name}/invocations") as load:
        time.sleep(cfg["pre"])
        step, step_wall = time.monotonic(), time.time()
        load.rate(cfg["rate"])
        wait_until(lambda: watch.last()[1] == 3, 120, f"{name}: 3 healthy instances")
        three = watch.last()[0]
        time.sleep(cfg["steady"])
        end = time.monotonic()
        load.rate(cfg["tail_rate"])
        back: float | None = None
        try:
            wait_until(lambda: watch.last()[1:3] == (1, 1), 120, f"{name}: back to 1 instance")
            back = watch.last()[0]
        except TimeoutError as exc:
            print(f"  {exc}", file=sys.stderr)
        time.sleep(1.0)
        load.rate(0)
        time.sleep(0.5)
    pages = aas.get_paginator("describe_scaling_activities").paginate(
        ServiceNamespace="sagemaker", ResourceId=resource
    )
    acts = [a for page in pages for a in page["ScalingActivities"]]
    control.call("DeleteEndpoint", {"EndpointName": name})
    run = Run(policy, step, step_wall, three, end, back, load.samples, watch.points)
    run.activities = sorted(acts, key=lambda a: a["StartTime"])
    run.three_current = next(
        (p[0] for p in watch.points if p[0] >= step and p[2] == 3), None
    )  # CurrentInstanceCount
    return run


def fixed(url: str, model_dir: Path, duration_s: float, cfg: dict[str, float]) -> Run:
    control = Control(url)
    name = "step-fixed3"
    deploy(control, name, model_dir, 3)
    with Watch(url, name) as watch, OpenLoop(url, f"/endpoints/{name}/invocations") as load:
        time.sleep(2.0)
        step, step_wall = time.monotonic(), time.time()
        load.rate(cfg["rate"])
        time.sleep(duration_s)
        end = time.monotonic()
        load.rate(0)
        time.sleep(1.0)
    control.call("DeleteEndpoint", {"EndpointName": name})
    return Run("fixed 3", step, step_wall, step, end, None, load.samples, watch.points)


# ----------------------------------------------------------------------------- report
def offset(run: Run, at: float | None) -> str:
    return "-" if at is None else f"{at - run.step:.1f}"


def render(runs: list[Run], fleet: Run, cfg: dict[str, float], notes: list[str]) -> str:
    out = [
        f"# Autoscaling under a step load ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores)",
        "",
        f"`.venv/bin/python bench/autoscaling_step.py` (RATE={cfg['rate']:g} "
        f"TAIL_RATE={cfg['tail_rate']:g} PRE={cfg['pre']:g} STEADY={cfg['steady']:g}). "
        "Gateway: "
        + ", ".join(f"`{k}={v}`" for k, v in GATEWAY_ENV.items())
        + "; the rest default (health checks every 2 s, 64 requests per instance before 503). "
        "Model: `transform_fn` sleeps 20 ms, one handler thread (~50 req/s per instance). "
        "Scalable target MinCapacity 1, MaxCapacity 3; ScaleOutCooldown "
        f"{COOLDOWNS['ScaleOutCooldown']}, ScaleInCooldown {COOLDOWNS['ScaleInCooldown']}. "
        "Latency: from the moment a request was due (open loop) to its answer, 200s only. "
        "Times in s from the step.",
        "",
    ]
    rows = []
    for r in runs:
        metric, value, strategy = POLICIES[r.name]
        rows.append(
            [
                f"{r.name} ({metric}, target {value:g}, {strategy})",
                offset(r, r.three),
                offset(r, r.three_current),
                f"{r.end - r.step:.1f}",
                "-" if r.back is None else f"{r.back - r.end:.1f}",
                max(p[1] for p in r.watch),
                failures(window(r.samples, r.step, r.three)),
                failures(window(r.samples, r.three, r.end)),
                failures(window(r.samples, r.end, float("inf"))),
                len(r.samples),
            ]
        )
    out.append("## Scaling\n")
    out.append(
        table(
            [
                "policy",
                "step → 3 healthy (/metrics)",
                "step → CurrentInstanceCount 3",
                "step length",
                "load end → back to 1",
                "most healthy seen",
                "failed: ramp",
                "failed: steady",
                "failed: scale-in (tail)",
                "requests",
            ],
            rows,
        )
    )
    out.append("\n## Latency, autoscaled vs a fixed fleet of 3 at the same rate\n")
    rows = []
    for r in runs:
        ramp, length = r.three - r.step, r.end - r.step
        for label, start, stop in (
            ("ramp (step → 3 healthy)", 0.0, ramp),
            (f"steady, first {SETTLE_S:g} s", ramp, ramp + SETTLE_S),
            ("steady, the rest", ramp + SETTLE_S, length),
            ("steady, all", ramp, length),
        ):
            a = latencies(window(r.samples, r.step + start, r.step + stop))
            f = latencies(window(fleet.samples, fleet.step + start, fleet.step + stop))
            fail = failures(window(fleet.samples, fleet.step + start, fleet.step + stop))
            rows.append([r.name, label, f"{start:.1f}–{stop:.1f}", *a, *f, fail])
    out.append(
        table(
            [
                "policy",
                "window",
                "s from step",
                "autoscaled p50 ms",
                "autoscaled p99 ms",
                "n",
                "fixed 3 p50 ms",
                "fixed 3 p99 ms",
                "n",
                "fixed 3 failed",
            ],
            rows,
        )
    )
    whole = latencies(window(fleet.samples, fleet.step, fleet.end))
    out.append(
        f"\nFixed fleet, whole step ({fleet.end - fleet.step:.0f} s): p50 {whole[0]} ms, "
        f"p99 {whole[1]} ms, {whole[2]} answered, failed: {failures(fleet.samples)}."
    )
    out.append("\n## Scaling activities\n")
    rows = []
    for r in runs:
        for a in r.activities:
            end = a.get("EndTime")
            rows.append(
                [
                    r.name,
                    f"{a['StartTime'].timestamp() - r.step_wall:.1f}",
                    "-" if end is None else f"{end.timestamp() - r.step_wall:.1f}",
                    a["StatusCode"],
                    a["Description"],
                    a["Cause"].split(" ", 2)[-1],
                ]
            )
    out.append(table(["policy", "start", "end", "status", "description", "cause"], rows))
    out.append("\n## Instances over time (healthy / CurrentInstanceCount / Desired)\n")
    for r in runs:
        changes, last = [], None
        for at, h, cur, want in r.watch:
            if (h, cur, want) != last:
                changes.append(f"{at - r.step:+.1f}s {h}/{cur}/{want}")
                last = (h, cur, want)
        out.append(f"- {r.name}: " + ", ".join(changes))
    out += ["", *notes]
    return "\n".join(out) + "\n"


def main() -> int:
    cfg = {
        "rate": env_float("RATE", 120.0),
        "tail_rate": env_float("TAIL_RATE", 10.0),
        "pre": env_float("PRE", 5.0),
        "steady": env_float("STEADY", 30.0),
    }
    policies = os.environ.get("POLICIES", " ".join(POLICIES)).split()
    started: list[ServerProcess] = []
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp, time_budget(600):
        work = Path(tmp)
        model_dir = work / "sleepy"
        (model_dir / "code").mkdir(parents=True)
        (model_dir / "code" / "inference.py").write_text(SLEEPY_CODE)
        try:
            gateway, url = start_gateway(work / "home", env=GATEWAY_ENV)
            started.append(gateway)
            runs = []
            for policy in policies:
                runs.append(autoscaled(url, model_dir, policy, cfg))
                gateway.track()
                print(
                    f"  {policy}: 3 healthy after {runs[-1].three - runs[-1].step:.1f} s",
                    file=sys.stderr,
                )
            longest = max(r.end - r.step for r in runs)
            fleet = fixed(url, model_dir, longest, cfg)
            gateway.track()
        finally:
            for server in started:
                left = server.stop()
                if left:
                    print(f"WARNING: {server} left PIDs alive: {left}", file=sys.stderr)
    report = render(runs, fleet, cfg, [])
    print(report)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    return 0


if __name__ == "__main__":
    entry(main)
