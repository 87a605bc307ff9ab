"""Serverless cold starts: request sent -> answer received, with no instance running.

    .venv/bin/python bench/serverless_cold_start.py  # N=20 GAP_S=5; needs .[bench] (sklearn)

Two gateways in turn, one without warm spares (``SHIPYARD_WARM_SPARES=0``) and one with
a spare kept (1, the default): a runtime process started ahead with the imports of the
serverless models it ran done (runtime/spare.py). Each has one serverless endpoint
(MemorySizeInMB 1024, MaxConcurrency 5) serving the peer harness's sklearn model
(``gateway_overhead.py``; echo without scikit-learn). Before each request the bench
waits until the variant has no instance (idle time 0.2 s) and GAP_S s more (a spare is
started 0.5 s after a start and takes a second or two to import; real cold starts are
spaced by the idle timeout, 300 s by default), so every request is a cold start; it
times the whole InvokeEndpoint call and reads the gateway's own ModelSetupTime for that
start (instance process started -> first good ``/ping``). The rest is the gateway's
share: routing, the wait, the prediction and the answer. For scale: a warm request to
the same endpoint, and a bare runtime process started and pinged by hand
(``start_runtime``), which is what a cold start costs without a spare.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gateway_overhead import write_echo, write_sklearn
from harness import (
    Control,
    entry,
    post,
    start_gateway,
    start_runtime,
    table,
    time_budget,
    wait_until,
)

RESULTS = Path(__file__).resolve().parent / "results" / "serverless_cold_start.md"
GAP_S = float(os.environ.get("GAP_S", "5"))
BODY_SKLEARN = json.dumps({"instances": [[0.1] * 20]}).encode()
BODY_ECHO = b'{"x": 1}'


def metric(url: str, name: str, endpoint: str) -> float:
    """Sum of the samples of ``name`` for ``endpoint`` in the gateway's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'endpoint="{endpoint}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)]


@dataclass
class Run:
    """One gateway's cold starts, with ``warm_spares`` spare processes kept."""

    warm_spares: int
    totals: list[float] = field(default_factory=list)
    setups: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    cold_starts: float = 0.0


def run_gateway(run: Run, work: Path, model_dir: Path, body: bytes, count: int) -> None:
    env = {
        **os.environ,
        "SHIPYARD_SERVERLESS_IDLE_S": "0.2",
        "SHIPYARD_HEALTH_CHECK_PERIOD_S": "0.2",
        "SHIPYARD_WARM_SPARES": str(run.warm_spares),
    }
    gateway, url = start_gateway(work / f"home-{run.warm_spares}", env=env)
    try:
        control = Control(url)
        name = "cold"
        control.call(
            "CreateModel",
            {
                "ModelName": name,
                "PrimaryContainer": {
                    "Image": "shipyard/python",
                    "ModelDataUrl": model_dir.as_uri(),
                },
                "ExecutionRoleArn": "arn:aws:iam::123456789012:role/bench",
            },
        )
        variant = {
            "VariantName": "v1",
            "ModelName": name,
            "ServerlessConfig": {"MemorySizeInMB": 1024, "MaxConcurrency": 5},
        }
        control.call(
            "CreateEndpointConfig", {"EndpointConfigName": name, "ProductionVariants": [variant]}
        )
        control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})

        def in_service() -> bool:
            described = control.call("DescribeEndpoint", {"EndpointName": name})
            return described["EndpointStatus"] == "InService"

        wait_until(in_service, 120, "InService")
        invocations = f"{url}/endpoints/{name}/invocations"
        for i in range(count + 1):
            wait_until(lambda: metric(url, "shipyard_instances", name) == 0, 30, "no instance")
            time.sleep(GAP_S)  # spares refill a moment after a start; cold starts are spaced
            setup_before = metric(url, "shipyard_model_setup_time_seconds_sum", name)
            started = time.perf_counter()
            status, answer = post(invocations, body)
            elapsed = time.perf_counter() - started
            if status != 200:
                raise RuntimeError(f"cold request answered {status}: {answer[:300]!r}")
            if i == 0:
                continue  # the first start of a model teaches the spares what to import
            run.totals.append(elapsed)
            run.setups.append(
                metric(url, "shipyard_model_setup_time_seconds_sum", name) - setup_before
            )
        for _ in range(20):
            started = time.perf_counter()
            post(invocations, body)
            run.warm.append(time.perf_counter() - started)
        run.cold_starts = metric(url, "shipyard_serverless_cold_starts_total", name) - 1
    finally:
        gateway.stop()


def main() -> int:
    count = int(os.environ.get("N", "20"))
    with tempfile.TemporaryDirectory() as tmp, time_budget(900):
        work = Path(tmp)
        model_dir = work / "model"
        kind = "sklearn" if write_sklearn(model_dir) else "echo"
        if kind == "echo":
            write_echo(model_dir)
        body = BODY_SKLEARN if kind == "sklearn" else BODY_ECHO

        floor = []
        for i in range(5):
            started = time.perf_counter()
            runtime, _ = start_runtime(model_dir, work / f"runtime-{i}.log")
            floor.append(time.perf_counter() - started)
            runtime.stop()
        runs = [Run(0), Run(1)]
        for run in runs:
            run_gateway(run, work, model_dir, body, count)
            print(f"  spares {run.warm_spares}: {len(run.totals)} cold starts", file=sys.stderr)

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.0f}"

    rows = []
    for run in runs:
        label = f"SHIPYARD_WARM_SPARES={run.warm_spares}"
        rest = [t - s for t, s in zip(run.totals, run.setups, strict=True)]
        rows += [
            [f"{label}: cold request, sent -> answered", ms(run.totals, 0.5),
             ms(run.totals, 0.99), len(run.totals)],
            ["  of which ModelSetupTime (start -> first /ping)", ms(run.setups, 0.5),
             ms(run.setups, 0.99), len(run.setups)],
            ["  of which the rest (route, wait, predict, answer)", ms(rest, 0.5),
             ms(rest, 0.99), len(rest)],
            [f"{label}: warm request", f"{statistics.median(run.warm) * 1000:.1f}",
             f"{percentile(run.warm, 0.99) * 1000:.1f}", len(run.warm)],
        ]  # fmt: skip
    rows.append(
        ["bare runtime process, start -> first /ping", ms(floor, 0.5), ms(floor, 0.99),
         len(floor)]
    )  # fmt: skip
    off, on = (percentile(r.totals, 0.5) for r in runs)
    report = "\n".join(
        [
            f"# Serverless cold starts ({kind} model, {time.strftime('%Y-%m-%d %H:%M')})",
            "",
            f"`.venv/bin/python bench/serverless_cold_start.py` (N={count}, GAP_S={GAP_S:g}): "
            f"per gateway, {count} cold starts after a first one (not counted, it teaches the "
            "spares what to import), each once the variant has no instance and "
            f"{GAP_S:g} s more. Cold-start p50 with a spare / without: {on / off:.2f}.",
            "",
            table(["what", "p50 ms", "p99 ms", "n"], rows),
            "",
        ]
    )
    print(report)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    short = [r for r in runs if r.cold_starts < count]
    for run in short:
        print(
            f"spares {run.warm_spares}: only {run.cold_starts:.0f} of {count} requests were "
            "cold starts",
            file=sys.stderr,
        )
    return 1 if short else 0


if __name__ == "__main__":
    entry(main)
