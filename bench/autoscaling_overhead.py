"""What a scaling policy costs the data path: two echo endpoints, one with a policy.

    .venv/bin/python bench/autoscaling_overhead.py      # DURATION=6 WARMUP=1 CONCS="1 8" ROUNDS=3

One gateway (``SHIPYARD_AUTOSCALING_PERIOD_S=1``: policies evaluated every second, the
most often any bench here asks for), two endpoints of one instance of the echo model of
``gateway_overhead.py``. ``scaled`` has a registered scalable target (MinCapacity =
MaxCapacity = 1) and a target-tracking policy on SageMakerVariantInvocationsPerInstance
(target 2,400 per minute, cooldowns 0): under wrk it asks for more instances every
second and the bounds keep it at 1, so the whole evaluation runs and no step is taken.
``plain`` has neither. For each concurrency and round, wrk (``-t1``, post.lua) loads one
and then the other, the order swapped every round (A/B, B/A, ...), so drift of this noisy
machine hits both alike. Per run: wrk's req/s and p50/p99, and what the gateway itself
says it added: the delta of its ``shipyard_overhead_latency_seconds`` histogram over the
measured run (the mean from _sum/_count; p50/p99 interpolated within its buckets, which
are 0.1, 0.25, 0.5, 1 ms... wide, so they are coarse).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autoscaling_step import scaling_client, scrape
from gateway_overhead import check, write_echo
from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    WrkResult,
    entry,
    env_float,
    env_ints,
    require_wrk,
    run_wrk,
    start_gateway,
    table,
    time_budget,
)

RESULTS = Path(__file__).resolve().parent / "results" / "autoscaling_overhead.md"
GATEWAY_ENV = {"SHIPYARD_AUTOSCALING_PERIOD_S": "1"}
ENDPOINTS = ("plain", "scaled")
HISTOGRAM = "shipyard_overhead_latency_seconds"


@dataclass(frozen=True)
class Overhead:
    """The gateway's own overhead histogram, over one measured run (seconds)."""

    count: float
    total: float
    buckets: list[tuple[float, float]]
    """(upper bound, cumulative count), ascending."""

    @property
    def mean_us(self) -> float:
        return self.total / self.count * 1e6 if self.count else float("nan")

    def quantile_us(self, q: float) -> float:
        """Linear interpolation within the bucket holding the q-th observation."""
        rank = q * self.count
        lower, below = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                inside = cumulative - below
                share = (rank - below) / inside if inside else 1.0
                return (lower + (upper - lower) * share) * 1e6
            lower, below = upper, cumulative
        return float("inf")


def overhead(url: str, endpoint: str) -> Overhead:
    count = total = 0.0
    buckets: dict[float, float] = {}
    for name, labels, value in scrape(url):
        if labels.get("endpoint") != endpoint:
            continue
        if name == HISTOGRAM + "_count":
            count += value
        elif name == HISTOGRAM + "_sum":
            total += value
        elif name == HISTOGRAM + "_bucket" and labels["le"] != "+Inf":
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    return Overhead(count, total, sorted(buckets.items()))


def delta(after: Overhead, before: Overhead) -> Overhead:
    earlier = dict(before.buckets)
    return Overhead(
        after.count - before.count,
        after.total - before.total,
        [(le, c - earlier.get(le, 0.0)) for le, c in after.buckets],
    )


@dataclass(frozen=True)
class Cell:
    conc: int
    round: int
    endpoint: str
    wrk: WrkResult
    gateway: Overhead


def set_up(url: str, model_dir: Path) -> None:
    control = Control(url)
    for name in ENDPOINTS:
        control.deploy(name, model_dir.as_uri(), count=1)
    aas = scaling_client(url)
    target = {
        "ServiceNamespace": "sagemaker",
        "ResourceId": "endpoint/scaled/variant/v1",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
    }
    aas.register_scalable_target(**target, MinCapacity=1, MaxCapacity=1)
    aas.put_scaling_policy(
        **target,
        PolicyName="bounded",
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": 2400.0,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
            },
            "ScaleOutCooldown": 0,
            "ScaleInCooldown": 0,
        },
    )


def measure_one(
    url: str, endpoint: str, conc: int, n: int, warmup_s: float, duration_s: float
) -> Cell:
    """A discarded warm-up run, then the measured one with the histogram read around it."""
    invoke = f"{url}/endpoints/{endpoint}/invocations"
    run_wrk(invoke, PEER_BODY, connections=conc, duration_s=warmup_s)
    before = overhead(url, endpoint)
    result = run_wrk(invoke, PEER_BODY, connections=conc, duration_s=duration_s)
    return Cell(conc, n, endpoint, result, delta(overhead(url, endpoint), before))


FIGURES: list[tuple[str, Callable[[Cell], float]]] = [
    ("req/s", lambda c: c.wrk.rps),
    ("wrk p50 ms", lambda c: c.wrk.p50_ms),
    ("wrk p99 ms", lambda c: c.wrk.p99_ms),
    ("overhead mean µs", lambda c: c.gateway.mean_us),
    ("overhead p50 µs", lambda c: c.gateway.quantile_us(0.5)),
    ("overhead p99 µs", lambda c: c.gateway.quantile_us(0.99)),
]


def render(cells: list[Cell], activities: int, counts: str, cfg: str) -> str:
    out = [
        f"# Autoscaling overhead ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)",
        "",
        f"`.venv/bin/python bench/autoscaling_overhead.py` ({cfg}); "
        f"`SHIPYARD_AUTOSCALING_PERIOD_S=1`. Body {PEER_BODY.name} "
        f"({len(PEER_BODY.read_bytes())} B), wrk -t1 -cC (post.lua). Overhead: the "
        "gateway's `shipyard_overhead_latency_seconds` over each measured run. Scaling "
        f"activities of `scaled` during the run: {activities}; instances at the end: {counts}.",
        "",
    ]
    rows = [
        [
            c.conc,
            c.round,
            c.endpoint,
            c.wrk.rps,
            c.wrk.p50_ms,
            c.wrk.p99_ms,
            c.gateway.mean_us,
            c.gateway.quantile_us(0.5),
            c.gateway.quantile_us(0.99),
            c.wrk.note,
        ]
        for c in cells
    ]
    headers = [
        "conc",
        "round",
        "endpoint",
        "req/s",
        "wrk p50 ms",
        "wrk p99 ms",
        "overhead mean µs",
        "overhead p50 µs",
        "overhead p99 µs",
        "errors",
    ]
    out += ["## Every run, in the order run\n", table(headers, rows), ""]
    rows = []
    for conc in sorted({c.conc for c in cells}):
        for label, pick in FIGURES:
            plain, scaled = (
                statistics.median(pick(c) for c in cells if c.conc == conc and c.endpoint == e)
                for e in ENDPOINTS
            )
            rows.append([conc, label, plain, scaled, f"{scaled / plain:.2f}" if plain else "-"])
    out += [
        "## Medians over the rounds\n",
        table(["conc", "figure", "plain", "scaled (policy)", "scaled / plain"], rows),
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 6.0)
    warmup_s = env_float("WARMUP", 1.0)
    concs = env_ints("CONCS", [1, 8])
    rounds = int(env_float("ROUNDS", 3))
    cfg = f'DURATION={duration_s:g} WARMUP={warmup_s:g} CONCS="{" ".join(map(str, concs))}" '
    cfg += f"ROUNDS={rounds}"
    budget = len(concs) * rounds * 2 * (duration_s + warmup_s + 10) + 120
    started: list[ServerProcess] = []
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp, time_budget(budget):
        work = Path(tmp)
        model_dir = work / "echo"
        write_echo(model_dir)
        try:
            gateway, url = start_gateway(work / "home", env=GATEWAY_ENV)
            started.append(gateway)
            set_up(url, model_dir)
            gateway.track()
            body = PEER_BODY.read_bytes()
            for name in ENDPOINTS:
                check(f"{url}/endpoints/{name}/invocations", body, "echo")
            for conc in concs:
                for n in range(1, rounds + 1):
                    order = ENDPOINTS if n % 2 else ENDPOINTS[::-1]
                    for endpoint in order:
                        cell = measure_one(url, endpoint, conc, n, warmup_s, duration_s)
                        cells.append(cell)
                        print(
                            f"  c={conc} round {n} {endpoint}: {cell.wrk.rps:,.0f} req/s, "
                            f"overhead mean {cell.gateway.mean_us:.0f} µs",
                            file=sys.stderr,
                        )
            aas = scaling_client(url)
            activities = len(
                aas.describe_scaling_activities(ServiceNamespace="sagemaker")["ScalingActivities"]
            )
            control = Control(url)
            counts = ", ".join(
                f"{name} {v.get('CurrentInstanceCount')}"
                for name in ENDPOINTS
                for v in control.call("DescribeEndpoint", {"EndpointName": name})[
                    "ProductionVariants"
                ]
            )
        finally:
            for server in started:
                left = server.stop()
                if left:
                    print(f"WARNING: {server} left PIDs alive: {left}", file=sys.stderr)
    report = render(cells, activities, counts, cfg)
    print(report)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    return 0


if __name__ == "__main__":
    entry(main)
