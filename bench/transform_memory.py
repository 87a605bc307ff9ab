"""Batch transform memory: a 2 GiB CSV object through a cheap model, RSS sampled throughout.

    .venv/bin/python bench/transform_memory.py
    # INPUT_MB=2048 INSTANCES=2 CONCURRENCY=2 PAYLOAD_MB=6 BUDGET_S=480

Writes one CSV object of INPUT_MB MiB to a temporary folder block by block (a 16 MiB
block of random 20-feature lines, ~190 bytes each, written over and over; it is never
held whole), and runs one transform job over it (SplitType Line, BatchStrategy
MultiRecord, AssembleWith Line) with a model that answers ``1`` per line. A thread samples
every 0.5 s the resident size (psutil) of the gateway and of each of its descendants (the
job's instances). Reported per process: RSS at the start, the peak, at the end and the
growth (peak - start, end - start). The gateway's start is taken just before
CreateTransformJob and its end once the job is Completed and its instances are gone; an
instance's start is its first sample after it answered its first request (the model drops
a marker file), its end its last sample. Goal: growth under 100 MB for each. The input is
deleted at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
from harness import (
    Control,
    ServerProcess,
    cpu_probe_ms,
    entry,
    env_float,
    start_gateway,
    table,
    time_budget,
)
from transform_throughput import as_epoch, create_job, create_model

MB = 1024 * 1024
GOAL_MB = 100.0

CHEAP_CODE = '''"""One "1" per input line; drops $BENCH_MARK_DIR/<pid> on its first request."""

import os

_marked = []


def transform_fn(model, body, content_type, accept):
    if not _marked:
        _marked.append(True)
        folder = os.environ.get("BENCH_MARK_DIR")
        if folder:
            open(os.path.join(folder, str(os.getpid())), "w").close()
    return b"1\\n" * body.count(b"\\n"), "text/csv"
'''


def write_input(path: Path, size_bytes: int) -> int:
    """A CSV object of at least ``size_bytes``, written a block at a time; its line count."""
    rng = np.random.default_rng(11)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[bytes] = []
    block_size = 0
    while block_size < 16 * MB:
        line = (",".join(f"{v:.6f}" for v in rng.normal(size=20)) + "\n").encode()
        rows.append(line)
        block_size += len(line)
    block = b"".join(rows)
    written = lines = 0
    with open(path, "wb") as out:
        while written < size_bytes:
            out.write(block)
            written += len(block)
            lines += len(rows)
    return lines


@dataclass
class Series:
    """The RSS samples of one process, in bytes, and when each was taken."""

    samples: list[tuple[float, int]] = field(default_factory=list)
    start: int | None = None

    def add(self, at: float, rss: int) -> None:
        self.samples.append((at, rss))

    @property
    def peak(self) -> int:
        return max(rss for _, rss in self.samples)

    @property
    def end(self) -> int:
        return self.samples[-1][1]


class Sampler(threading.Thread):
    """RSS of the gateway and its descendants every ``period_s`` until ``stop``."""

    def __init__(self, gateway_pid: int, marks: Path, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.gateway = psutil.Process(gateway_pid)
        self.marks = marks
        self.period_s = period_s
        self.gateway_rss = Series()
        self.instances: dict[int, Series] = {}
        self._stop_event = threading.Event()

    def sample(self) -> None:
        at = time.monotonic()
        self.gateway_rss.add(at, self.gateway.memory_info().rss)
        for child in self.gateway.children(recursive=True):
            try:
                rss = child.memory_info().rss
            except psutil.Error:
                continue
            series = self.instances.setdefault(child.pid, Series())
            series.add(at, rss)
            if series.start is None and (self.marks / str(child.pid)).exists():
                series.start = rss

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            try:
                self.sample()
            except psutil.Error:
                pass

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def mb(value: int) -> float:
    return value / MB


def main() -> int:
    input_mb = int(env_float("INPUT_MB", 2048))
    instances = int(env_float("INSTANCES", 2))
    concurrency = int(env_float("CONCURRENCY", 2))
    payload_mb = int(env_float("PAYLOAD_MB", 6))
    with time_budget(env_float("BUDGET_S", 480)), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "model" / "code").mkdir(parents=True)
        (work / "model" / "code" / "inference.py").write_text(CHEAP_CODE)
        marks = work / "marks"
        marks.mkdir()
        source = work / "in" / "big.csv"
        t = time.perf_counter()
        lines = write_input(source, input_mb * MB)
        size = source.stat().st_size
        print(
            f"  wrote {size / MB:,.0f} MiB, {lines:,} lines, in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        gateway: ServerProcess | None = None
        sampler: Sampler | None = None
        try:
            gateway, url = start_gateway(work / "home")
            control = Control(url)
            create_model(control, "mem-model", work / "model")
            sampler = Sampler(gateway.process.pid, marks)
            time.sleep(1.0)
            sampler.sample()
            sampler.gateway_rss.start = sampler.gateway_rss.samples[-1][1]
            sampler.start()
            name = f"mem-{int(time.time())}"
            started = time.monotonic()
            create_job(control, name, "mem-model", source.parent, work / "out",
                       instances=instances, concurrency=concurrency, payload_mb=payload_mb,
                       environment={"BENCH_MARK_DIR": str(marks)})  # fmt: skip
            while True:
                gateway.track()
                described = control.call("DescribeTransformJob", {"TransformJobName": name})
                if described["TransformJobStatus"] not in ("InProgress", "Stopping"):
                    break
                if time.monotonic() - started > 400:
                    control.call("StopTransformJob", {"TransformJobName": name})
                    raise TimeoutError(f"{name} not done after 400 s")
                time.sleep(0.5)
            wall_s = time.monotonic() - started
            deadline = time.monotonic() + 30
            while gateway.process.pid and time.monotonic() < deadline:
                if not psutil.Process(gateway.process.pid).children(recursive=True):
                    break
                time.sleep(0.2)
            time.sleep(1.0)
            sampler.stop()
            sampler.sample()
            status = described["TransformJobStatus"]
            start_end_s = as_epoch(described["TransformEndTime"]) - as_epoch(
                described["TransformStartTime"]
            )
            out = work / "out" / "big.csv.out"
            answered = out.stat().st_size // 2 if out.exists() else 0
            with open(f"/proc/{gateway.process.pid}/status") as f:
                hwm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM"))
        finally:
            if sampler is not None and sampler.is_alive():
                sampler.stop()
            if gateway is not None:
                left = gateway.stop()
                if left:
                    print(f"WARNING: {gateway} left PIDs alive: {left}", file=sys.stderr)
            source.unlink(missing_ok=True)
        assert sampler is not None
        rows = []
        ok = status == "Completed" and answered == lines
        series = [("gateway", sampler.gateway_rss)]
        series += [(f"instance {pid}", s) for pid, s in sorted(sampler.instances.items())]
        for label, s in series:
            start = s.start if s.start is not None else s.samples[0][1]
            if label == "gateway":
                taken = "before CreateTransformJob"
            else:
                taken = "after its 1st request" if s.start is not None else "1st sample, no marker"

            growth = max(mb(s.peak - start), mb(s.end - start))
            ok = ok and growth < GOAL_MB
            rows.append(
                [
                    label,
                    mb(s.samples[0][1]),
                    mb(start),
                    taken,
                    mb(s.peak),
                    mb(s.end),
                    mb(s.peak - start),
                    mb(s.end - start),
                    len(s.samples),
                    "met" if growth < GOAL_MB else "missed",
                ]  # fmt: skip
            )
        report = [
            f"One object of {size / MB:,.0f} MiB ({lines:,} CSV lines, ~{size / lines:.0f} "
            f"bytes each), InstanceCount {instances}, MaxConcurrentTransforms {concurrency}, "
            f"MaxPayloadInMB {payload_mb}, BatchStrategy MultiRecord, a model answering `1` "
            f"per line. CPU probe {cpu_probe_ms()} ms. Python {sys.version.split()[0]}, "
            f"{os.cpu_count()} cores.",
            "",
            f"Job {status}: {answered:,} of {lines:,} lines answered; create→Completed "
            f"{wall_s:.1f} s ({lines / wall_s:,.0f} lines/s, {size / MB / wall_s:.1f} MiB/s); "
            f"TransformStartTime→TransformEndTime {start_end_s:.1f} s. Gateway VmHWM "
            f"{mb(hwm):.1f} MiB (its whole life).",
            "",
            "RSS in MiB, sampled every 0.5 s:",
            "",
            table(
                [
                    "process",
                    "first sample",
                    "start",
                    "start taken",
                    "peak",
                    "end",
                    "peak - start",
                    "end - start",
                    "samples",
                    f"growth < {GOAL_MB:.0f} MB",
                ],
                rows,
            ),  # fmt: skip
        ]
        print("\n".join(report))
        return 0 if ok else 1


if __name__ == "__main__":
    entry(main)
