"""Response streaming: time to first chunk through the gateway against the instance itself,
and the gateway's memory while it streams 1 GiB.

    .venv/bin/python bench/response_stream.py
    # REQUESTS=400 STREAM_MB=1024 CHUNK_KB=64 SLOW_MB=128 SLOW_MBPS=32 BUDGET_S=600

One gateway, one endpoint of one instance whose predict_fn returns a generator
(MODEL_CODE below). Two measurements:

1. Time to first chunk, side by side: REQUESTS pairs, each a request straight to the
   instance's ``/invocations`` (with the header the gateway sends to ask for a stream)
   and one to the gateway's ``/endpoints/<name>/invocations-response-stream``, in
   alternating order, both over keep-alive connections held by this process. Timed from
   sending the request to reading the first piece of the first chunk (the first
   PayloadPart frame through the gateway). The model yields its first chunk at once, so
   what is measured is the serving path; "added" is the gateway's time minus the
   instance's, per pair (median and p90 of those differences) and per percentile. For
   scale, the same is then measured for the model's answer joined whole: ``/invocations``
   on the instance against InvokeEndpoint through the gateway.
2. Memory: STREAM_MB MiB streamed as CHUNK_KB KiB chunks, read as fast as this process
   can, straight from the instance and then through the gateway (throughput of each),
   with the gateway's RSS sampled every 0.1 s (psutil) during the gateway run; then a
   slow client reading SLOW_MB MiB at SLOW_MBPS MiB/s through the gateway, sampled the
   same way: if the gateway buffered what the client has not read, its RSS would grow
   by about (instance rate - client rate) x time.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from harness import Control, ServerProcess, cpu_probe_ms, entry, env_float, start_gateway, table
from harness import time_budget as budget

MiB = 1024 * 1024
NAME = "stream"
STREAM_HEADER = "X-Shipyard-Response-Stream"  # what the gateway sends to ask for a stream

MODEL_CODE = '''"""Streams "chunks" chunks of "size" bytes (else one short line each) at once."""

import json


def input_fn(body, content_type):
    return json.loads(body or b"{}")


def predict_fn(request, model):
    return _chunks(int(request.get("chunks", 2)), int(request.get("size", 0)))


def _chunks(count, size):
    block = b"x" * size if size else None
    for n in range(count):
        yield block if block is not None else f"chunk {n}\\n"
'''


class Target:
    """One keep-alive connection to a place that streams: the instance or the gateway."""

    def __init__(self, name: str, url: str, path: str, headers: dict[str, str]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.name = name
        self.path = path
        self.headers = {"Content-Type": "application/json", **headers}
        self.connection = http.client.HTTPConnection(host, int(port), timeout=60)

    def first_chunk_s(self, body: bytes) -> float:
        """Seconds from sending the request to reading the first piece of the answer."""
        started = time.perf_counter()
        self.connection.request("POST", self.path, body=body, headers=self.headers)
        response = self.connection.getresponse()
        first = response.read1(65536)
        elapsed = time.perf_counter() - started
        if response.status != 200 or not first:
            raise RuntimeError(f"{self.name}: HTTP {response.status} {first[:200]!r}")
        response.read()
        return elapsed

    def drain(self, body: bytes, *, rate_mbps: float | None = None) -> tuple[int, float]:
        """Read a whole streamed answer (at most ``rate_mbps``): bytes and seconds."""
        started = time.perf_counter()
        self.connection.request("POST", self.path, body=body, headers=self.headers)
        response = self.connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {response.status} {response.read()[:200]!r}")
        total = 0
        while piece := response.read1(MiB):
            total += len(piece)
            if rate_mbps is not None:
                ahead = total / (rate_mbps * MiB) - (time.perf_counter() - started)
                if ahead > 0:
                    time.sleep(ahead)
        return total, time.perf_counter() - started

    def close(self) -> None:
        self.connection.close()


def instance_url(gateway: ServerProcess, gateway_url: str) -> str:
    """The one instance's address: the listening socket of the gateway's descendant."""
    gateway_port = int(gateway_url.rsplit(":", 1)[1])
    for pid in gateway.track():
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN and c.laddr.port != gateway_port:
                return f"http://127.0.0.1:{c.laddr.port}"
    raise RuntimeError("no listening instance found under the gateway")


@contextmanager
def sampled_rss(pid: int, period_s: float = 0.1) -> Iterator[list[float]]:
    """RSS of ``pid`` in MiB, sampled every ``period_s`` while the block runs."""
    samples: list[float] = []
    process = psutil.Process(pid)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(process.memory_info().rss / MiB)
            done.wait(period_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()
        samples.append(process.memory_info().rss / MiB)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ttfb(direct: Target, gateway: Target, requests: int) -> list[list[object]]:
    """Percentiles of the first chunk's time, both ways, and of the gateway's addition."""
    body = json.dumps({"chunks": 2}).encode()
    for _ in range(50):  # warm-up: connections, code paths, the instance's thread
        direct.first_chunk_s(body)
        gateway.first_chunk_s(body)
    pairs: list[tuple[float, float]] = []
    for n in range(requests):
        if n % 2:
            g = gateway.first_chunk_s(body)
            d = direct.first_chunk_s(body)
        else:
            d = direct.first_chunk_s(body)
            g = gateway.first_chunk_s(body)
        pairs.append((d * 1000, g * 1000))
    return _rows(pairs)


def _rows(pairs: list[tuple[float, float]]) -> list[list[object]]:
    d_ms = [d for d, _ in pairs]
    g_ms = [g for _, g in pairs]
    added = [g - d for d, g in pairs]
    rows: list[list[object]] = []
    for label, pick in (
        ("p50", lambda v: statistics.median(v)),
        ("p90", lambda v: percentile(v, 0.90)),
        ("p99", lambda v: percentile(v, 0.99)),
        ("mean", lambda v: statistics.fmean(v)),
    ):
        rows.append([label, pick(d_ms), pick(g_ms), pick(g_ms) - pick(d_ms), pick(added)])
    return rows


def stream_run(
    target: Target, megabytes: int, chunk_kb: int, watch_pid: int | None, rate: float | None
) -> tuple[float, float, list[float]]:
    """(MiB/s, seconds, RSS samples of ``watch_pid``) for one streamed answer."""
    chunks = megabytes * 1024 // chunk_kb
    body = json.dumps({"chunks": chunks, "size": chunk_kb * 1024}).encode()
    if watch_pid is None:
        total, seconds = target.drain(body, rate_mbps=rate)
        samples: list[float] = []
    else:
        with sampled_rss(watch_pid) as samples:
            total, seconds = target.drain(body, rate_mbps=rate)
    expected = chunks * chunk_kb * 1024
    if target.name == "instance" and total < expected:
        raise RuntimeError(f"instance answered {total} of {expected} bytes")
    return total / MiB / seconds, seconds, samples


def rss_row(label: str, samples: list[float], mbps: float, seconds: float) -> list[object]:
    start, peak, end = samples[0], max(samples), samples[-1]
    return [label, f"{mbps:,.0f}", f"{seconds:.1f}", start, peak, end, peak - start, len(samples)]


def main() -> int:
    requests = int(env_float("REQUESTS", 400))
    stream_mb = int(env_float("STREAM_MB", 1024))
    chunk_kb = int(env_float("CHUNK_KB", 64))
    slow_mb = int(env_float("SLOW_MB", 128))
    slow_mbps = env_float("SLOW_MBPS", 32)
    probe = cpu_probe_ms()
    with (
        tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp,
        budget(env_float("BUDGET_S", 600)),
    ):
        work = Path(tmp)
        model = work / "model" / "code"
        model.mkdir(parents=True)
        (model / "inference.py").write_text(MODEL_CODE)
        gateway, url = start_gateway(work / "home")
        targets: list[Target] = []
        try:
            Control(url).deploy(NAME, (work / "model").as_uri())
            direct_url = instance_url(gateway, url)
            direct = Target("instance", direct_url, "/invocations", {STREAM_HEADER: "true"})
            through = Target("gateway", url, f"/endpoints/{NAME}/invocations-response-stream", {})
            targets += [direct, through]
            started = time.perf_counter()
            latency = ttfb(direct, through, requests)
            ttfb_s = time.perf_counter() - started
            print(f"  time to first chunk: {requests} pairs in {ttfb_s:.1f} s", file=sys.stderr)
            # The same model answered whole, straight and through InvokeEndpoint: what the
            # gateway adds to any invocation on this machine, for scale.
            whole = Target("instance", direct_url, "/invocations", {})
            invoke = Target("gateway", url, f"/endpoints/{NAME}/invocations", {})
            targets += [whole, invoke]
            reference = ttfb(whole, invoke, requests)
            d_mbps, d_s, _ = stream_run(direct, stream_mb, chunk_kb, None, None)
            g_mbps, g_s, fast = stream_run(through, stream_mb, chunk_kb, gateway.process.pid, None)
            s_mbps, s_s, slow = stream_run(
                through, slow_mb, chunk_kb, gateway.process.pid, slow_mbps
            )
        finally:
            for target in targets:
                target.close()
            left = gateway.stop()
            if left:
                print(f"processes still alive: {left}", file=sys.stderr)
    print(f"CPU probe {probe} ms; Python {sys.version.split()[0]}; {os.cpu_count()} cores.\n")
    print(f"Time to first chunk (ms), {requests} pairs, a 2-chunk stream each:\n")
    print(table(["", "instance", "gateway", "gateway - instance", "added, per pair"], latency))
    print("\nFor scale, the same model answering whole: /invocations on the instance against")
    print(f"InvokeEndpoint through the gateway (time to the whole answer, ms), {requests} pairs:\n")
    print(table(["", "instance", "gateway", "gateway - instance", "added, per pair"], reference))
    print(f"\nStreaming {stream_mb} MiB in {chunk_kb} KiB chunks; gateway RSS in MiB:\n")
    rows = [
        ["instance directly", f"{d_mbps:,.0f}", f"{d_s:.1f}", "", "", "", "", ""],
        rss_row("through the gateway", fast, g_mbps, g_s),
        rss_row(
            f"through the gateway, client at {slow_mbps:g} MiB/s ({slow_mb} MiB)", slow, s_mbps, s_s
        ),
    ]
    print(table(["run", "MiB/s", "s", "RSS start", "peak", "end", "peak - start", "samples"], rows))
    return 0


if __name__ == "__main__":
    entry(main)
