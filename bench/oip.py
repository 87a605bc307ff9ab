"""The Open Inference Protocol against InvokeEndpoint: one sklearn instance, three doors.

    .venv/bin/python bench/oip.py > bench/results/oip.md   # DURATION=6 WARMUP=2 CONCS="1 8 32"

One gateway started with ``--grpc-port``, one endpoint of one instance of the peer
harness's sklearn model (LogisticRegression, 20 features), whose inference.py answers
both the SageMaker JSON body (``predict_fn``) and OIP tensors (``predict_tensors_fn``).
For each concurrency, the same load generator drives, in turn and alternating order:

- ``invoke``: ``POST /endpoints/sklearn/invocations``, the peers' JSON body;
- ``rest-json``: ``POST /v2/models/sklearn/infer``, the MLServer peer's V2 JSON body;
- ``rest-binary``: the same tensor in the binary extension (FP64 bytes after the header);
- ``grpc``: ``ModelInfer`` with ``raw_input_contents``, over one HTTP/2 channel;
- ``mlserver-rest`` and ``mlserver-grpc``: the same V2 JSON body and the same gRPC
  request to MLServer serving the same pickle (bench/peer_apps/mlserver_sklearn.py, its
  default ``parallel_workers`` of 1), when ``bench/peer_apps/install.sh`` has installed it.

The load generator is one Python process (uvloop): keep-alive HTTP/1.1 connections
written by hand for the REST doors, grpc.aio for gRPC, requests pre-encoded, c requests
in flight. Python clients rather than wrk so that every door pays the same kind of client
(wrk has no gRPC); it shares the machine's two cores with the gateway and the instance,
so absolute rates are below wrk's; the wrk rows for the HTTP doors are there to show by
how much. Ratios are per concurrency, against ``invoke``.

``LOAD=h2load`` drives every door with h2load instead (nghttp2, C: ``apt-get install
nghttp2-client``), so the client's own cost weighs little on the servers' cores: the
REST doors as ``h2load --h1 -c C -m 1`` (C keep-alive connections, one request each in
flight), the gRPC doors as ``h2load -c 1 -m C`` (one HTTP/2 connection with C streams, as
tritonclient's one channel), the request framed as gRPC. Each cell adds the server's CPU
per request: the whole process tree of the door's server (the gateway and its instance,
or MLServer and its worker), from /proc. Ratios are against ``rest-json``, and the gRPC
door's against MLServer's gRPC. h2load counts a gRPC call by its HTTP status, which is
200 even for a failed call: every door is checked to answer before it is measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway_overhead import write_sklearn
from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    cpu_probe_ms,
    entry,
    env_float,
    env_ints,
    free_port,
    http_status,
    measure,
    post,
    require_wrk,
    start_gateway,
    table,
    time_budget,
)

CODE = '''"""LogisticRegression for InvokeEndpoint (JSON) and the Open Inference Protocol."""

import os
import pickle

import numpy as np


def model_fn(model_dir):
    with open(os.path.join(model_dir, "model.pkl"), "rb") as f:
        return pickle.load(f)


def predict_fn(data, model):
    return {"predictions": model.predict(np.asarray(data["instances"])).tolist()}


def predict_tensors_fn(inputs, model):
    return {"predictions": model.predict(inputs["instances"])}
'''

ROW = [
    -0.966521, -0.264608, 1.284738, -1.877866, 1.130083, 0.831742, -1.034089, -0.620883,
    0.957348, -1.824483, -0.261427, -1.382915, -3.158907, 1.844973, 1.134516, 0.33473,
    3.145701, 1.414452, 1.171094, -0.156463,
]  # fmt: skip
"""The peers' request row (bench/request.json, the peer harness's request)."""
PATHS = ["invoke", "rest-json", "rest-binary", "grpc"]
MLSERVER = Path(os.environ.get("PEERS_ROOT", "/tmp/peers")) / "minilm-mlserver" / "bin"
PEER_APPS = Path(__file__).resolve().parent / "peer_apps"


def bodies() -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """Path → (HTTP path or gRPC method, body, extra headers)."""
    import numpy as np
    from tritonclient.grpc import service_pb2

    tensor = {"name": "instances", "shape": [1, 20], "datatype": "FP64"}
    raw = np.asarray([ROW], dtype="<f8").tobytes()
    head = json.dumps(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()
    grpc_request = service_pb2.ModelInferRequest(model_name="sklearn")
    grpc_request.inputs.add(**tensor)
    grpc_request.raw_input_contents.append(raw)
    v2_json = json.dumps({"inputs": [{**tensor, "data": ROW}]}).encode()
    return {
        "invoke": (
            "/endpoints/sklearn/invocations",
            json.dumps({"instances": [ROW]}).encode(),
            {"Content-Type": "application/json"},
        ),
        "rest-json": ("/v2/models/sklearn/infer", v2_json, {"Content-Type": "application/json"}),
        "rest-binary": (
            "/v2/models/sklearn/infer",
            head + raw,
            {"Inference-Header-Content-Length": str(len(head))},
        ),
        "grpc": (
            "/inference.GRPCInferenceService/ModelInfer",
            grpc_request.SerializeToString(),
            {},
        ),
        "mlserver-rest": (
            "/v2/models/sklearn/infer",
            v2_json,
            {"Content-Type": "application/json"},
        ),
        "mlserver-grpc": (
            "/inference.GRPCInferenceService/ModelInfer",
            grpc_request.SerializeToString(),
            {},
        ),
    }


def start_mlserver(work: Path, model_pickle: Path) -> tuple[ServerProcess, str, str]:
    """MLServer serving ``model_pickle``; its process, REST host:port and gRPC host:port."""
    run = work / "mlserver"
    (run / "sklearn").mkdir(parents=True)
    (run / "sklearn" / "mlserver_sklearn.py").write_bytes(
        (PEER_APPS / "mlserver_sklearn.py").read_bytes()
    )
    http_port, grpc_port = free_port(), free_port()
    settings = {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port}
    settings["metrics_port"] = free_port()
    (run / "settings.json").write_text(json.dumps(settings))
    model = {
        "name": "sklearn",
        "implementation": "mlserver_sklearn.Sklearn",
        "parameters": {"uri": str(model_pickle)},
    }
    (run / "sklearn" / "model-settings.json").write_text(json.dumps(model))
    env = {"PATH": f"{MLSERVER}:{os.environ['PATH']}"}
    server = ServerProcess.start(
        "mlserver", [str(MLSERVER / "mlserver"), "start", str(run)], work / "mlserver.log", env, run
    )
    rest = f"127.0.0.1:{http_port}"
    body = bodies()["mlserver-rest"][1]
    deadline = time.monotonic() + 180
    try:
        while http_status(f"http://{rest}/v2/models/sklearn/infer", body) != 200:
            if not server.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"mlserver did not start:\n{server.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        server.stop()
        raise
    return server, rest, f"127.0.0.1:{grpc_port}"


# -- the load generator (run as a subprocess: python bench/oip.py --load ...) -----------


async def _http_worker(
    host: str, port: int, request: bytes, stop: float, latencies: list[float]
) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    errors = 0
    try:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 200"):
                errors += 1
    finally:
        writer.close()
    return errors


async def _grpc_worker(call: Any, body: bytes, stop: float, latencies: list[float]) -> int:
    errors = 0
    while time.perf_counter() < stop:
        started = time.perf_counter()
        try:
            await call(body)
        except Exception:
            errors += 1
        latencies.append(time.perf_counter() - started)
    return errors


async def _load(kind: str, target: str, conc: int, duration_s: float) -> dict[str, Any]:
    path, body, headers = bodies()[kind]
    latencies: list[float] = []
    stop = time.perf_counter() + duration_s
    if kind.endswith("grpc"):
        import grpc

        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary(path)  # bytes in, bytes out: no (de)serializing
            results = await asyncio.gather(
                *(_grpc_worker(call, body, stop, latencies) for _ in range(conc))
            )
    else:
        host, port = target.rsplit(":", 1)
        lines = [f"POST {path} HTTP/1.1", f"Host: {target}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        results = await asyncio.gather(
            *(_http_worker(host, int(port), request, stop, latencies) for _ in range(conc))
        )
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "rps": n / duration_s,
        "p50_ms": latencies[n // 2] * 1000 if n else 0.0,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else 0.0,
        "errors": sum(results),
    }


def run_load(kind: str, target: str, conc: int, duration_s: float) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--load", kind, target, str(conc), str(duration_s)]
    out = subprocess.run(argv, capture_output=True, check=True, timeout=duration_s + 60)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def run_h2load(
    kind: str, target: str, conc: int, duration_s: float, server: ServerProcess, work: Path
) -> dict[str, Any]:
    """One cell under h2load: req/s, mean latency and the server tree's CPU per request."""
    path, body, headers = bodies()[kind]
    body_file = work / f"{kind}.body"
    seconds = max(1, round(duration_s))  # h2load's -D takes whole seconds
    args = ["h2load", "-D", str(seconds)]
    if kind.endswith("grpc"):
        body_file.write_bytes(b"\x00" + len(body).to_bytes(4, "big") + body)  # gRPC framing
        args += ["-c", "1", "-m", str(conc), "-H", "content-type: application/grpc"]
        args += ["-H", "te: trailers"]
    else:
        body_file.write_bytes(body)
        args += ["--h1", "-c", str(conc), "-m", "1"]
        for name, value in {"Content-Type": "application/octet-stream", **headers}.items():
            args += ["-H", f"{name}: {value}"]
    args += ["-d", str(body_file), f"http://{target}{path}"]
    server.track()
    before = server.cpu_s()
    out = subprocess.run(
        args, capture_output=True, text=True, check=True, timeout=seconds + 60
    ).stdout
    used = server.cpu_s() - before
    done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", out).group(1))  # type: ignore[union-attr]
    ok = int(re.search(r"(\d+) succeeded", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(\w+)", out).groups()  # type: ignore[union-attr]
    mean_ms = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return {
        "rps": done / seconds,
        "mean_ms": mean_ms,
        "cpu_us": used / max(done, 1) * 1e6,
        "errors": done - ok,
    }


def interleaved(
    paths: list[str], concs: list[int], cell_of: Callable[[str, int], dict[str, Any]]
) -> dict[int, dict[str, dict[str, Any]]]:
    """Each concurrency's cells, door by door, the doors' order reversed at every other
    concurrency; ``cell_of(door, conc)`` warms up and measures one."""
    cells: dict[int, dict[str, dict[str, Any]]] = {}
    for i, conc in enumerate(concs):
        cell = cells[conc] = {}
        for kind in paths if i % 2 == 0 else list(reversed(paths)):
            cell[kind] = r = cell_of(kind, conc)
            shown = " ".join(f"{k} {v:,.2f}" for k, v in r.items() if k != "requests")
            print(f"  c={conc} {kind}: {shown}", file=sys.stderr, flush=True)
    return cells


def h2load_rounds(
    paths: list[str],
    targets: dict[str, str],
    servers: dict[str, ServerProcess],
    concs: list[int],
    warmup_s: float,
    duration_s: float,
    work: Path,
) -> list[list[object]]:
    def cell_of(kind: str, conc: int) -> dict[str, Any]:
        run_h2load(kind, targets[kind], conc, warmup_s, servers[kind], work)
        return run_h2load(kind, targets[kind], conc, duration_s, servers[kind], work)

    rows: list[list[object]] = []
    for conc, cell in interleaved(paths, concs, cell_of).items():
        base = cell["rest-json"]["rps"] or 1.0
        for kind in paths:
            r = cell[kind]
            versus = ""
            if kind == "grpc" and "mlserver-grpc" in cell:
                versus = f"{r['rps'] / (cell['mlserver-grpc']['rps'] or 1.0):.2f}"
            rows.append(
                [conc, kind, r["rps"], r["mean_ms"], r["cpu_us"],
                 f"{r['rps'] / base:.2f}", versus, r["errors"]]
            )  # fmt: skip
    return rows


def client_rounds(
    paths: list[str],
    targets: dict[str, str],
    url: str,
    concs: list[int],
    warmup_s: float,
    duration_s: float,
    work: Path,
) -> tuple[list[list[object]], list[list[object]]]:
    """The Python load generator's rounds, and wrk's for the HTTP doors."""

    def cell_of(kind: str, conc: int) -> dict[str, Any]:
        run_load(kind, targets[kind], conc, warmup_s)
        return run_load(kind, targets[kind], conc, duration_s)

    rows: list[list[object]] = []
    wrk_rows: list[list[object]] = []
    v2_body = work / "v2.json"
    v2_body.write_bytes(bodies()["rest-json"][1])
    for conc, cell in interleaved(paths, concs, cell_of).items():
        base = cell["invoke"]["rps"] or 1.0
        for kind in paths:
            r = cell[kind]
            rows.append(
                [conc, kind, r["rps"], r["p50_ms"], r["p99_ms"],
                 f"{r['rps'] / base:.2f}", r["errors"]]
            )  # fmt: skip
        for kind, path, body_file in (
            ("invoke", "/endpoints/sklearn/invocations", PEER_BODY),
            ("rest-json", "/v2/models/sklearn/infer", v2_body),
        ):
            w = measure(url + path, body_file, conc, warmup_s, duration_s)
            wrk_rows.append([conc, kind, w.rps, w.p50_ms, w.p99_ms, w.note])
    return rows, wrk_rows


# -- the run -----------------------------------------------------------------------------


def check(gateway_url: str, grpc_target: str) -> None:
    for kind, (path, body, _) in bodies().items():
        if kind.startswith("mlserver"):
            continue  # checked once the gateway is up
        if kind == "grpc":
            result = run_load(kind, grpc_target, 1, 0.3)
            if result["errors"] or not result["requests"]:
                raise RuntimeError(f"grpc: {result}")
            continue
        headers = bodies()[kind][2]
        if "Inference-Header-Content-Length" in headers:
            continue  # post() sends no extra headers; run_load checks it below
        status, answer = post(gateway_url + path, body)
        if status != 200:
            raise RuntimeError(f"{kind}: {status} {answer[:300]!r}")
    result = run_load("rest-binary", gateway_url.removeprefix("http://"), 1, 0.3)
    if result["errors"] or not result["requests"]:
        raise RuntimeError(f"rest-binary: {result}")


def main() -> int:
    h2load = os.environ.get("LOAD") == "h2load"
    if h2load and shutil.which("h2load") is None:
        print("h2load not found: apt-get install nghttp2-client")
        return 1
    require_wrk()
    duration_s = env_float("DURATION", 6.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8, 32])
    paths = PATHS + (["mlserver-rest", "mlserver-grpc"] if (MLSERVER / "mlserver").exists() else [])
    runs = len(concs) * (len(paths) + 2)
    with (
        tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp,
        time_budget(runs * (warmup_s + duration_s + 20) + 180),
    ):
        work = Path(tmp)
        model_dir = work / "sklearn"
        if not write_sklearn(model_dir):
            print("scikit-learn is not importable: nothing to measure.")
            return 1
        (model_dir / "code" / "inference.py").write_text(CODE)
        grpc_port = free_port()
        gateway: ServerProcess | None = None
        mlserver: ServerProcess | None = None
        targets: dict[str, str] = {}
        try:
            if "mlserver-grpc" in paths:
                mlserver, targets["mlserver-rest"], targets["mlserver-grpc"] = start_mlserver(
                    work, model_dir / "model.pkl"
                )
            gateway, url = start_gateway(work / "home", args=["--grpc-port", str(grpc_port)])
            Control(url).deploy("sklearn", model_dir.as_uri(), count=1)
            gateway.track()
            grpc_target = f"127.0.0.1:{grpc_port}"
            check(url, grpc_target)
            targets.update(
                {
                    kind: url.removeprefix("http://")
                    for kind in ("invoke", "rest-json", "rest-binary")
                }
            )
            targets["grpc"] = grpc_target
            for kind in ("mlserver-rest", "mlserver-grpc"):
                result = run_load(kind, targets[kind], 1, 0.3) if kind in targets else None
                if result is not None and (result["errors"] or not result["requests"]):
                    raise RuntimeError(f"{kind}: {result}")
            probe_before = cpu_probe_ms()
            when = time.strftime("%Y-%m-%d %H:%M")
            wrk_rows: list[list[object]] = []
            if h2load:
                servers = {kind: gateway for kind in PATHS}
                if mlserver is not None:
                    mlserver.track()
                    servers.update({"mlserver-rest": mlserver, "mlserver-grpc": mlserver})
                rows = h2load_rounds(paths, targets, servers, concs, warmup_s, duration_s, work)
            else:
                rows, wrk_rows = client_rounds(
                    paths, targets, url, concs, warmup_s, duration_s, work
                )
            probe_after = cpu_probe_ms()
        finally:
            for server in (gateway, mlserver):
                if server is not None and (left := server.stop()):
                    print(f"WARNING: {server.name} left PIDs alive: {left}", file=sys.stderr)
    if h2load:
        print(f"## The doors under h2load ({when} UTC, {os.cpu_count()} cores)\n")
        print(
            f"sklearn (LogisticRegression, one [1, 20] FP64 row), one instance; {warmup_s:g} s "
            f"warm-up + {duration_s:g} s measured per cell, the doors in alternating order; "
            "h2load as bench/oip.py's LOAD=h2load says. CPU probe "
            f"{probe_before} ms before / {probe_after} ms after (lower = faster).\n"
        )
        headers = ["conc", "door", "req/s", "mean ms", "server CPU µs/req"]
        headers += ["req/s vs rest-json", "grpc vs mlserver-grpc", "errors"]
        print(table(headers, rows))
        return 0
    print(f"## OIP v2 gRPC vs REST vs InvokeEndpoint ({when}, {os.cpu_count()} cores)\n")
    print(
        f"sklearn (LogisticRegression, one [1, 20] FP64 row), one instance; {warmup_s:g} s "
        f"warm-up + {duration_s:g} s measured per cell; one Python load generator for all "
        f"doors (see bench/oip.py). CPU probe {probe_before} ms before / {probe_after} ms "
        "after (lower = faster).\n"
    )
    print(table(["conc", "door", "req/s", "p50 ms", "p99 ms", "req/s vs invoke", "errors"], rows))
    print("\nThe HTTP doors under wrk (-t1 -cC), for scale:\n")
    print(table(["conc", "door", "req/s", "p50 ms", "p99 ms", "errors"], wrk_rows))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--load":
        import uvloop

        kind, target, conc, duration = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
        result = uvloop.run(_load(kind, target, int(conc), float(duration)))
        print(json.dumps(result))
    else:
        entry(main)
