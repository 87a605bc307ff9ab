"""Bidirectional streaming: the round trip of one 1 KB part on an open stream, against
the same model over the one-way response stream; and many streams at once for a while,
with the gateway's memory.

    .venv/bin/python bench/bidi_stream.py
    # PARTS=2000 REQUESTS=2000 PART_BYTES=1024 STREAMS=50 SOAK_S=60 BUDGET_S=600

One gateway serving h2c on ``--http2-port``, one endpoint of one built-in instance whose
model echoes (MODEL_CODE: ``stream_fn`` yields each part back; ``predict_fn`` yields the
request back as one chunk). Three measurements:

1. Round trip of a part: one stream open, PARTS parts of PART_BYTES each sent one at a
   time, each timed from writing its event to reading its echo (HTTP/2 over a kept
   connection, tests/h2client.py's raw h2 client).
2. For scale, the same bytes over InvokeEndpointWithResponseStream: REQUESTS requests of
   PART_BYTES over a kept HTTP/1.1 connection, each timed from sending to reading the
   first PayloadPart: what one part costs when each needs a request of its own.
3. STREAMS streams at once on one connection for SOAK_S seconds, each sending a part and
   waiting for its echo in a loop; parts per second, and the gateway's RSS sampled every
   second (start, peak, end): memory that grew with time would show as end above start.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
from harness import Control, cpu_probe_ms, entry, env_float, free_port, start_gateway, table
from harness import time_budget as budget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.h2client import H2Client  # the project's own raw h2 client

NAME = "echo"
MODEL_CODE = '''"""Echoes: each part back (stream_fn), or the request as one chunk (predict_fn)."""


def model_fn(model_dir):
    return None


def input_fn(body, content_type):
    return body


def predict_fn(body, model):
    yield body


def stream_fn(parts, model):
    for part in parts:
        yield part
'''


def percentiles(samples_s: list[float]) -> list[str]:
    ordered = sorted(samples_s)

    def at(q: float) -> str:
        return f"{ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000:.2f}"

    return [at(0.5), at(0.9), at(0.99), f"{statistics.mean(ordered) * 1000:.2f}"]


async def round_trips(port: int, parts: int, size: int) -> list[float]:
    client = await H2Client.connect(port)
    stream = await client.open(NAME)
    payload = os.urandom(size)
    out = []
    for _ in range(parts):
        began = time.perf_counter()
        await stream.part(payload)
        event = await stream.next_event()
        out.append(time.perf_counter() - began)
        assert event is not None and event.data == payload
    await stream.end()
    await stream.rest()
    await client.close()
    return out


def one_way(url: str, requests: int, size: int) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = os.urandom(size)
    path = f"/endpoints/{NAME}/invocations-response-stream"
    headers = {"Content-Type": "application/octet-stream"}
    out = []
    for _ in range(requests):
        began = time.perf_counter()
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(16)  # the first PayloadPart's prelude: the first chunk is here
        out.append(time.perf_counter() - began)
        response.read()
    conn.close()
    return out


async def soak(port: int, streams: int, seconds: float, size: int, pid: int) -> tuple[int, list]:
    client = await H2Client.connect(port)
    payload = os.urandom(size)
    deadline = time.monotonic() + seconds
    counts = [0] * streams
    rss: list[float] = []
    process = psutil.Process(pid)

    async def one(n: int) -> None:
        stream = await client.open(NAME)
        while time.monotonic() < deadline:
            await stream.part(payload)
            event = await stream.next_event()
            assert event is not None
            counts[n] += 1
        await stream.end()
        await stream.rest()

    async def sample() -> None:
        while time.monotonic() < deadline:
            rss.append(process.memory_info().rss / 2**20)
            await asyncio.sleep(1.0)

    await asyncio.gather(sample(), *(one(n) for n in range(streams)))
    await client.close()
    return sum(counts), rss


def main() -> int:
    parts = int(env_float("PARTS", 2000))
    requests = int(env_float("REQUESTS", 2000))
    size = int(env_float("PART_BYTES", 1024))
    streams = int(env_float("STREAMS", 50))
    soak_s = env_float("SOAK_S", 60)
    probe = cpu_probe_ms()
    with (
        tempfile.TemporaryDirectory(prefix="bench-bidi-") as tmp,
        budget(env_float("BUDGET_S", 600)),
    ):
        work = Path(tmp)
        (work / "model" / "code").mkdir(parents=True)
        (work / "model" / "code" / "inference.py").write_text(MODEL_CODE)
        h2_port = free_port()
        gateway, url = start_gateway(work / "home", args=["--http2-port", str(h2_port)])
        try:
            Control(url).deploy(NAME, (work / "model").as_uri())
            asyncio.run(round_trips(h2_port, 50, size))  # warm both paths
            one_way(url, 50, size)
            bidi = asyncio.run(round_trips(h2_port, parts, size))
            stream = one_way(url, requests, size)
            total, rss = asyncio.run(soak(h2_port, streams, soak_s, size, gateway.process.pid))
        finally:
            left = gateway.stop()
            if left:
                print(f"processes still alive: {left}", file=sys.stderr)
    print(f"CPU probe {probe} ms; Python {sys.version.split()[0]}; {os.cpu_count()} cores.\n")
    print(f"Round trip of one {size}-byte part (ms):\n")
    rows = [
        [f"bidirectional stream, {parts} parts on one stream", *percentiles(bidi)],
        [f"response stream, {requests} requests (to the first part)", *percentiles(stream)],
    ]
    print(table(["", "p50", "p90", "p99", "mean"], rows))
    p50_ratio = statistics.median(bidi) / statistics.median(stream)
    print(f"\nbidirectional p50 / response-stream p50: {p50_ratio:.2f}x\n")
    print(f"{streams} streams at once for {soak_s:g} s, each a part and its echo in a loop:\n")
    rows = [
        [
            f"{total:,}",
            f"{total / soak_s:,.0f}",
            f"{rss[0]:.1f}",
            f"{max(rss):.1f}",
            f"{rss[-1]:.1f}",
            f"{rss[-1] - rss[0]:+.1f}",
            len(rss),
        ]
    ]
    print(
        table(["round trips", "per s", "RSS start", "peak", "end", "end - start", "samples"], rows)
    )
    print(json.dumps({"bidi_p50_ms": statistics.median(bidi) * 1000}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    entry(main)
