"""What a hop of an inference pipeline costs: a Serial pipeline of 3 echo containers
against one echo container, side by side behind one gateway.

    .venv/bin/python bench/pipeline.py            # DURATION=8 WARMUP=2 CONCS="1 8" ROUNDS=3

One gateway serves two endpoints of one instance each: ``single`` (one echo container)
and ``pipe3`` (``Containers`` of three echo containers, InferenceExecutionConfig Serial;
each answer is the next request). For each concurrency, ROUNDS rounds run wrk against
one endpoint and then the other (a warm-up run, then a measured one), alternating so
that drift of this noisy machine hits both alike; the medians of the rounds are
reported. The pipeline makes two more hops than the single container, so the latency
one hop adds is (pipe3 - single) / 2, at p50 and p99. A hop is a whole extra exchange:
the gateway's send and parse, loopback both ways, and the echo runtime's own work.

``BASELINE_SRC=<dir>`` (the ``src`` folder of another checkout, e.g. from ``git archive
<rev> src``) starts a second gateway from that code with the same ``single`` endpoint,
measured in the same rounds: the single-container path before and after, side by side.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gateway_overhead import write_echo
from harness import (
    PEER_BODY,
    ROLE_ARN,
    Control,
    ServerProcess,
    WrkResult,
    cpu_probe_ms,
    entry,
    env_float,
    env_ints,
    measure,
    post,
    require_wrk,
    start_gateway,
    table,
    time_budget,
)

HOPS = 3


def deploy_pipeline(control: Control, name: str, model_url: str, containers: int) -> None:
    """Like Control.deploy, with ``containers`` echo containers in a Serial pipeline."""
    control.call(
        "CreateModel",
        {
            "ModelName": name,
            "Containers": [
                {"Image": "shipyard/python", "ModelDataUrl": model_url} for _ in range(containers)
            ],
            "InferenceExecutionConfig": {"Mode": "Serial"},
            "ExecutionRoleArn": ROLE_ARN,
        },
    )
    variant = {
        "VariantName": "v1",
        "ModelName": name,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }
    control.call(
        "CreateEndpointConfig", {"EndpointConfigName": name, "ProductionVariants": [variant]}
    )
    control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})
    deadline = time.monotonic() + 180
    while control.call("DescribeEndpoint", {"EndpointName": name})["EndpointStatus"] != "InService":
        if time.monotonic() > deadline:
            raise TimeoutError(f"endpoint {name} not InService")
        time.sleep(0.2)


def check(url: str, body: bytes) -> None:
    status, answer = post(url, body)
    if status != 200 or answer != body:
        raise RuntimeError(f"{url} answered {status}: {answer[:300]!r}")


Rows = list[tuple[int, dict[str, list[WrkResult]]]]


def run(
    work: Path,
    concs: list[int],
    rounds: int,
    warmup_s: float,
    duration_s: float,
    baseline_src: str | None,
) -> Rows:
    body = PEER_BODY.read_bytes()
    model_dir = work / "models" / "echo"
    write_echo(model_dir)
    started: list[ServerProcess] = []
    try:
        gateway, url = start_gateway(work / "home")
        started.append(gateway)
        control = Control(url)
        control.deploy("single", model_dir.as_uri())
        deploy_pipeline(control, "pipe3", model_dir.as_uri(), HOPS)
        urls = {
            "single": f"{url}/endpoints/single/invocations",
            "pipe3": f"{url}/endpoints/pipe3/invocations",
        }
        if baseline_src:
            before, before_url = start_gateway(
                work / "home-baseline", env={"PYTHONPATH": baseline_src}
            )
            started.append(before)
            Control(before_url).deploy("single", model_dir.as_uri())
            urls["baseline single"] = f"{before_url}/endpoints/single/invocations"
        for server in started:
            server.track()
        for target in urls.values():
            check(target, body)
        out = []
        for c in concs:
            results: dict[str, list[WrkResult]] = {name: [] for name in urls}
            for n in range(rounds):
                line = []
                for name, target in urls.items():
                    r = measure(target, PEER_BODY, c, warmup_s, duration_s)
                    results[name].append(r)
                    line.append(f"{name} p50 {r.p50_ms:.3f} p99 {r.p99_ms:.3f} {r.rps:,.0f}/s")
                print(f"  c={c} round {n + 1}: " + " | ".join(line), file=sys.stderr, flush=True)
            out.append((c, results))
        return out
    finally:
        for server in reversed(started):
            left = server.stop()
            if left:
                print(f"WARNING: {server} left PIDs alive after SIGKILL: {left}", file=sys.stderr)


def _median(results: list[WrkResult], field: str) -> float:
    return float(statistics.median(getattr(r, field) for r in results))


def render(rows: Rows) -> str:
    headers = [
        "conc",
        "single req/s",
        "single p50 ms",
        "single p99 ms",
        "pipe3 req/s",
        "pipe3 p50 ms",
        "pipe3 p99 ms",
        "per hop p50 ms",
        "per hop p99 ms",
        "req/s pipe3/single",
        "errors",
    ]
    out = []
    for c, results in rows:
        ones, threes = results["single"], results["pipe3"]
        p50_1, p99_1 = _median(ones, "p50_ms"), _median(ones, "p99_ms")
        p50_3, p99_3 = _median(threes, "p50_ms"), _median(threes, "p99_ms")
        rps_1, rps_3 = _median(ones, "rps"), _median(threes, "rps")
        errors = sum(r.errors for r in ones + threes)
        out.append(
            [
                c,
                rps_1,
                f"{p50_1:.3f}",
                f"{p99_1:.3f}",
                rps_3,
                f"{p50_3:.3f}",
                f"{p99_3:.3f}",
                f"{(p50_3 - p50_1) / (HOPS - 1):.3f}",
                f"{(p99_3 - p99_1) / (HOPS - 1):.3f}",
                f"{rps_3 / rps_1:.2f}" if rps_1 else "-",
                errors,
            ]
        )
    return table(headers, out)


def render_baseline(rows: Rows) -> str:
    """The single-container endpoint on this tree against the baseline tree's."""
    headers = ["conc", "baseline req/s", "baseline p50 ms", "baseline p99 ms"]
    headers += ["this req/s", "this p50 ms", "this p99 ms", "req/s this/baseline"]
    out = []
    for c, results in rows:
        now, before = results["single"], results["baseline single"]
        rps_now, rps_before = _median(now, "rps"), _median(before, "rps")
        out.append(
            [
                c,
                rps_before,
                f"{_median(before, 'p50_ms'):.3f}",
                f"{_median(before, 'p99_ms'):.3f}",
                rps_now,
                f"{_median(now, 'p50_ms'):.3f}",
                f"{_median(now, 'p99_ms'):.3f}",
                f"{rps_now / rps_before:.2f}" if rps_before else "-",
            ]
        )
    return table(headers, out)


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 8.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8])
    rounds = int(env_float("ROUNDS", 3))
    baseline_src = os.environ.get("BASELINE_SRC")
    runs = len(concs) * rounds * (3 if baseline_src else 2)
    budget = runs * (warmup_s + duration_s + 15) + 240
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp:
        probe_before = cpu_probe_ms()
        when = time.strftime("%Y-%m-%d %H:%M")
        with time_budget(budget):
            rows = run(Path(tmp), concs, rounds, warmup_s, duration_s, baseline_src)
        probe_after = cpu_probe_ms()
    print(f"## Inference pipeline: 3 echo containers vs 1 ({when}, {os.cpu_count()} cores)\n")
    print(
        f"wrk -t1 -cC, {warmup_s:g} s warm-up + {duration_s:g} s measured per run, {rounds} "
        f"rounds alternating single / pipe3, medians shown; body {PEER_BODY} "
        f"({len(PEER_BODY.read_bytes())} B); one instance per endpoint behind one gateway. "
        "Per hop = (pipe3 - single) / 2: the pipeline makes two more hops. "
        f"CPU probe {probe_before} ms before / {probe_after} ms after (lower = faster).\n"
    )
    print(render(rows))
    if baseline_src:
        print(f"\n### The single-container path: this tree vs {baseline_src}\n")
        print(render_baseline(rows))
    return 0


if __name__ == "__main__":
    entry(main)
