"""Batch transform throughput: 1,000,000 CSV lines through the sklearn model, against a loop.

    .venv/bin/python bench/transform_throughput.py
    # LINES=1000000 OBJECTS=4 PAYLOAD_MB=6 CONFIGS="1x1 1x2 2x1 2x2" BUDGET_S=480

Generates LINES rows of 20 features (``%.6f``, ~190 bytes a line) once, split into
OBJECTS files under one ``file://`` prefix, and the peer harness's LogisticRegression
(``gateway_overhead.write_sklearn``) in a model directory whose ``code/inference.py`` reads
a CSV payload of many lines with one ``np.fromstring`` and answers one label per line.

The physical limit first: this process reads the same files, cuts them into the payloads
the gateway makes (as many whole lines as fit in PAYLOAD_MB) and calls the same
``input_fn``, ``predict_fn`` and ``output_fn`` on each. Then, for each config
``<InstanceCount>x<MaxConcurrentTransforms>``, one gateway runs one transform job
(SplitType Line, BatchStrategy MultiRecord, AssembleWith Line) over the prefix, timed from
CreateTransformJob to the first DescribeTransformJob that says Completed. The loop runs
again at the end, so drift shows. Every output is checked byte for byte against the loop's.

Where the time goes, measured in every run: the model appends each request's parse,
predict and format time to a file (the job's ``Environment`` names it), and the CPU time
of the gateway and of the job's instances is read from /proc (psutil) while the job runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import psutil
from gateway_overhead import write_sklearn
from harness import (
    ROLE_ARN,
    Control,
    ServerProcess,
    cpu_probe_ms,
    entry,
    env_float,
    start_gateway,
    table,
    time_budget,
)

FEATURES = 20
MB = 1024 * 1024

CSV_CODE = '''"""LogisticRegression over CSV batches: one row a line in, one label a line out.

Appends "pid n start parse_s predict_s format_s" per request to $BENCH_TIMING_FILE, if set.
"""

import os
import pickle
import threading
import time

import numpy as np

FEATURES = 20
_NEWLINE_TO_COMMA = bytes.maketrans(b"\\n", b",")
_timing = threading.local()


def model_fn(model_dir):
    with open(os.path.join(model_dir, "model.pkl"), "rb") as f:
        return pickle.load(f)


def input_fn(body, content_type):
    _timing.t0 = time.perf_counter()
    _timing.wall0 = time.time()
    flat = np.fromstring(bytes(body).translate(_NEWLINE_TO_COMMA), dtype=np.float64, sep=",")
    _timing.t1 = time.perf_counter()
    return flat.reshape(-1, FEATURES)


def predict_fn(data, model):
    labels = model.predict(data)
    _timing.t2 = time.perf_counter()
    return labels


def output_fn(prediction, accept):
    body = "\\n".join(map(str, prediction.tolist())) + "\\n"
    path = os.environ.get("BENCH_TIMING_FILE")
    if path:
        t = _timing
        line = (
            f"{os.getpid()} {len(prediction)} {t.wall0:.6f} {t.t1 - t.t0:.6f} "
            f"{t.t2 - t.t1:.6f} {time.perf_counter() - t.t2:.6f}\\n"
        )
        with open(path, "a") as f:
            f.write(line)
    return body, "text/csv"
'''


# ----------------------------------------------------------------------------- inputs
def write_model(model_dir: Path) -> None:
    """The peer harness's sklearn model, with the CSV batch handlers above."""
    if not write_sklearn(model_dir):
        print("scikit-learn is not installed in this Python", file=sys.stderr)
        sys.exit(2)
    (model_dir / "code" / "inference.py").write_text(CSV_CODE)


def write_inputs(folder: Path, lines: int, objects: int) -> list[Path]:
    """``lines`` random rows split evenly into ``objects`` CSV files, written in blocks."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    paths = []
    per_object = -(-lines // objects)
    left = lines
    for number in range(objects):
        path = folder / f"part-{number:02d}.csv"
        with open(path, "wb") as out:
            todo = min(per_object, left)
            left -= todo
            while todo:
                block = min(todo, 50_000)
                np.savetxt(out, rng.normal(size=(block, FEATURES)), fmt="%.6f", delimiter=",")
                todo -= block
        paths.append(path)
    return paths


def load_handlers(model_dir: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_csv_model", model_dir / "code" / "inference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def payload_cuts(data: bytes, limit: int) -> list[tuple[int, int]]:
    """(start, end) of each payload: as many whole lines as fit in ``limit`` bytes, as the
    gateway packs them (each line with its newline)."""
    cuts = []
    at = 0
    while at < len(data):
        end = at + limit
        if end >= len(data):
            cuts.append((at, len(data)))
            break
        cut = data.rfind(b"\n", at, end) + 1
        cuts.append((at, cut))
        at = cut
    return cuts


# ----------------------------------------------------------------------------- the loop
@dataclass(frozen=True)
class LoopResult:
    records: int
    seconds: float
    payloads: int
    lines_per_payload: int
    parse_s: float
    predict_s: float
    format_s: float
    digests: dict[str, str]

    @property
    def rps(self) -> float:
        return self.records / self.seconds


def run_loop(model_dir: Path, paths: list[Path], payload_bytes: int) -> LoopResult:
    """One process: read each file, cut it into payloads, input_fn → predict → output_fn."""
    handlers = load_handlers(model_dir)
    model = handlers.model_fn(str(model_dir))
    os.environ.pop("BENCH_TIMING_FILE", None)
    records = payloads = 0
    parse_s = predict_s = format_s = 0.0
    digests = {}
    largest = 0
    started = time.perf_counter()
    for path in paths:
        data = path.read_bytes()
        digest = hashlib.sha256()
        for at, end in payload_cuts(data, payload_bytes):
            t0 = time.perf_counter()
            rows = handlers.input_fn(data[at:end], "text/csv")
            t1 = time.perf_counter()
            labels = handlers.predict_fn(rows, model)
            t2 = time.perf_counter()
            body, _ = handlers.output_fn(labels, "text/csv")
            format_s += time.perf_counter() - t2
            parse_s += t1 - t0
            predict_s += t2 - t1
            digest.update(body.encode())
            records += len(rows)
            largest = max(largest, len(rows))
            payloads += 1
        digests[path.name] = digest.hexdigest()
    seconds = time.perf_counter() - started
    return LoopResult(records, seconds, payloads, largest, parse_s, predict_s, format_s, digests)


# ----------------------------------------------------------------------------- the jobs
def as_epoch(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def create_model(control: Control, name: str, model_dir: Path) -> None:
    container = {"Image": "shipyard/python", "ModelDataUrl": model_dir.as_uri()}
    control.call(
        "CreateModel",
        {"ModelName": name, "PrimaryContainer": container, "ExecutionRoleArn": ROLE_ARN},
    )


def create_job(
    control: Control,
    name: str,
    model: str,
    source: Path,
    output: Path,
    *,
    instances: int,
    concurrency: int,
    payload_mb: int,
    environment: dict[str, str] | None = None,
) -> None:
    request: dict[str, Any] = {
        "TransformJobName": name,
        "ModelName": model,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": source.as_uri()}},
            "ContentType": "text/csv",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": output.as_uri(),
            "AssembleWith": "Line",
            "Accept": "text/csv",
        },
        "TransformResources": {"InstanceType": "ml.m5.large", "InstanceCount": instances},
        "BatchStrategy": "MultiRecord",
        "MaxPayloadInMB": payload_mb,
        "MaxConcurrentTransforms": concurrency,
    }
    if environment:
        request["Environment"] = environment
    control.call("CreateTransformJob", request)


class CpuMeter:
    """CPU seconds of the gateway and of its descendants while the job runs, read from
    /proc at each ``sample``; a process keeps the last figure seen before it ended.

    A descendant counts from the meter's start: the warm spare a job's instance is taken
    from was already running, and its CPU in the job is the instance's (an earlier version
    left out every process alive at the start, so a job from a warm spare read only the
    boot of the spare started to replace it). Spares started during the job count too."""

    def __init__(self, gateway_pid: int) -> None:
        self.gateway = psutil.Process(gateway_pid)
        self.start_gateway = self._cpu(self.gateway)
        self.gateway_s = 0.0
        self.children: dict[int, float] = {}
        self.start: dict[int, float] = {}
        for child in self.gateway.children(recursive=True):
            try:
                self.start[child.pid] = self._cpu(child)
            except psutil.Error:
                pass

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    def sample(self) -> None:
        self.gateway_s = self._cpu(self.gateway) - self.start_gateway
        for child in self.gateway.children(recursive=True):
            try:
                self.children[child.pid] = self._cpu(child) - self.start.get(child.pid, 0.0)
            except psutil.Error:
                pass

    @property
    def instances_s(self) -> float:
        return sum(self.children.values())


@dataclass(frozen=True)
class JobResult:
    name: str
    instances: int
    concurrency: int
    status: str
    wall_s: float
    start_end_s: float
    first_to_last_s: float
    records: int
    gateway_cpu_s: float
    instances_cpu_s: float
    parse_s: float
    predict_s: float
    format_s: float
    requests: int
    to_first_s: float
    after_last_s: float
    verified: str
    failure: str

    def rps(self, seconds: float) -> float:
        return self.records / seconds if seconds > 0 else 0.0


def run_job(
    control: Control,
    gateway: ServerProcess,
    work: Path,
    source: Path,
    loop: LoopResult,
    *,
    instances: int,
    concurrency: int,
    payload_mb: int,
    timeout_s: float,
) -> JobResult:
    name = f"tp-{instances}x{concurrency}-{int(time.time())}"
    output = work / "out" / name
    timing = work / f"{name}.timing"
    meter = CpuMeter(gateway.process.pid)
    created_at = time.time()
    started = time.monotonic()
    create_job(control, name, "tp-model", source, output, instances=instances,
               concurrency=concurrency, payload_mb=payload_mb,
               environment={"BENCH_TIMING_FILE": str(timing)})  # fmt: skip
    deadline = started + timeout_s
    while True:
        gateway.track()
        meter.sample()
        described = control.call("DescribeTransformJob", {"TransformJobName": name})
        status = described["TransformJobStatus"]
        if status not in ("InProgress", "Stopping"):
            break
        if time.monotonic() > deadline:
            control.call("StopTransformJob", {"TransformJobName": name})
            raise TimeoutError(f"{name} not done after {timeout_s:g} s")
        time.sleep(0.2)
    wall_s = time.monotonic() - started
    meter.sample()
    start_end_s = as_epoch(described["TransformEndTime"]) - as_epoch(
        described["TransformStartTime"]
    )
    requests = [line.split() for line in timing.read_text().splitlines()] if timing.exists() else []
    first = min((float(r[2]) for r in requests), default=0.0)
    # A request ends when its three phases do; the last one to end closes the span.
    last = max((float(r[2]) + sum(map(float, r[3:6])) for r in requests), default=0.0)
    records = sum(int(r[1]) for r in requests)
    verified = "no output"
    if status == "Completed":
        verified = "matches the loop"
        for object_name, digest in loop.digests.items():
            out = output / f"{object_name}.out"
            if hashlib.sha256(out.read_bytes()).hexdigest() != digest:
                verified = f"{object_name}.out differs from the loop"
    return JobResult(
        name=name,
        instances=instances,
        concurrency=concurrency,
        status=status,
        wall_s=wall_s,
        start_end_s=start_end_s,
        first_to_last_s=last - first,
        records=records,
        gateway_cpu_s=meter.gateway_s,
        instances_cpu_s=meter.instances_s,
        parse_s=sum(float(r[3]) for r in requests),
        predict_s=sum(float(r[4]) for r in requests),
        format_s=sum(float(r[5]) for r in requests),
        requests=len(requests),
        to_first_s=first - created_at if requests else 0.0,
        after_last_s=created_at + wall_s - last if requests else 0.0,
        verified=verified,
        failure=str(described.get("FailureReason", "")),
    )


# ----------------------------------------------------------------------------- report
def render(
    loops: list[LoopResult],
    jobs: list[JobResult],
    *,
    lines: int,
    objects: int,
    payload_mb: int,
    probe_before: float,
) -> str:
    best_loop = max(loops, key=lambda r: r.rps)
    out = [
        f"{lines:,} CSV lines of {FEATURES} features in {objects} objects, "
        f"MaxPayloadInMB {payload_mb} ({best_loop.lines_per_payload:,} lines a payload, "
        f"{best_loop.payloads} payloads). CPU probe {probe_before} ms before, "
        f"{cpu_probe_ms()} ms after (lower = faster). "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores.",
        "",
        "The loop (one process: read, cut into the same payloads, input_fn → predict_fn → "
        "output_fn):",
        "",
        table(
            ["run", "records/s", "seconds", "parse s", "predict s", "format s"],
            [
                [i + 1, r.rps, r.seconds, r.parse_s, r.predict_s, r.format_s]
                for i, r in enumerate(loops)
            ],
        ),
        "",
        "Transform jobs (InstanceCount x MaxConcurrentTransforms); ratios against the best "
        f"loop run ({best_loop.rps:,.0f} records/s):",
        "",
    ]
    best = {}
    for job in jobs:
        if job.status == "Completed":
            held = best.get(job.instances)
            if held is None or job.wall_s < held.wall_s:
                best[job.instances] = job
    rates = [
        [
            f"{job.instances}x{job.concurrency}"
            + (" (best)" if best.get(job.instances) is job else ""),
            job.status,
            job.rps(job.wall_s),
            job.wall_s,
            job.rps(job.wall_s) / best_loop.rps,
            job.rps(job.start_end_s),
            job.start_end_s,
            job.rps(job.start_end_s) / best_loop.rps,
            job.rps(job.first_to_last_s),
            job.rps(job.first_to_last_s) / best_loop.rps,
            job.verified,
        ]
        for job in jobs
    ]
    out.append(
        table(
            [
                "config",
                "status",
                "records/s create→Completed",
                "s",
                "ratio",
                "records/s Start→End",
                "s",
                "ratio",
                "records/s first payload→last answer",
                "ratio",
                "output",
            ],
            rates,
        )
    )
    spent = [
        [
            f"{job.instances}x{job.concurrency}",
            job.wall_s,
            job.to_first_s,
            job.first_to_last_s,
            job.after_last_s,
            job.parse_s,
            job.predict_s,
            job.format_s,
            (job.parse_s + job.predict_s + job.format_s) / job.first_to_last_s / job.instances
            if job.first_to_last_s
            else 0.0,
            job.gateway_cpu_s,
            job.instances_cpu_s,
            job.requests,
        ]
        for job in jobs
    ]
    out += [
        "",
        "Where the time goes (seconds). create→first payload: the job starts, its instances "
        "boot and load the model; last answer→Completed: the last output written, instances "
        "stopped, the status recorded and seen (polled every 0.2 s). The model's own times "
        "are summed over its requests (over threads too, so with MaxConcurrentTransforms 2 "
        "they overlap); busy = that sum / (span x instances). CPU: user + system of the "
        "gateway and of the processes under it (the job's instances, their boot included, "
        "and warm spares started meanwhile) while the job ran.",
        "",
        table(
            [
                "config",
                "create→Completed",
                "create→first payload",
                "first payload→last answer",
                "last answer→Completed",
                "model parse",
                "model predict",
                "model format",
                "instance busy",
                "gateway CPU",
                "instances CPU",
                "requests",
            ],
            spent,
        ),
    ]
    failures = [f"- {j.name}: {j.failure}" for j in jobs if j.failure]
    if failures:
        out += ["", "Failures:", *failures]
    return "\n".join(out) + "\n"


def main() -> int:
    lines = int(env_float("LINES", 1_000_000))
    objects = int(env_float("OBJECTS", 4))
    payload_mb = int(env_float("PAYLOAD_MB", 6))
    configs = os.environ.get("CONFIGS", "1x1 1x2 2x1 2x2").split()
    probe_before = cpu_probe_ms()
    with time_budget(env_float("BUDGET_S", 480)), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        write_model(model_dir)
        t = time.perf_counter()
        paths = write_inputs(work / "in", lines, objects)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"  wrote {lines:,} lines, {size / MB:.0f} MiB, in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        loops = [run_loop(model_dir, paths, payload_mb * MB)]
        print(f"  loop: {loops[0].rps:,.0f} records/s", file=sys.stderr, flush=True)
        jobs: list[JobResult] = []
        gateway: ServerProcess | None = None
        try:
            gateway, url = start_gateway(work / "home")
            control = Control(url)
            create_model(control, "tp-model", model_dir)
            for config in configs:
                instances, concurrency = (int(v) for v in config.split("x"))
                job = run_job(control, gateway, work, work / "in", loops[0],
                              instances=instances, concurrency=concurrency,
                              payload_mb=payload_mb, timeout_s=180)  # fmt: skip
                jobs.append(job)
                print(
                    f"  {config}: {job.status} {job.rps(job.wall_s):,.0f} records/s "
                    f"create→Completed ({job.wall_s:.1f} s), {job.verified}; "
                    f"gateway CPU {job.gateway_cpu_s:.1f} s, instances {job.instances_cpu_s:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            if gateway is not None:
                left = gateway.stop()
                if left:
                    print(f"WARNING: {gateway} left PIDs alive: {left}", file=sys.stderr)
        loops.append(run_loop(model_dir, paths, payload_mb * MB))
        print(f"  loop again: {loops[1].rps:,.0f} records/s", file=sys.stderr, flush=True)
        print(
            render(
                loops, jobs, lines=lines, objects=objects, payload_mb=payload_mb,
                probe_before=probe_before,
            )
        )  # fmt: skip
        summary = {
            "loop_rps": [round(r.rps) for r in loops],
            "jobs": {f"{j.instances}x{j.concurrency}": round(j.rps(j.wall_s)) for j in jobs},
        }
        print(json.dumps(summary), file=sys.stderr)
        ok = all(j.status == "Completed" and j.verified == "matches the loop" for j in jobs)
        return 0 if ok else 1


if __name__ == "__main__":
    entry(main)
