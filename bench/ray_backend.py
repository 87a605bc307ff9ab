"""The ray backend beside the local one: time to InService, and the data path.

    .venv/bin/python bench/ray_backend.py  # DURATION=8 WARMUP=2 CONCS="1 8 32" ROUNDS=3 REPEATS=3

Starts a one-node Ray cluster on 127.0.0.1 (``ray start --block``, token authentication,
stopped by PID at the end) and two gateways on it, ``--backend local`` and ``--backend
ray``, then measures:

- seconds from CreateEndpoint to InService for an endpoint of 4 instances (the echo
  model, ``ml.m5.large``: the node declares 8 vCPU so all four fit), ``ROUNDS`` times
  on each backend, the endpoint deleted between rounds;
- wrk against ``/endpoints/<name>/invocations`` of a 1-instance endpoint of the sklearn
  model (the peer harness's LogisticRegression) on each gateway, ``REPEATS`` times per
  concurrency, alternating, and the run of median throughput kept, so that drift of this
  noisy machine hits both alike. The gateway streams
  to the instance's own address in both cases: Ray is not on the data path, so the goal
  is no difference.

Both gateways and the Ray node share this machine's 2 cores; the Ray node's own
processes (GCS, raylet, agents) idle in the background of both measurements.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gateway_overhead import check, write_echo, write_sklearn
from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    WrkResult,
    cpu_probe_ms,
    entry,
    env_float,
    env_ints,
    free_port,
    measure,
    require_wrk,
    start_gateway,
    table,
    time_budget,
    wait_until,
)

RAY = str(Path(sys.executable).with_name("ray"))


def start_ray(root: Path) -> tuple[ServerProcess, str, dict[str, str]]:
    """A one-node cluster on 127.0.0.1; the node, its address and the drivers' env."""
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    address = f"127.0.0.1:{free_port()}"
    argv = [RAY, "start", "--block", "--head", "--node-ip-address", "127.0.0.1"]
    argv += ["--port", address.rpartition(":")[2], "--ray-client-server-port", str(free_port())]
    argv += ["--num-cpus", "8", "--memory", str(32 << 30), "--object-store-memory", str(80 << 20)]
    argv += ["--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(root)]
    node = ServerProcess.start("ray", argv, root / "node.log", {**env, "TMPDIR": str(root)})

    def started() -> bool:
        if not node.alive():
            raise RuntimeError(f"ray start exited:\n{node.log_tail()}")
        return "Ray runtime started" in node.log_path.read_text(errors="replace")

    wait_until(started, 120, "ray start")
    return node, address, env


def in_service_s(control: Control, name: str, model_url: str, count: int) -> float:
    began = time.monotonic()
    control.deploy(name, model_url, count=count)
    took = time.monotonic() - began
    control.call("DeleteEndpoint", {"EndpointName": name})
    wait_until(lambda: not _exists(control, name), 60, f"endpoint {name} deleted")
    return took


def _exists(control: Control, name: str) -> bool:
    listed = control.call("ListEndpoints", {"NameContains": name})["Endpoints"]
    return any(e["EndpointName"] == name for e in listed)


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 8.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8, 32])
    rounds = int(env_float("ROUNDS", 3))
    repeats = int(env_float("REPEATS", 3))
    # Short: Ray's socket paths under it must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    work = root / "work"
    echo, sklearn = work / "models" / "echo", work / "models" / "sklearn"
    write_echo(echo)
    if not write_sklearn(sklearn):
        raise SystemExit(f"scikit-learn is not importable by {sys.executable}")
    started: list[ServerProcess] = []
    starts: dict[str, list[float]] = {"local": [], "ray": []}
    load: dict[int, dict[str, WrkResult]] = {}
    probe_before = cpu_probe_ms()
    when = time.strftime("%Y-%m-%d %H:%M")
    try:
        with time_budget(900 + len(concs) * 2 * repeats * (warmup_s + duration_s + 15)):
            node, address, ray_env = start_ray(root)
            started.append(node)
            gateways = {}
            for backend in ("local", "ray"):
                args = ["--backend", backend]
                if backend == "ray":
                    args += ["--ray-address", address]
                server, url = start_gateway(work / f"home-{backend}", args=args, env=ray_env)
                started.append(server)
                gateways[backend] = url
            for n in range(rounds):
                for backend, url in gateways.items():
                    took = in_service_s(Control(url), f"four-{n}", echo.as_uri(), 4)
                    starts[backend].append(took)
                    print(f"  {backend}: 4 instances InService in {took:.2f} s", file=sys.stderr)
            for url in gateways.values():
                Control(url).deploy("sklearn", sklearn.as_uri(), count=1)
                check(f"{url}/endpoints/sklearn/invocations", PEER_BODY.read_bytes(), "sklearn")
            for c in concs:
                runs: dict[str, list[WrkResult]] = {backend: [] for backend in gateways}
                for _ in range(repeats):
                    for backend, url in gateways.items():
                        invoke = f"{url}/endpoints/sklearn/invocations"
                        result = measure(invoke, PEER_BODY, c, warmup_s, duration_s)
                        runs[backend].append(result)
                        print(
                            f"  {backend} c={c}: {result.rps:,.0f} req/s "
                            f"p99 {result.p99_ms:.2f} ms",
                            file=sys.stderr,
                        )
                load[c] = {backend: _median(results) for backend, results in runs.items()}
    finally:
        for server in reversed(started):
            server.track()
            left = server.stop()
            if left:
                print(f"WARNING: {server} left PIDs alive: {left}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)
    probe_after = cpu_probe_ms()
    print(report(when, starts, load, warmup_s, duration_s, repeats, probe_before, probe_after))
    return 0


def _median(results: list[WrkResult]) -> WrkResult:
    """The run of median throughput: one noisy run (this machine is shared) moves neither
    backend's figure."""
    return sorted(results, key=lambda r: r.rps)[len(results) // 2]


def report(
    when: str,
    starts: dict[str, list[float]],
    load: dict[int, dict[str, WrkResult]],
    warmup_s: float,
    duration_s: float,
    repeats: int,
    probe_before: float,
    probe_after: float,
) -> str:
    out = [f"## The ray backend beside the local one ({when}, {os.cpu_count()} cores)\n"]
    out.append(
        "One-node Ray cluster on 127.0.0.1 (8 logical vCPU, token authentication), one "
        f"gateway per backend. CPU probe {probe_before} ms before / {probe_after} ms after.\n"
    )
    out.append("### Seconds from CreateEndpoint to InService, 4 instances (echo)\n")
    rows = [
        [backend, *(f"{s:.2f}" for s in values), f"{sorted(values)[len(values) // 2]:.2f}"]
        for backend, values in starts.items()
    ]
    rounds = len(next(iter(starts.values())))
    out.append(table(["backend", *(f"round {n + 1}" for n in range(rounds)), "median"], rows))
    out.append(
        f"\n### Gateway data path, sklearn, 1 instance (wrk -t1 -cC, {warmup_s:g} s warm-up "
        f"+ {duration_s:g} s, body {PEER_BODY.name}; per cell the run of median req/s "
        f"of {repeats}, the backends alternating)\n"
    )
    headers = ["conc", "local req/s", "local p50 ms", "local p99 ms", "ray req/s"]
    headers += ["ray p50 ms", "ray p99 ms", "req/s ray/local", "errors"]
    lines = []
    for c, by in load.items():
        local, ray = by["local"], by["ray"]
        errors = "; ".join(f"{k}: {w.note}" for k, w in by.items() if w.errors) or "0"
        ratio = f"{ray.rps / local.rps:.2f}" if local.rps else "-"
        lines.append(
            [c, local.rps, local.p50_ms, local.p99_ms, ray.rps, ray.p50_ms, ray.p99_ms]
            + [ratio, errors]
        )
    out.append(table(headers, lines))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    entry(main)
