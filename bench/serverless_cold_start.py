"""Serverless cold starts: request sent -> answer received, with no instance running.

    .venv/bin/python bench/serverless_cold_start.py     # N=20; needs .[bench] (sklearn)

One gateway, one serverless endpoint (MemorySizeInMB 1024, MaxConcurrency 5) serving
the peer harness's sklearn model (``gateway_overhead.py``; echo without scikit-learn).
Before each request the bench waits until the variant has no instance (idle time
0.2 s), so every request is a cold start; it times the whole InvokeEndpoint call and
reads the gateway's own ModelSetupTime for that start (instance process started ->
first good ``/ping``). The rest is the gateway's share: routing, the wait, the
prediction and the answer. For scale: a warm request to the same endpoint, and a bare
runtime process started and pinged by hand (``start_runtime``), which is the floor a
cold start can reach without keeping processes ready.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
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

        env = {
            **os.environ,
            "SHIPYARD_SERVERLESS_IDLE_S": "0.2",
            "SHIPYARD_HEALTH_CHECK_PERIOD_S": "0.2",
        }
        gateway, url = start_gateway(work / "home", env=env)
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
                "CreateEndpointConfig",
                {"EndpointConfigName": name, "ProductionVariants": [variant]},
            )
            control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})

            def in_service() -> bool:
                described = control.call("DescribeEndpoint", {"EndpointName": name})
                return described["EndpointStatus"] == "InService"

            wait_until(in_service, 120, "InService")
            invocations = f"{url}/endpoints/{name}/invocations"
            totals, setups = [], []
            for _ in range(count):
                wait_until(lambda: metric(url, "shipyard_instances", name) == 0, 30, "no instance")
                setup_before = metric(url, "shipyard_model_setup_time_seconds_sum", name)
                started = time.perf_counter()
                status, answer = post(invocations, body)
                totals.append(time.perf_counter() - started)
                if status != 200:
                    raise RuntimeError(f"cold request answered {status}: {answer[:300]!r}")
                setups.append(
                    metric(url, "shipyard_model_setup_time_seconds_sum", name) - setup_before
                )
            warm = []
            for _ in range(20):
                started = time.perf_counter()
                post(invocations, body)
                warm.append(time.perf_counter() - started)
            cold_starts = metric(url, "shipyard_serverless_cold_starts_total", name)
        finally:
            gateway.stop()

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.0f}"

    rest = [t - s for t, s in zip(totals, setups, strict=True)]
    rows = [
        ["cold request, sent -> answered", ms(totals, 0.5), ms(totals, 0.99), len(totals)],
        ["  of which ModelSetupTime (start -> first /ping)", ms(setups, 0.5), ms(setups, 0.99),
         len(setups)],
        ["  of which the rest (route, wait, predict, answer)", ms(rest, 0.5), ms(rest, 0.99),
         len(rest)],
        ["bare runtime process, start -> first /ping", ms(floor, 0.5), ms(floor, 0.99),
         len(floor)],
        ["warm request", f"{statistics.median(warm) * 1000:.1f}",
         f"{percentile(warm, 0.99) * 1000:.1f}", len(warm)],
    ]  # fmt: skip
    report = "\n".join(
        [
            f"# Serverless cold starts ({kind} model, {time.strftime('%Y-%m-%d')})",
            "",
            f"`.venv/bin/python bench/serverless_cold_start.py` (N={count}); "
            f"{cold_starts:.0f} cold starts counted by the gateway.",
            "",
            table(["what", "p50 ms", "p99 ms", "n"], rows),
            "",
        ]
    )
    print(report)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    if cold_starts < count:
        print(f"only {cold_starts:.0f} of {count} requests were cold starts", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    entry(main)
