"""What the gateway adds: the same model invoked on its runtime directly and through the gateway.

    .venv/bin/python bench/gateway_overhead.py            # DURATION=8 WARMUP=2 CONCS="1 8 32"

For each model (``echo``; ``sklearn`` too when scikit-learn is importable) this starts one
standalone runtime process (``python -m shipyard.runtime``, ``POST /invocations``) and one
gateway with an endpoint of one instance of the same model directory, then, for each
concurrency, runs wrk against the runtime and then against the gateway (a warm-up run,
then a measured one), alternating so that drift of this noisy machine hits both alike.
Prints one markdown table per model: req/s and p50/p99 of each path, the latency the
gateway adds at p50 and p99, and the throughput ratio gateway / direct.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (
    PEER_BODY,
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
    start_runtime,
    table,
    time_budget,
)

ECHO_CODE = '''"""Echo: the request body back, unchanged, as JSON."""


def transform_fn(model, body, content_type, accept):
    return body, "application/json"
'''

SKLEARN_CODE = '''"""One-row LogisticRegression: {"instances": rows} -> {"predictions": labels}."""

import os
import pickle

import numpy as np


def model_fn(model_dir):
    with open(os.path.join(model_dir, "model.pkl"), "rb") as f:
        return pickle.load(f)


def predict_fn(data, model):
    return {"predictions": model.predict(np.asarray(data["instances"])).tolist()}
'''


@dataclass(frozen=True)
class Row:
    connections: int
    direct: WrkResult
    gateway: WrkResult


def write_echo(model_dir: Path) -> None:
    """The echo model: the request body back, unchanged (the peer harness's echo)."""
    (model_dir / "code").mkdir(parents=True, exist_ok=True)
    (model_dir / "code" / "inference.py").write_text(ECHO_CODE)


def write_sklearn(model_dir: Path) -> bool:
    """The peer harness's model (LogisticRegression, 20 features, seed 42); False if no sklearn."""
    try:
        import numpy as np
        from sklearn.linear_model import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
            LogisticRegression,
        )
    except ImportError:
        return False
    rng = np.random.default_rng(42)
    x = rng.normal(size=(2000, 20))
    y = (x @ rng.normal(size=20) > 0).astype(int)
    (model_dir / "code").mkdir(parents=True)
    (model_dir / "code" / "inference.py").write_text(SKLEARN_CODE)
    with open(model_dir / "model.pkl", "wb") as f:
        pickle.dump(LogisticRegression().fit(x, y), f)
    return True


def check(url: str, body: bytes, model: str) -> None:
    status, answer = post(url, body)
    if status != 200:
        raise RuntimeError(f"{model}: {url} answered {status}: {answer[:300]!r}")
    if model == "echo" and json.loads(answer) != json.loads(body):
        raise RuntimeError(f"echo: {url} answered {answer[:300]!r}")
    if model == "sklearn" and "predictions" not in json.loads(answer):
        raise RuntimeError(f"sklearn: {url} answered {answer[:300]!r}")


def bench_model(
    model: str, model_dir: Path, work: Path, concs: list[int], warmup_s: float, duration_s: float
) -> list[Row]:
    body = PEER_BODY.read_bytes()
    started: list[ServerProcess] = []
    try:
        runtime, direct_url = start_runtime(model_dir, work / f"runtime-{model}.log")
        started.append(runtime)
        gateway, gateway_url = start_gateway(work / f"home-{model}")
        started.append(gateway)
        Control(gateway_url).deploy(model, model_dir.as_uri(), count=1)
        gateway.track()
        invoke_url = f"{gateway_url}/endpoints/{model}/invocations"
        check(direct_url, body, model)
        check(invoke_url, body, model)
        rows = []
        for c in concs:
            direct = measure(direct_url, PEER_BODY, c, warmup_s, duration_s)
            through = measure(invoke_url, PEER_BODY, c, warmup_s, duration_s)
            print(
                f"  {model} c={c}: direct {direct.rps:,.0f} req/s p99 {direct.p99_ms:.2f} ms | "
                f"gateway {through.rps:,.0f} req/s p99 {through.p99_ms:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
            rows.append(Row(c, direct, through))
        return rows
    finally:
        for server in reversed(started):
            left = server.stop()
            if left:
                print(f"WARNING: {server} left PIDs alive after SIGKILL: {left}", file=sys.stderr)


def render(model: str, rows: list[Row]) -> str:
    headers = [
        "conc",
        "direct req/s",
        "direct p50 ms",
        "direct p99 ms",
        "gateway req/s",
        "gateway p50 ms",
        "gateway p99 ms",
        "added p50 ms",
        "added p99 ms",
        "req/s gateway/direct",
        "errors",
    ]
    out = []
    for r in rows:
        d, g = r.direct, r.gateway
        errors = "; ".join(f"{k}: {w.note}" for k, w in (("direct", d), ("gateway", g)) if w.errors)
        out.append(
            [
                r.connections,
                d.rps,
                d.p50_ms,
                d.p99_ms,
                g.rps,
                g.p50_ms,
                g.p99_ms,
                g.p50_ms - d.p50_ms,
                g.p99_ms - d.p99_ms,
                f"{g.rps / d.rps:.2f}" if d.rps else "-",
                errors or "0",
            ]
        )
    return f"### {model}\n\n" + table(headers, out)


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 8.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8, 32])
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp:
        work = Path(tmp)
        models = {"echo": work / "models" / "echo"}
        write_echo(models["echo"])
        notes = []
        if write_sklearn(work / "models" / "sklearn"):
            models["sklearn"] = work / "models" / "sklearn"
        else:
            notes.append(
                f"sklearn: skipped, scikit-learn is not importable by {sys.executable} "
                "(run this script with a Python that has it, e.g. the peer venv "
                "/tmp/peers/shipyard/bin/python)."
            )
        # Budget: every wrk run plus start-up; generous, but a hang cannot last forever.
        runs = len(models) * len(concs) * 2
        budget = runs * (warmup_s + duration_s + 15) + 120 * len(models)
        probe_before = cpu_probe_ms()
        when = time.strftime("%Y-%m-%d %H:%M")
        results = {}
        with time_budget(budget):
            for model, model_dir in models.items():
                results[model] = bench_model(model, model_dir, work, concs, warmup_s, duration_s)
        probe_after = cpu_probe_ms()
    print(f"## Gateway overhead ({when}, {os.cpu_count()} cores)\n")
    print(
        f"wrk -t1 -cC, {warmup_s:g} s warm-up + {duration_s:g} s measured per cell, body "
        f"{PEER_BODY} ({len(PEER_BODY.read_bytes())} B); one instance behind the gateway. "
        f"CPU probe {probe_before} ms before / {probe_after} ms after (lower = faster).\n"
    )
    for model, rows in results.items():
        print(render(model, rows) + "\n")
    for note in notes:
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    entry(main)
