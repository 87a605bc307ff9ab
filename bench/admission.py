"""Admission: priorities, deadlines and queue limits, measured from outside in one run.

    .venv/bin/python bench/admission.py   # SECONDS=20 CLIENTS=8

One gateway, one endpoint of a model that sleeps ``SLEEP_MS`` (10) per request on one
handler thread, with three priority levels. Three scenarios, each against the model
itself (the figures are wall time on this machine, read as ratios):

- **priority under saturation**: ``CLIENTS`` closed-loop clients keep the endpoint busy
  at level 3 while a client sends 10 % as many requests at level 1; the high class's p50
  and p99 against the same high-priority client alone on the idle endpoint. Goal: p99
  within 1.5x of idle, while the low class absorbs the wait. Run on the one handler
  thread and again on ``WORKERS`` (2): a request is never interrupted, so a high one
  that comes while the model works waits for what runs, up to a whole ``SLEEP_MS`` on
  one thread and about half of it on two.
- **a deadline behind a backlog**: a 500 ms request holds the instance, then a request
  with ``shipyard-deadline-ms=100``; the time to its 503. Goal: 100 +/- 25 ms.
- **a burst against a bound**: ``SHIPYARD_MAX_QUEUE_SIZE=8`` and a 1 s request holding the
  instance, then 64 requests at once; how many are refused and how fast. Goal: exactly
  56 refused, each in under 10 ms.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness import Control, entry, start_gateway, table, time_budget

RESULTS = Path(__file__).resolve().parent / "results" / "admission.md"
SECONDS = float(os.environ.get("SECONDS", "20"))
CLIENTS = int(os.environ.get("CLIENTS", "8"))
SLEEP_MS = float(os.environ.get("SLEEP_MS", "10"))
WORKERS = int(os.environ.get("WORKERS", "2"))

MODEL = """
import json, time

def model_fn(model_dir):
    return None

def transform_fn(model, body, content_type, accept):
    request = json.loads(body or b"{}")
    time.sleep(float(request.get("sleep_ms", 0)) / 1000)
    return json.dumps({"ok": True}), "application/json"
"""


def invoke(url: str, name: str, sleep_ms: float, attributes: str | None) -> tuple[int, float]:
    """One InvokeEndpoint over a fresh connection: its status and seconds."""
    request = urllib.request.Request(
        f"{url}/endpoints/{name}/invocations",
        data=json.dumps({"sleep_ms": sleep_ms}).encode(),
        method="POST",
    )
    request.add_header("Content-Type", "application/json")
    if attributes:
        request.add_header("X-Amzn-SageMaker-Custom-Attributes", attributes)
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        status = int(exc.code)
    return status, time.perf_counter() - began


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)]


def high_class(url: str, name: str, seconds: float, pace_s: float) -> list[float]:
    """The level-1 client: one request every ``pace_s``, for ``seconds``."""
    times: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        status, took = invoke(url, name, SLEEP_MS, "shipyard-priority=1")
        if status == 200:
            times.append(took)
        time.sleep(pace_s)
    return times


def saturated(url: str, name: str) -> tuple[list[float], list[float], list[float]]:
    """Idle high-class latencies, then high and low under saturation."""
    pace_s = SLEEP_MS / 1000 * 10 / CLIENTS  # about a tenth of the low class's rate
    idle = high_class(url, name, SECONDS / 2, pace_s)
    low: list[float] = []
    done = threading.Event()

    def low_client() -> None:
        while not done.is_set():
            status, took = invoke(url, name, SLEEP_MS, "shipyard-priority=3")
            if status == 200:
                low.append(took)

    threads = [threading.Thread(target=low_client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the queue fills before the high class is measured
    high = high_class(url, name, SECONDS, pace_s)
    done.set()
    for thread in threads:
        thread.join()
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
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def one() -> None:
        found = invoke(url, name, 0, None)
        with lock:
            results.append(found)

    threads = [threading.Thread(target=one) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    holder.join()
    refused = [took for status, took in results if status == 503]
    return len(refused), refused


def main() -> int:
    with tempfile.TemporaryDirectory() as folder, time_budget(SECONDS * 2 + 300):
        work = Path(folder)
        (work / "model" / "code").mkdir(parents=True)
        (work / "model" / "code" / "inference.py").write_text(MODEL)
        server, url = start_gateway(work / "home")
        try:
            control = Control(url)
            model = (work / "model").as_uri()
            control.deploy("ranked", model, environment={"SHIPYARD_PRIORITY_LEVELS": "3"})
            control.deploy(
                "threads",
                model,
                environment={
                    "SHIPYARD_PRIORITY_LEVELS": "3",
                    "SAGEMAKER_MODEL_SERVER_WORKERS": str(WORKERS),
                },
            )
            control.deploy(
                "bounded",
                model,
                environment={"SHIPYARD_PRIORITY_LEVELS": "3", "SHIPYARD_MAX_QUEUE_SIZE": "8"},
            )
            idle, high, low = saturated(url, "ranked")
            idle_n, high_n, low_n = saturated(url, "threads")
            deadlines = behind_a_backlog(url, "ranked")
            refused, refusals = burst(url, "bounded")
        finally:
            server.stop()
    ms = 1000.0
    rows = [
        ["high class, idle endpoint", len(idle), f"{percentile(idle, 0.5) * ms:.1f}",
         f"{percentile(idle, 0.99) * ms:.1f}"],
        ["high class, saturated", len(high), f"{percentile(high, 0.5) * ms:.1f}",
         f"{percentile(high, 0.99) * ms:.1f}"],
        ["low class, saturated", len(low), f"{percentile(low, 0.5) * ms:.1f}",
         f"{percentile(low, 0.99) * ms:.1f}"],
        [f"high class, idle endpoint, {WORKERS} threads", len(idle_n),
         f"{percentile(idle_n, 0.5) * ms:.1f}", f"{percentile(idle_n, 0.99) * ms:.1f}"],
        [f"high class, saturated, {WORKERS} threads", len(high_n),
         f"{percentile(high_n, 0.5) * ms:.1f}", f"{percentile(high_n, 0.99) * ms:.1f}"],
        [f"low class, saturated, {WORKERS} threads", len(low_n),
         f"{percentile(low_n, 0.5) * ms:.1f}", f"{percentile(low_n, 0.99) * ms:.1f}"],
    ]  # fmt: skip
    ratio = percentile(high, 0.99) / percentile(idle, 0.99)
    ratio_n = percentile(high_n, 0.99) / percentile(idle_n, 0.99)
    report = "\n".join(
        [
            f"# Admission ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)",
            "",
            f"`SECONDS={SECONDS:g} CLIENTS={CLIENTS} SLEEP_MS={SLEEP_MS:g} "
            f"WORKERS={WORKERS} .venv/bin/python bench/admission.py`",
            "",
            table(["requests", "n", "p50 ms", "p99 ms"], rows),
            "",
            f"High class p99 saturated / idle: **{ratio:.2f}x** on one handler thread, "
            f"**{ratio_n:.2f}x** on {WORKERS} (goal: at most 1.5x). A request is never "
            "interrupted: a high one waits for the one running when it comes.",
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
