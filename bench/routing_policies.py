"""RANDOM against LEAST_OUTSTANDING_REQUESTS on a heavy-tailed model, in one run.

    .venv/bin/python bench/routing_policies.py     # DURATION=20 WARMUP=2 CONCS="8 4" ROUNDS=2

The model sleeps ~5 ms for 90 % of requests and ~300 ms for the other 10 %, drawn per
request from a seeded RNG that each instance owns (mean service time 34.5 ms). One
gateway serves it as two endpoints of 4 instances each, one per routing strategy; for each
concurrency wrk loads one endpoint, then the other (the order alternates every round, so
drift of this noisy machine does not favour either). An instance runs one request at a
time, so a request sent to an instance that is busy with a 300 ms one waits for it: that
wait is what LEAST_OUTSTANDING_REQUESTS should avoid. Target: its p99 at least 30 % below
RANDOM's.

Latencies are timed per request by ``timed.lua`` (wrk -tC -cC): wrk's own percentiles
include its coordinated-omission correction, which here would smear synthetic samples
below every 300 ms request.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    WrkResult,
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

INSTANCES = 4
TARGET_RATIO = 0.70  # LOR p99 / RANDOM p99 at most this
STRATEGIES = {"random": "RANDOM", "lor": "LEAST_OUTSTANDING_REQUESTS"}

HEAVY_TAIL_CODE = '''"""Heavy-tailed latency: 90 % of requests sleep ~5 ms, 10 % sleep ~300 ms."""

import json
import os
import random
import time


def model_fn(model_dir):
    # One RNG per instance: seeded from BENCH_SEED and the instance's own port, so the
    # instances draw different sequences (the same sequence everywhere would make them
    # slow in step).
    seed = f"{os.environ.get('BENCH_SEED', '0')}/{os.environ.get('SAGEMAKER_BIND_TO_PORT')}"
    return random.Random(seed)


def transform_fn(rng, body, content_type, accept):
    delay_s = 0.300 if rng.random() < 0.10 else 0.005
    time.sleep(delay_s * rng.uniform(0.95, 1.05))
    return json.dumps({"slept_ms": round(delay_s * 1000)}), "application/json"
'''


def write_model(model_dir: Path) -> None:
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "code" / "inference.py").write_text(HEAVY_TAIL_CODE)


def run(
    work: Path, concs: list[int], rounds: int, warmup_s: float, duration_s: float
) -> dict[tuple[int, str], list[WrkResult]]:
    model_dir = work / "heavy_tail"
    write_model(model_dir)
    gateway: ServerProcess | None = None
    try:
        gateway, url = start_gateway(work / "home")
        control = Control(url)
        for name, strategy in STRATEGIES.items():
            control.deploy(
                name,
                model_dir.as_uri(),
                count=INSTANCES,
                strategy=strategy,
                environment={"BENCH_SEED": "20261122"},
            )
        gateway.track()
        urls = {name: f"{url}/endpoints/{name}/invocations" for name in STRATEGIES}
        for name, invoke in urls.items():
            status, answer = post(invoke, PEER_BODY.read_bytes())
            if status != 200:
                raise RuntimeError(f"{name}: HTTP {status}: {answer[:300]!r}")
        results: dict[tuple[int, str], list[WrkResult]] = {}
        for r in range(rounds):
            for c in concs:
                order = list(STRATEGIES) if r % 2 == 0 else list(reversed(STRATEGIES))
                for name in order:
                    result = measure(urls[name], PEER_BODY, c, warmup_s, duration_s, raw=True)
                    results.setdefault((c, name), []).append(result)
                    print(
                        f"  round {r + 1} c={c} {name}: {result.rps:.0f} req/s "
                        f"p50 {result.p50_ms:.1f} p99 {result.p99_ms:.1f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
        return results
    finally:
        if gateway is not None:
            left = gateway.stop()
            if left:
                print(f"WARNING: PIDs alive after SIGKILL: {left}", file=sys.stderr)


def render(results: dict[tuple[int, str], list[WrkResult]], concs: list[int]) -> tuple[str, bool]:
    headers = ["conc", "strategy", "round", "req/s", "p50 ms", "p90 ms", "p99 ms"]
    headers += ["wrk's p99 ms", "busy cores", "errors"]
    rows: list[list[object]] = []
    verdict = ["", "| conc | p99 LOR / RANDOM (per round) | target ≤ 0.70 |", "|---|---|---|"]
    ok = True
    for c in concs:
        for name, strategy in STRATEGIES.items():
            for i, w in enumerate(results[(c, name)], 1):
                rows.append([c, strategy, i, w.rps, w.p50_ms, w.p90_ms, w.p99_ms])
                rows[-1] += [w.wrk_p99_ms, w.busy_cores, w.note]
        pairs = zip(results[(c, "lor")], results[(c, "random")], strict=True)
        ratios = [lor.p99_ms / rnd.p99_ms for lor, rnd in pairs]
        met = all(x <= TARGET_RATIO for x in ratios)
        ok = ok and met
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        verdict.append(f"| {c} | {shown} | {'met' if met else 'MISSED'} |")
    return table(headers, rows) + "\n" + "\n".join(verdict), ok


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 20.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [8, 4])
    rounds = int(env_float("ROUNDS", 2))
    budget = rounds * len(concs) * 2 * (warmup_s + duration_s + 15) + 180
    when = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp, time_budget(budget):
        results = run(Path(tmp), concs, rounds, warmup_s, duration_s)
    text, ok = render(results, concs)
    print(f"## Routing policies ({when}, {os.cpu_count()} cores)\n")
    print(
        f"Heavy-tailed model (90 % ~5 ms, 10 % ~300 ms; one request at a time per instance), "
        f"{INSTANCES} instances per endpoint, wrk -tC -cC with timed.lua, {warmup_s:g} s "
        f"warm-up + {duration_s:g} s measured per cell. Percentiles are of the requests' own "
        "latencies; wrk's p99 (after its coordinated-omission correction) is shown for "
        "reference. busy cores = CPU busy machine-wide during the run.\n"
    )
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    entry(main)
