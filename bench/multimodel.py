"""Multi-model endpoints: cold and warm latency, and what affinity routing buys, in one run.

    .venv/bin/python bench/multimodel.py
    # MODELS=1000 CONC=8 ZIPF_S=1.0 ZIPF_WARMUP=5000 ZIPF_REQUESTS=20000 COLD=200 WARM=2000
    # ROUTINGS="affinity random"

MODELS small linear models (tests/runtime/mme_models.py; each holds 1 MiB of ballast so
its memory is measurable, and answers with coefficients of its own) under one prefix,
served by one endpoint of 2 instances whose memory budget (SHIPYARD_MODEL_CACHE_BYTES)
holds about a third of them. The same run is made twice, by two gateways one after the
other: multi-model routing ``affinity`` (the default) and ``random``
(``SHIPYARD_MULTI_MODEL_ROUTING=random``: the instance is picked at random, whatever
model it holds). Each run measures, with keep-alive HTTP clients in threads:

1. cold: the first call of COLD models, one at a time (each fetches its archive from the
   prefix, extracts and loads it);
2. warm: WARM calls of one loaded model, one at a time;
3. Zipf: CONC clients, each sending its share of a Zipf(ZIPF_S) stream over the models
   (the same stream for both runs); ZIPF_WARMUP requests fill the caches, then the hit
   rate and the evictions of the next ZIPF_REQUESTS are read from the gateway's
   /metrics (shipyard_model_cache_hits_total, _misses_total, shipyard_model_evictions_total);
4. the peak resident memory (VmHWM) of each instance process, next to its budget.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (
    ROLE_ARN,
    Control,
    ServerProcess,
    entry,
    env_float,
    start_gateway,
    table,
    time_budget,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
from mme_models import write_model

MIB = 2**20
INSTANCES = 2
BALLAST_MB = 1
POLICIES = ("affinity", "random")


@dataclass
class Run:
    policy: str
    cold_ms: list[float]
    warm_ms: list[float]
    zipf_ms: list[float]
    zipf_s: float
    hits: float
    misses: float
    evictions: float
    loaded: list[float]
    base_rss: list[int]
    """Each instance's resident bytes before it loaded any model."""
    peak_rss: list[int]
    errors: int


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def write_prefix(prefix: Path, count: int) -> list[str]:
    names = [f"model-{i:04d}.tar.gz" for i in range(count)]
    for name in names:
        write_model(prefix, name, ballast_mb=BALLAST_MB)
    for i in range(10):
        write_model(prefix, f"warmup-{i}.tar.gz")
    return names


def deploy(control: Control, prefix: Path, budget_bytes: int) -> None:
    container = {
        "Image": "shipyard/python",
        "Mode": "MultiModel",
        "ModelDataUrl": prefix.as_uri(),
        "Environment": {"SHIPYARD_MODEL_CACHE_BYTES": str(budget_bytes)},
    }
    control.call(
        "CreateModel",
        {"ModelName": "mme", "PrimaryContainer": container, "ExecutionRoleArn": ROLE_ARN},
    )
    variant = {
        "VariantName": "v1",
        "ModelName": "mme",
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": INSTANCES,
    }
    control.call(
        "CreateEndpointConfig", {"EndpointConfigName": "mme", "ProductionVariants": [variant]}
    )
    control.call("CreateEndpoint", {"EndpointName": "mme", "EndpointConfigName": "mme"})
    deadline = time.monotonic() + 120
    while (
        control.call("DescribeEndpoint", {"EndpointName": "mme"})["EndpointStatus"] != "InService"
    ):
        if time.monotonic() > deadline:
            raise TimeoutError("endpoint mme not InService after 120 s")
        time.sleep(0.2)


class Client:
    """One keep-alive connection to the gateway's runtime door."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def invoke(self, target: str) -> tuple[int, float]:
        """(status, latency in ms) of one invocation of ``target``."""
        started = time.perf_counter()
        self.conn.request(
            "POST",
            "/endpoints/mme/invocations",
            body=b"[[1, 2]]",
            headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": target},
        )
        reply = self.conn.getresponse()
        reply.read()
        return reply.status, (time.perf_counter() - started) * 1000


def sequential(client: Client, targets: list[str]) -> tuple[list[float], int]:
    latencies, errors = [], 0
    for target in targets:
        status, ms = client.invoke(target)
        latencies.append(ms)
        errors += status != 200
    return latencies, errors


def concurrent(url: str, streams: list[list[str]]) -> tuple[list[float], int, float]:
    """Each stream sent by its own client thread; latencies, errors, wall seconds."""
    results: list[tuple[list[float], int]] = [([], 0)] * len(streams)

    def work(i: int) -> None:
        results[i] = sequential(Client(url), streams[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(streams))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return [ms for lat, _ in results for ms in lat], sum(e for _, e in results), wall


def metric_sum(url: str, name: str) -> float:
    text = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=10)
    text.request("GET", "/metrics")
    body = text.getresponse().read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", body, re.M))


def metric_values(url: str, name: str) -> list[float]:
    conn = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=10)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    return [float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", body, re.M)]


def instance_memory(gateway: ServerProcess, field: str) -> list[int]:
    """``field`` of /proc/<pid>/status (VmRSS, VmHWM: peak) of each instance, in bytes."""
    sizes = []
    for pid in sorted(gateway.track()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found = re.search(rf"{field}:\s+(\d+) kB", status)
        if b"shipyard.runtime" in cmdline and found is not None:
            sizes.append(int(found.group(1)) * 1024)
    return sizes


def zipf_streams(names: list[str], s: float, total: int, conc: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** s for rank in range(len(names))]
    stream = rng.choices(names, weights, k=total)
    return [stream[i::conc] for i in range(conc)]


def run_policy(work: Path, policy: str, names: list[str], budget: int, cfg: dict[str, int]) -> Run:
    gateway, url = start_gateway(
        work / f"home-{policy}", env={"SHIPYARD_MULTI_MODEL_ROUTING": policy}
    )
    try:
        deploy(Control(url), work / "prefix", budget)
        base = instance_memory(gateway, "VmRSS")
        client = Client(url)
        sequential(client, [f"warmup-{i}.tar.gz" for i in range(10)])  # numpy imported
        cold, errors = sequential(client, names[-cfg["cold"] :])
        sequential(client, [names[0]] * 20)  # loaded wherever it will be sent
        warm, e = sequential(client, [names[0]] * cfg["warm"])
        errors += e
        conc, s = cfg["conc"], cfg["zipf_s"] / 100
        streams = zipf_streams(names, s, cfg["zipf_warmup"] + cfg["zipf_requests"], conc, 7)
        concurrent(url, [st[: cfg["zipf_warmup"] // conc] for st in streams])
        before = [metric_sum(url, f"shipyard_model_{m}_total") for m in COUNTERS]
        zipf, e, wall = concurrent(url, [st[cfg["zipf_warmup"] // conc :] for st in streams])
        after = [metric_sum(url, f"shipyard_model_{m}_total") for m in COUNTERS]
        hits, misses, evictions = (b - a for a, b in zip(before, after, strict=True))
        loaded = metric_values(url, "shipyard_loaded_models")
        peaks = instance_memory(gateway, "VmHWM")
        return Run(
            policy, cold, warm, zipf, wall, hits, misses, evictions, loaded, base, peaks, errors + e
        )
    finally:
        left = gateway.stop()
        if left:
            print(f"WARNING: PIDs alive after SIGKILL: {left}", file=sys.stderr)


COUNTERS = ("cache_hits", "cache_misses", "evictions")


def render(runs: list[Run], budget: int, cfg: dict[str, int]) -> str:
    latency = table(
        ["routing", "cold p50 ms", "cold p99 ms", "warm p50 ms", "warm p90 ms", "warm p99 ms"],
        [
            [r.policy, percentile(r.cold_ms, 0.5), percentile(r.cold_ms, 0.99),
             percentile(r.warm_ms, 0.5), percentile(r.warm_ms, 0.9), percentile(r.warm_ms, 0.99)]
            for r in runs
        ],
    )  # fmt: skip
    zipf = table(
        ["routing", "req/s", "p50 ms", "p99 ms", "cache hit rate", "evictions",
         "models loaded per instance", "peak RSS − RSS at start, per instance, MiB",
         "budget MiB", "errors"],
        [
            [r.policy, cfg["zipf_requests"] / r.zipf_s, percentile(r.zipf_ms, 0.5),
             percentile(r.zipf_ms, 0.99), f"{r.hits / max(r.hits + r.misses, 1):.3f}",
             int(r.evictions), " / ".join(f"{n:.0f}" for n in r.loaded),
             " / ".join(f"{(p - b) / MIB:.0f}" for p, b in zip(r.peak_rss, r.base_rss,
                                                                strict=False)),
             budget // MIB, r.errors]
            for r in runs
        ],
    )  # fmt: skip
    return latency + "\n\n" + zipf


def main() -> int:
    cfg = {
        "models": int(env_float("MODELS", 1000)),
        "cold": int(env_float("COLD", 200)),
        "warm": int(env_float("WARM", 2000)),
        "conc": int(env_float("CONC", 8)),
        "zipf_s": int(env_float("ZIPF_S", 1.0) * 100),
        "zipf_warmup": int(env_float("ZIPF_WARMUP", 5000)),
        "zipf_requests": int(env_float("ZIPF_REQUESTS", 20000)),
    }
    # A model measures ~1.1 MiB (its ballast and objects); the first one loaded also pays
    # for importing numpy (~12 MiB). A third of the models, plus that.
    budget = int((cfg["models"] / 3 * 1.1 + 12) * MIB)
    when = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="shipyard-mme-") as tmp, time_budget(900):
        work = Path(tmp)
        names = write_prefix(work / "prefix", cfg["models"])
        policies = os.environ.get("ROUTINGS", " ".join(POLICIES)).split()
        runs = [run_policy(work, policy, names, budget, cfg) for policy in policies]
    print(f"## Multi-model endpoint ({when}, {os.cpu_count()} cores)\n")
    print(
        f"{cfg['models']} models (1 MiB ballast each) under one file:// prefix, one endpoint "
        f"of {INSTANCES} instances, SHIPYARD_MODEL_CACHE_BYTES={budget} ({budget // MIB} MiB, "
        f"about a third of the models) each. cold: first call of {cfg['cold']} models, one at "
        f"a time; warm: {cfg['warm']} calls of one loaded model, one at a time; Zipf "
        f"s={cfg['zipf_s'] / 100:g}: {cfg['conc']} clients, {cfg['zipf_warmup']} requests to "
        f"fill the caches, then {cfg['zipf_requests']} measured. Latencies are the "
        "client's, through the gateway.\n"
    )
    print(render(runs, budget, cfg))
    print("\n" + json.dumps({r.policy: r.errors for r in runs}))
    return 0 if all(r.errors == 0 for r in runs) else 1


if __name__ == "__main__":
    entry(main)
