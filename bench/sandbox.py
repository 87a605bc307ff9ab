"""What the sandbox costs: instance cold start and throughput, ``auth.sandbox`` on vs off.

    <python with scikit-learn and shipyard> bench/sandbox.py
    # DURATION=10 WARMUP=2 CONCS="8 32" ROUNDS=3

1. Cold start, in process: ``LocalBackend.start`` of the sklearn model's instance until
   its first good ``/ping`` (process start, imports, model load; under the sandbox also
   bwrap's namespaces and mounts), with and without a sandbox, alternated ROUNDS times
   each after one start of each that fills the artifact cache.
2. Through two gateways with the same ``auth:`` (one key, ``file_roots`` the work
   folder), one of them ``sandbox: false``: CreateEndpoint → InService of a fresh
   endpoint, alternated ROUNDS times (each endpoint deleted after), then requests/s and
   p99 of one instance of the model, wrk with a signature made once (``signed.lua``, as
   auth_overhead.py), alternated per concurrency. Every run checks wrk saw no non-2xx
   answer.

The model is gateway_overhead.py's sklearn one when scikit-learn is importable, else echo.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from auth_overhead import ECHO, KEY, SECRET, SIGNED_LUA, check, sign
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from gateway_overhead import write_sklearn
from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    entry,
    env_float,
    env_ints,
    http_status,
    require_wrk,
    run_wrk,
    start_gateway,
    table,
    time_budget,
)

from shipyard.backends.base import InstanceSpec
from shipyard.backends.local import LocalBackend
from shipyard.backends.sandbox import Sandbox

MODES = ("off", "on")


class Signed(Control):
    """Control with each call signed with the bench key."""

    def call(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(params).encode()
        headers = {"X-Amz-Target": f"SageMaker.{action}",
                   "Content-Type": "application/x-amz-json-1.1"}  # fmt: skip
        request = AWSRequest(method="POST", url=self.url + "/", data=data, headers=headers)
        SigV4Auth(Credentials(KEY, SECRET), "sagemaker", "us-east-1").add_auth(request)
        prepared = urllib.request.Request(
            self.url + "/", data=data, headers=dict(request.headers.items())
        )
        with urllib.request.urlopen(prepared, timeout=60) as response:
            result: dict[str, Any] = json.loads(response.read() or b"{}")
            return result

    def delete(self, name: str) -> None:
        self.call("DeleteEndpoint", {"EndpointName": name})
        self.call("DeleteEndpointConfig", {"EndpointConfigName": name})
        self.call("DeleteModel", {"ModelName": name})


async def _start_to_ping(backend: LocalBackend, spec: InstanceSpec) -> float:
    """Seconds from ``start`` to the instance's first good /ping; the instance stopped."""
    begun = time.perf_counter()
    handle = await backend.start(spec)
    try:
        while True:
            reason = backend.exit_reason(handle)
            if reason is not None:
                raise RuntimeError(f"instance failed: {reason}")
            if await asyncio.to_thread(http_status, handle.url + "/ping", None, 1.0) == 200:
                return time.perf_counter() - begun
            await asyncio.sleep(0.005)
    finally:
        await backend.stop(handle)


def cold_starts(work: Path, model: Path, rounds: int) -> dict[str, list[float]]:
    (work / "backends").mkdir(exist_ok=True)  # hidden: bwrap masks a folder that exists
    sandbox = Sandbox.create(file_roots=[work], hidden=[work / "backends"], environ=os.environ)
    backends = {
        mode: LocalBackend(
            run_dir=work / "backends" / mode / "run",
            environ={"PATH": os.environ.get("PATH", "")},
            sandbox=sandbox if mode == "on" else None,
        )
        for mode in MODES
    }
    times: dict[str, list[float]] = {mode: [] for mode in MODES}

    async def main() -> None:
        for n in range(rounds + 1):
            for mode, backend in backends.items():
                spec = InstanceSpec(f"cold-{mode}-{n}", "shipyard/python", model_url=model.as_uri())
                took = await _start_to_ping(backend, spec)
                if n:  # the first start of each fills its artifact cache
                    times[mode].append(took)
                print(f"  cold start {mode} #{n}: {took * 1000:.0f} ms", file=sys.stderr)

    asyncio.run(main())
    return times


def through_gateways(
    work: Path, model: Path, concs: list[int], rounds: int, warmup_s: float, duration_s: float
) -> tuple[dict[str, list[float]], list[list[object]]]:
    body = PEER_BODY.read_bytes()
    started: list[ServerProcess] = []
    deploys: dict[str, list[float]] = {mode: [] for mode in MODES}
    rows: list[list[object]] = []
    try:
        urls = {}
        for mode in MODES:
            stack = work / f"stack-{mode}.yaml"
            auth = {
                "keys": [{"access_key_id": KEY, "secret_access_key_env": "K"}],
                "file_roots": [str(work)],
                "sandbox": mode == "on",
            }
            stack.write_text(json.dumps({"auth": auth}))
            server, urls[mode] = start_gateway(
                work / f"home-{mode}",
                args=["--config", str(stack)],
                env={**os.environ, "K": SECRET},
            )
            started.append(server)
        for n in range(rounds):
            for mode in MODES:
                control = Signed(urls[mode])
                begun = time.perf_counter()
                control.deploy(f"cold{n}", model.as_uri())
                deploys[mode].append(time.perf_counter() - begun)
                control.delete(f"cold{n}")
                print(f"  deploy {mode} #{n}: {deploys[mode][-1] * 1000:.0f} ms", file=sys.stderr)
        invoke, env = {}, {}
        for mode, server in zip(MODES, started, strict=True):
            Signed(urls[mode]).deploy("model", model.as_uri())
            server.track()
            invoke[mode] = f"{urls[mode]}/endpoints/model/invocations"
            signed = sign(invoke[mode], body)
            check(invoke[mode], signed, body, 200)
            env[mode] = {
                "BENCH_AUTHORIZATION": signed["Authorization"],
                "BENCH_DATE": signed["X-Amz-Date"],
            }
        for c in concs:
            results = {}
            for mode in MODES:
                for seconds in (warmup_s, duration_s) if warmup_s > 0 else (duration_s,):
                    result = run_wrk(invoke[mode], PEER_BODY, connections=c, duration_s=seconds,
                                     script=SIGNED_LUA, env=env[mode])  # fmt: skip
                if result.errors:
                    raise RuntimeError(f"sandbox {mode} c={c}: {result.note}")
                results[mode] = result
            a, b = results["off"], results["on"]
            print(f"  c={c}: off {a.rps:,.0f} req/s, on {b.rps:,.0f} req/s", file=sys.stderr)
            rows.append([c, a.rps, a.p50_ms, a.p99_ms, b.rps, b.p50_ms, b.p99_ms,
                         f"{b.rps / a.rps:.2f}", f"{b.p99_ms / a.p99_ms:.2f}"])  # fmt: skip
    finally:
        for server in reversed(started):
            server.stop()
    return deploys, rows


def _compare(samples: dict[str, list[float]]) -> list[str]:
    """Median (fastest) ms off, on, and the ratio of the medians."""
    off, on = samples["off"], samples["on"]
    cells = [f"{statistics.median(s) * 1000:.0f} ({min(s) * 1000:.0f})" for s in (off, on)]
    return [*cells, f"{statistics.median(on) / statistics.median(off):.2f}"]


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 10.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [8, 32])
    rounds = int(env_float("ROUNDS", 3))
    with tempfile.TemporaryDirectory(prefix="shipyard-sandbox-") as tmp:
        work = Path(tmp)
        model = work / "model"
        kind = "sklearn" if write_sklearn(model) else "echo"
        if kind == "echo":
            (model / "code").mkdir(parents=True)
            (model / "code" / "inference.py").write_text(ECHO)
        budget = 2 * rounds * 60 + len(concs) * 2 * (warmup_s + duration_s + 15) + 180
        with time_budget(budget):
            starts = cold_starts(work, model, rounds)
            deploys, rows = through_gateways(work, model, concs, rounds, warmup_s, duration_s)
    print(f"## Sandbox overhead ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)\n")
    print(
        f"{kind} model (gateway_overhead.py's sklearn one when scikit-learn is importable, "
        f"else echo); sandbox off and on alternated throughout; median of {rounds} "
        "(fastest in brackets), ms.\n"
    )
    cold = [
        ["start → first /ping (LocalBackend, in process)", *_compare(starts)],
        ["CreateEndpoint → InService (gateway, auth:)", *_compare(deploys)],
    ]
    print(table(["cold start", "off ms", "on ms", "on/off"], cold) + "\n")
    print(
        f"Through the gateway: one instance, wrk -t1 -cC with a signature made once, "
        f"{warmup_s:g} s warm-up + {duration_s:g} s measured, body {PEER_BODY} "
        f"({len(PEER_BODY.read_bytes())} B); no non-2xx answer in any run.\n"
    )
    headers = ["conc", "off req/s", "off p50 ms", "off p99 ms", "on req/s", "on p50 ms",
               "on p99 ms", "req/s on/off", "p99 on/off"]  # fmt: skip
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    entry(main)
