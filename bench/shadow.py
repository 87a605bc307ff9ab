"""What a shadow variant costs the production traffic: an echo endpoint with no shadow,
with a shadow that gets a copy of every request, and with one that gets a tenth of them,
side by side behind one gateway.

    .venv/bin/python bench/shadow.py            # DURATION=8 WARMUP=2 CONCS="1 8" ROUNDS=3

One gateway serves three endpoints, each with one echo instance as its production
variant: ``off`` (no shadow), ``all`` (a shadow echo instance of equal weight: every
request is copied) and ``tenth`` (shadow weight 0.1: a tenth are copied). For each
concurrency, ROUNDS rounds run wrk against each endpoint in turn (a warm-up run, then a
measured one; each round starts one endpoint further), so drift of this noisy machine
hits them alike; the medians of the rounds are reported, with the ratios to ``off``.
The copies are counted from /metrics: answered by the shadow, and dropped because too
many were pending.

Everything shares this machine's cores: wrk, the gateway, the production instance and the
shadow's. So with every request copied, the shadow's instance (at nice 10, below the
production one) and the gateway's second exchange take CPU the production path would
otherwise have; on SageMaker the shadow runs on instances of its own, and only the
gateway's share would remain.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

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

SHADOW_WEIGHTS = {"off": None, "all": 1.0, "tenth": 0.1}


def deploy(control: Control, name: str, model_url: str, shadow_weight: float | None) -> None:
    """An echo endpoint, with an echo shadow of ``shadow_weight`` unless None."""
    container = {"Image": "shipyard/python", "ModelDataUrl": model_url}
    control.call(
        "CreateModel",
        {"ModelName": name, "PrimaryContainer": container, "ExecutionRoleArn": ROLE_ARN},
    )

    def variant(variant_name: str, weight: float) -> dict[str, Any]:
        return {
            "VariantName": variant_name,
            "ModelName": name,
            "InstanceType": "ml.m5.large",
            "InitialInstanceCount": 1,
            "InitialVariantWeight": weight,
        }

    config: dict[str, Any] = {
        "EndpointConfigName": name,
        "ProductionVariants": [variant("prod", 1.0)],
    }
    if shadow_weight is not None:
        config["ShadowProductionVariants"] = [variant("shadow", shadow_weight)]
    control.call("CreateEndpointConfig", config)
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


def shadow_counts(url: str, endpoint: str) -> tuple[float, float]:
    """(copies the shadow answered, copies dropped) for ``endpoint``, from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    labels = f'{{endpoint="{endpoint}",variant="shadow"}} '
    answered = dropped = 0.0
    for line in text.splitlines():
        if line.startswith("shipyard_invocations_total" + labels):
            answered = float(line.rsplit(" ", 1)[1])
        elif line.startswith("shipyard_shadow_copies_dropped_total" + labels):
            dropped = float(line.rsplit(" ", 1)[1])
    return answered, dropped


Rows = list[tuple[int, dict[str, list[WrkResult]]]]


def run(
    work: Path, concs: list[int], rounds: int, warmup_s: float, duration_s: float
) -> tuple[Rows, dict[str, tuple[float, float]]]:
    body = PEER_BODY.read_bytes()
    model_dir = work / "models" / "echo"
    write_echo(model_dir)
    gateway: ServerProcess | None = None
    try:
        gateway, url = start_gateway(work / "home")
        control = Control(url)
        for name, weight in SHADOW_WEIGHTS.items():
            deploy(control, name, model_dir.as_uri(), weight)
        gateway.track()
        targets = {name: f"{url}/endpoints/{name}/invocations" for name in SHADOW_WEIGHTS}
        for target in targets.values():
            check(target, body)
        out = []
        for c in concs:
            results: dict[str, list[WrkResult]] = {name: [] for name in targets}
            for n in range(rounds):
                line = []
                # Each round starts with the next endpoint, so none always follows "all".
                order = list(targets)[n % len(targets) :] + list(targets)[: n % len(targets)]
                for name in order:
                    r = measure(targets[name], PEER_BODY, c, warmup_s, duration_s)
                    results[name].append(r)
                    line.append(f"{name} p50 {r.p50_ms:.3f} p99 {r.p99_ms:.3f} {r.rps:,.0f}/s")
                print(f"  c={c} round {n + 1}: " + " | ".join(line), file=sys.stderr, flush=True)
            out.append((c, results))
        time.sleep(1.0)  # the last copies answer
        copies = {name: shadow_counts(url, name) for name in ("all", "tenth")}
        return out, copies
    finally:
        if gateway is not None:
            left = gateway.stop()
            if left:
                print(f"WARNING: {gateway} left PIDs alive after SIGKILL: {left}", file=sys.stderr)


def _median(results: list[WrkResult], field: str) -> float:
    return float(statistics.median(getattr(r, field) for r in results))


def render(rows: Rows) -> str:
    headers = ["conc", "shadow", "req/s", "p50 ms", "p99 ms", "req/s vs off", "p99 vs off"]
    headers += ["errors"]
    out: list[list[object]] = []
    for c, results in rows:
        off_rps, off_p99 = _median(results["off"], "rps"), _median(results["off"], "p99_ms")
        for name, runs in results.items():
            rps, p99 = _median(runs, "rps"), _median(runs, "p99_ms")
            out.append(
                [
                    c,
                    name,
                    rps,
                    f"{_median(runs, 'p50_ms'):.3f}",
                    f"{p99:.3f}",
                    f"{rps / off_rps:.2f}" if off_rps else "-",
                    f"{p99 / off_p99:.2f}" if off_p99 else "-",
                    sum(r.errors for r in runs),
                ]
            )
    return table(headers, out)


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 8.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8])
    rounds = int(env_float("ROUNDS", 3))
    runs = len(concs) * rounds * len(SHADOW_WEIGHTS)
    budget = runs * (warmup_s + duration_s + 15) + 240
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp:
        probe_before = cpu_probe_ms()
        when = time.strftime("%Y-%m-%d %H:%M")
        with time_budget(budget):
            rows, copies = run(Path(tmp), concs, rounds, warmup_s, duration_s)
        probe_after = cpu_probe_ms()
    print(f"## Shadow variants: production traffic with the shadow on vs off ({when}, ", end="")
    print(f"{os.cpu_count()} cores)\n")
    print(
        f"wrk -t1 -cC, {warmup_s:g} s warm-up + {duration_s:g} s measured per run, {rounds} "
        f"rounds of off / all / tenth (each starting one further), medians shown; "
        f"body {PEER_BODY} "
        f"({len(PEER_BODY.read_bytes())} B); one echo instance per variant behind one "
        "gateway; latencies and req/s are the production answers the client saw. "
        f"CPU probe {probe_before} ms before / {probe_after} ms after (lower = faster).\n"
    )
    print(render(rows))
    print()
    for name, (answered, dropped) in copies.items():
        print(f"- `{name}`: the shadow answered {answered:,.0f} copies, {dropped:,.0f} dropped")
    return 0


if __name__ == "__main__":
    entry(main)
