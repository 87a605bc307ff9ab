"""Admission: priorities, deadlines and queue limits, measured from outside in one run.

    .venv/bin/python bench/admission.py   # SECONDS=20 CLIENTS=8 THREADS="1 2 4"

One gateway, endpoints of a model that sleeps what each request asks, with three priority
levels. Three scenarios, each against the model itself (the figures are wall
time on this machine, read as ratios):

- **priority under saturation**: ``CLIENTS`` closed-loop clients (at least two per
  handler thread, in a process of their own) keep the endpoint busy at level 3 while a
  client sends 10 % as many requests at level 1; the high class's p50 and p99 against
  the same high-priority client alone on the idle endpoint. Goal: p99 within 1.5x of
  idle, while the low class absorbs the wait. Run once per handler thread count in
  ``THREADS`` (1 2 4; ``SAGEMAKER_MODEL_SERVER_WORKERS``): a request is never
  interrupted, so a high one that comes while every thread works waits for the first of
  them to finish: up to a whole request's work on one thread (so the p99 of a saturated
  single thread is near twice the idle one whatever the queue does), less the more
  threads the instance has. Each request of either class asks for between half and
  one and a half ``SLEEP_MS`` (10) ms, drawn at random, as a model's work varies with
  its input: with one fixed time every thread's requests would start together and
  end together, in lockstep from the moment the clients start, and a high request
  would wait for all of them as if there were one.
- **a deadline behind a backlog**: a 500 ms request holds the instance, then a request
  with ``shipyard-deadline-ms=100``; the time to its 503. Goal: 100 +/- 25 ms.
- **a burst against a bound**: ``SHIPYARD_MAX_QUEUE_SIZE=8`` and a 1 s request holding the
  instance, then 64 requests at once; how many are refused and how fast. Goal: exactly
  56 refused, each in under 10 ms.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from multiprocessing.queues import Queue
from pathlib import Path

from harness import Control, entry, env_ints, start_gateway, table, time_budget

RESULTS = Path(__file__).resolve().parent / "results" / "admission.md"
SECONDS = float(os.environ.get("SECONDS", "20"))
CLIENTS = int(os.environ.get("CLIENTS", "8"))
SLEEP_MS = float(os.environ.get("SLEEP_MS", "10"))
THREADS = env_ints("THREADS", (1, 2, 4))

MODEL = """
import json, time

def model_fn(model_dir):
    return None

def transform_fn(model, body, content_type, accept):
    request = json.loads(body or b"{}")
    time.sleep(float(request.get("sleep_ms", 0)) / 1000)
    return json.dumps({"ok": True}), "application/json"
"""


_connections = threading.local()


def invoke(url: str, name: str, sleep_ms: float, attributes: str | None) -> tuple[int, float]:
    """One InvokeEndpoint on this thread's kept-alive connection (as boto3 keeps one): its
    status and seconds. Fresh connections would spend the small machine's cores on
    handshakes, which the high class's tail would read as waiting."""
    headers = {"Content-Type": "application/json"}
    if attributes:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = attributes
    body = json.dumps({"sleep_ms": sleep_ms}).encode()
    path = f"/endpoints/{name}/invocations"
    try:
        return _post(_connection(url), path, body, headers)
    except (OSError, http.client.HTTPException):  # the kept one closed: once more, anew
        _connections.connection = None
        return _post(_connection(url), path, body, headers)


def _connection(url: str) -> http.client.HTTPConnection:
    connection: http.client.HTTPConnection | None = getattr(_connections, "connection", None)
    if connection is None:
        address = urllib.parse.urlsplit(url)
        host = address.hostname or "127.0.0.1"
        connection = http.client.HTTPConnection(host, address.port, timeout=60)
        _connections.connection = connection
    return connection


def _post(
    connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, float]:
    began = time.perf_counter()
    try:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        response.read()
    except BaseException:
        connection.close()
        raise
    return int(response.status), time.perf_counter() - began


def work_ms() -> float:
    """A request's work: uniform over half to one and a half ``SLEEP_MS``."""
    return random.uniform(SLEEP_MS / 2, SLEEP_MS * 3 / 2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)]


def high_class(url: str, name: str, seconds: float, pace_s: float) -> list[float]:
    """The level-1 client: one request every ``pace_s``, for ``seconds``."""
    times: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        status, took = invoke(url, name, work_ms(), "shipyard-priority=1")
        if status == 200:
            times.append(took)
        time.sleep(pace_s)
    return times


def low_class(url: str, name: str, clients: int, until: float, out: Queue[list[float]]) -> None:
    """The level-3 clients, closed-loop until ``until`` (time.monotonic), in a process of
    their own: sharing the high class's process, their threads would hold its GIL, and
    its latencies would count the wait for the interpreter (up to the 5 ms switch
    interval each time) instead of the endpoint's."""
    low: list[float] = []

    def client() -> None:
        while time.monotonic() < until:
            status, took = invoke(url, name, work_ms(), "shipyard-priority=3")
            if status == 200:
                low.append(took)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(low)


def saturated(url: str, name: str, threads: int) -> tuple[list[float], list[float], list[float]]:
    """Idle high-class latencies, then high and low under saturation: ``threads`` handler
    threads, at least twice as many low clients, so requests always wait."""
    clients = max(CLIENTS, 2 * threads)
    pace_s = SLEEP_MS / 1000 * 10 / CLIENTS  # about a tenth of the low class's rate
    idle = high_class(url, name, SECONDS / 2, pace_s)
    results: Queue[list[float]] = multiprocessing.Queue()
    until = time.monotonic() + 1.0 + SECONDS
    process = multiprocessing.Process(
        target=low_class, args=(url, name, clients, until, results), daemon=True
    )
    process.start()
    time.sleep(1.0)  # the queue fills before the high class is measured
    high = high_class(url, name, SECONDS, pace_s)
    low = results.get(timeout=120)
    process.join(timeout=10)
    return idle, high, low


def behind_a_backlog(url: str, name: str) -> list[float]:
    """Seconds to the 503 of a 100 ms deadline behind a 500 ms request, five times."""
    answers: list[float] = []
    for _ in range(5):
        holder = threading.Thread(target=invoke, args=(url, name, 500, None))
        holder.start()
        time.sleep(0.1)
        status, took = invoke(url, name, 0, "shipyard-deadline-ms=100")
        holder.join()
        if status == 503:
            answers.append(took)
    return answers


def burst(url: str, name: str) -> tuple[int, list[float]]:
    """64 requests at once against a queue of 8 behind a 1 s request: refusals, times."""
    holder = threading.Thread(target=invoke, args=(url, name, 1000, None))
    holder.start()
    time.sleep(0.2)
    results = asyncio.run(_at_once(url, name, 64))
    holder.join()
    refused = [took for status, took in results if status == 503]
    return len(refused), refused


async def _at_once(url: str, name: str, count: int) -> list[tuple[int, float]]:
    """``count`` requests on connections opened beforehand, written together, each timed
    from its write to its answer's status line. One thread and one event loop: 64 client
    threads would time each other's turns at the interpreter, not the gateway's answer."""
    address = urllib.parse.urlsplit(url)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    body = json.dumps({"sleep_ms": 0}).encode()
    request = (
        f"POST /endpoints/{name}/invocations HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    connections = [await asyncio.open_connection(host, port) for _ in range(count)]

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, float]:
        began = time.perf_counter()
        writer.write(request)
        status = int((await reader.readline()).split()[1])
        took = time.perf_counter() - began
        writer.close()
        return status, took

    return await asyncio.gather(*(one(reader, writer) for reader, writer in connections))


def main() -> int:
    with tempfile.TemporaryDirectory() as folder, time_budget(len(THREADS) * SECONDS * 2 + 300):
        work = Path(folder)
        (work / "model" / "code").mkdir(parents=True)
        (work / "model" / "code" / "inference.py").write_text(MODEL)
        server, url = start_gateway(work / "home")
        try:
            control = Control(url)
            model = (work / "model").as_uri()
            for n in THREADS:
                control.deploy(
                    f"threads-{n}",
                    model,
                    environment={
                        "SHIPYARD_PRIORITY_LEVELS": "3",
                        "SAGEMAKER_MODEL_SERVER_WORKERS": str(n),
                    },
                )
            control.deploy(
                "bounded",
                model,
                environment={"SHIPYARD_PRIORITY_LEVELS": "3", "SHIPYARD_MAX_QUEUE_SIZE": "8"},
            )
            runs = {n: saturated(url, f"threads-{n}", n) for n in THREADS}
            deadlines = behind_a_backlog(url, "bounded")
            refused, refusals = burst(url, "bounded")
        finally:
            server.stop()
    ms = 1000.0

    def row(label: str, times: list[float]) -> list[str]:
        p50, p99 = percentile(times, 0.5) * ms, percentile(times, 0.99) * ms
        return [label, str(len(times)), f"{p50:.1f}", f"{p99:.1f}"]

    rows = []
    ratios = []
    for n, (idle, high, low) in runs.items():
        threads = f"{n} thread{'s' if n > 1 else ''}"
        rows += [
            row(f"high class, idle endpoint, {threads}", idle),
            row(f"high class, saturated, {threads}", high),
            row(f"low class, saturated, {threads}", low),
        ]
        ratio = percentile(high, 0.99) / percentile(idle, 0.99)
        ratios.append(f"**{ratio:.2f}x** on {threads}")
    report = "\n".join(
        [
            f"# Admission ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)",
            "",
            f"`SECONDS={SECONDS:g} CLIENTS={CLIENTS} SLEEP_MS={SLEEP_MS:g} "
            f'THREADS="{" ".join(map(str, THREADS))}" .venv/bin/python bench/admission.py`',
            "",
            table(["requests", "n", "p50 ms", "p99 ms"], rows),
            "",
            "High class p99 saturated / idle: " + ", ".join(ratios) + " (goal: at most "
            "1.5x). A request is never interrupted: a high one that comes while every "
            "handler thread works waits for the first of them to finish.",
            "",
            "A 100 ms deadline behind a 500 ms request, answered after (ms): "
            + ", ".join(f"{d * ms:.0f}" for d in deadlines)
            + f" (median {statistics.median(deadlines) * ms:.0f}; goal 100 +/- 25)."
            if deadlines
            else "No deadline was refused.",
            "",
            f"A burst of 64 against a queue of 8: **{refused}** refused (goal 56), the "
            f"slowest refusal in {max(refusals, default=0.0) * ms:.1f} ms, the median in "
            f"{statistics.median(refusals) * ms if refusals else 0.0:.1f} ms (goal: each "
            "under 10 ms).",
            "",
        ]
    )
    RESULTS.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    entry(main)
