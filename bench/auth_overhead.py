"""What authentication costs: SigV4 verification per request, and throughput on vs off.

    .venv/bin/python bench/auth_overhead.py      # N=20000 DURATION=8 WARMUP=2 CONCS="1 8 32"

1. In process: ``Verifier.verify`` on a request signed by botocore exactly as boto3 signs
   InvokeEndpoint (the peer body, and a 1 MB body), and the whole ``RequireSignature``
   ASGI layer around a trivial app (body read, verified, replayed); p50/p90/p99 in µs.
2. Through wrk: one gateway without ``auth:`` and one with it, the same model behind
   each (the sklearn model of ``gateway_overhead.py`` when scikit-learn is importable,
   as in ``/tmp/peers/shipyard/bin/python``; else echo), alternated per concurrency.
   wrk cannot sign each request, but a SigV4 signature holds for 15 minutes for the
   identical request and the gateway verifies it in full every time (there is no replay
   cache), so the request is signed once and wrk sends its ``Authorization`` and
   ``X-Amz-Date`` (``signed.lua``). Every run checks wrk saw no non-2xx answer, so a
   refused signature cannot pass for a fast one.
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

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from gateway_overhead import write_sklearn
from harness import (
    HERE,
    PEER_BODY,
    Control,
    ServerProcess,
    entry,
    env_float,
    env_ints,
    run_wrk,
    start_gateway,
    table,
    time_budget,
)

from shipyard.gateway.edge.auth import SignedRequest, Verifier
from shipyard.gateway.edge.signatures import RequireSignature

KEY, SECRET = "AKIABENCH00000000001", "bench-secret"
SIGNED_LUA = HERE / "signed.lua"
ECHO = """def transform_fn(model, body, content_type, accept):
    return body, "application/json"
"""


def sign(url: str, body: bytes) -> dict[str, str]:
    """The headers boto3 would send for ``body`` to ``url`` (host included)."""
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
    )
    SigV4Auth(Credentials(KEY, SECRET), "sagemaker", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def signed_request(body: bytes) -> SignedRequest:
    headers = sign("http://127.0.0.1:8080/endpoints/e/invocations", body)
    return SignedRequest(
        method="POST",
        raw_path=b"/endpoints/e/invocations",
        query_string=b"",
        headers=[(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"host", b"127.0.0.1:8080")],
        body=body,
    )


def percentiles(samples_ns: list[int]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples_ns, n=100)
    return q[49] / 1000, q[89] / 1000, q[98] / 1000


def micro(n: int) -> list[list[object]]:
    verifier = Verifier({KEY: (SECRET, ["*"])})
    rows: list[list[object]] = []
    for label, body in (("peer body", PEER_BODY.read_bytes()), ("1 MB body", b"x" * (1 << 20))):
        request = signed_request(body)
        runs = n if len(body) < 65536 else max(n // 50, 200)
        for _ in range(min(runs, 1000)):
            verifier.verify(request)
        samples = []
        for _ in range(runs):
            started = time.perf_counter_ns()
            verifier.verify(request)
            samples.append(time.perf_counter_ns() - started)
        rows.append([f"Verifier.verify, {label} ({len(body):,} B)", *percentiles(samples)])
    rows.append(["RequireSignature (ASGI), peer body", *asgi_layer(n, verifier)])
    return rows


def asgi_layer(n: int, verifier: Verifier) -> tuple[float, float, float]:
    body = PEER_BODY.read_bytes()
    request = signed_request(body)
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/endpoints/e/invocations",
        "raw_path": request.raw_path,
        "query_string": b"",
        "headers": request.headers,
    }

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

    layer = RequireSignature(
        app, verifier=verifier, account_id="1", max_body_bytes=6 << 20, body_timeout_s=30
    )

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        raise AssertionError(f"refused: {message}")

    async def run() -> list[int]:
        samples = []
        for i in range(n + 1000):
            started = time.perf_counter_ns()
            await layer(scope, receive, send)
            if i >= 1000:
                samples.append(time.perf_counter_ns() - started)
        return samples

    return percentiles(asyncio.run(run()))


def check(url: str, headers: dict[str, str], body: bytes, expect: int) -> None:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    if status != expect:
        raise RuntimeError(f"{url}: expected {expect}, got {status}")


def through_wrk(
    work: Path, model: Path, concs: list[int], warmup_s: float, duration_s: float
) -> list[Any]:
    stack = work / "stack.yaml"
    stack.write_text(
        json.dumps(
            {
                "auth": {
                    "keys": [{"access_key_id": KEY, "secret_access_key_env": "K"}],
                    "file_roots": [str(work)],
                }
            }
        )
    )
    body = PEER_BODY.read_bytes()
    started: list[ServerProcess] = []
    rows = []
    try:
        off, off_url = start_gateway(work / "off")
        started.append(off)
        on, on_url = start_gateway(
            work / "on", args=["--config", str(stack)], env={**os.environ, "K": SECRET}
        )
        started.append(on)
        Control(off_url).deploy("model", model.as_uri())
        off.track()
        _deploy_signed(on_url, model.as_uri())
        on.track()
        on_invoke = f"{on_url}/endpoints/model/invocations"
        signed = sign(on_invoke, body)
        check(on_invoke, signed, body, 200)
        check(on_invoke, {**signed, "Authorization": signed["Authorization"][:-4] + "0000"},
              body, 403)  # fmt: skip
        env = {"BENCH_AUTHORIZATION": signed["Authorization"], "BENCH_DATE": signed["X-Amz-Date"]}
        for c in concs:
            off_invoke = f"{off_url}/endpoints/model/invocations"
            run_wrk(off_invoke, PEER_BODY, connections=c, duration_s=warmup_s)
            a = run_wrk(off_invoke, PEER_BODY, connections=c, duration_s=duration_s)
            run_wrk(on_invoke, PEER_BODY, connections=c, duration_s=warmup_s,
                    script=SIGNED_LUA, env=env)  # fmt: skip
            b = run_wrk(on_invoke, PEER_BODY, connections=c, duration_s=duration_s,
                        script=SIGNED_LUA, env=env)  # fmt: skip
            for label, result in (("off", a), ("on", b)):
                if result.errors:
                    raise RuntimeError(f"auth {label} c={c}: {result.note}")
            print(f"  c={c}: off {a.rps:,.0f} req/s, on {b.rps:,.0f} req/s", file=sys.stderr)
            rows.append([c, a.rps, a.p50_ms, a.p99_ms, b.rps, b.p50_ms, b.p99_ms,
                         f"{b.rps / a.rps:.2f}"])  # fmt: skip
    finally:
        for server in reversed(started):
            server.stop()
    return rows


def _deploy_signed(url: str, model_url: str) -> None:
    """Control(url).deploy, each call signed."""

    class Signed(Control):
        def call(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
            data = json.dumps(params).encode()
            request = AWSRequest(method="POST", url=self.url + "/", data=data, headers={
                "X-Amz-Target": f"SageMaker.{action}",
                "Content-Type": "application/x-amz-json-1.1"})  # fmt: skip
            SigV4Auth(Credentials(KEY, SECRET), "sagemaker", "us-east-1").add_auth(request)
            prepared = urllib.request.Request(
                self.url + "/", data=data, headers=dict(request.headers.items())
            )
            with urllib.request.urlopen(prepared, timeout=60) as response:
                result: dict[str, Any] = json.loads(response.read() or b"{}")
                return result

    Signed(url).deploy("model", model_url)


def main() -> int:
    n = int(env_float("N", 20000))
    duration_s = env_float("DURATION", 8.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8, 32])
    micro_rows = micro(n)
    with tempfile.TemporaryDirectory(prefix="shipyard-auth-") as tmp:
        work = Path(tmp)
        model = work / "model"
        kind = "sklearn" if write_sklearn(model) else "echo"
        if kind == "echo":
            (model / "code").mkdir(parents=True)
            (model / "code" / "inference.py").write_text(ECHO)
        with time_budget(len(concs) * 3 * (duration_s + 15) + 180):
            rows = through_wrk(work, model, concs, warmup_s, duration_s)
    print(
        f"## Authentication overhead ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)\n"
    )
    print(f"In process, {n:,} calls each after a warm-up (µs):\n")
    print(table(["what", "p50 µs", "p90 µs", "p99 µs"], micro_rows) + "\n")
    print(
        f"Through the gateway: {kind} model (the sklearn one of gateway_overhead.py when "
        "scikit-learn is importable, else echo), one instance, wrk -t1 -cC, "
        f"{warmup_s:g} s warm-up + "
        f"{duration_s:g} s measured, body {PEER_BODY} ({len(PEER_BODY.read_bytes())} B); "
        "auth off and on alternated per concurrency; no non-2xx answer in any run.\n"
    )
    headers = ["conc", "off req/s", "off p50 ms", "off p99 ms", "on req/s", "on p50 ms",
               "on p99 ms", "on/off"]  # fmt: skip
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    entry(main)
