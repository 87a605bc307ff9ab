"""How fast the built-in Model Monitor analyzer reads a window of captured records.

    .venv/bin/python bench/model_monitor.py        # RECORDS=100000 BASELINE=10000

A baseline of BASELINE CSV rows (two integer, one fractional and one categorical
column) is suggested first; then RECORDS captured records, written as the gateway's
capture writer writes them (capture/jsonl.py, output and input as CSV, spread over one
hour in files of 10,000), are analysed as a monitoring run analyses its window, by
``python -m shipyard.monitoring.analyzer`` in a process of its own with a run's
environment. Reported: the wall time of each step, the analysis rate in records per
second and the violations found (the window is drawn from the baseline's distribution,
so none are expected). The goal: 100,000 records in under 30 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from harness import entry

from shipyard.capture.config import CaptureConfig
from shipyard.capture.jsonl import Captured, encode_lines

RECORDS = int(os.environ.get("RECORDS", "100000"))
BASELINE = int(os.environ.get("BASELINE", "10000"))
START = datetime(2026, 5, 1, 12, tzinfo=UTC)
GOAL_S = 30.0


def _rows(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    ages, incomes = rng.integers(18, 80, n), rng.normal(50_000, 10_000, n)
    colours, labels = rng.choice(["red", "green", "blue"], n), rng.integers(0, 2, n)
    return [[str(labels[i]), str(ages[i]), f"{incomes[i]:.2f}", str(colours[i])] for i in range(n)]


def _analyse(env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "shipyard.monitoring.analyzer"],
        env={**env, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return took


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        data = root / "baseline"
        data.mkdir()
        lines = ["label,age,income,colour", *(",".join(r) for r in _rows(BASELINE, 1))]
        (data / "train.csv").write_text("\n".join(lines) + "\n")
        baseline_env = {
            "dataset_format": json.dumps({"csv": {"header": True}}),
            "dataset_source": str(data),
            "output_path": str(root / "baseline-out"),
        }
        baseline_s = _analyse(baseline_env)
        capture = root / "capture" / "ep" / "AllTraffic" / "2026" / "05" / "01" / "12"
        capture.mkdir(parents=True)
        config = CaptureConfig(
            enabled=True,
            sampling_percentage=100,
            destination=capture.as_uri(),
            capture_input=True,
            capture_output=True,
        )
        rows = _rows(RECORDS, 2)
        write_started = time.perf_counter()
        for part in range(0, RECORDS, 10_000):
            items = [
                Captured(
                    at=START.timestamp() + (part + i) * 3599 / RECORDS,
                    inference_id=None,
                    input=",".join(row[1:]).encode(),
                    input_type="text/csv",
                    output=row[0].encode(),
                    output_type="text/csv",
                )
                for i, row in enumerate(rows[part : part + 10_000])
            ]
            (capture / f"{part:06d}.jsonl").write_bytes(encode_lines(items, config))
        write_s = time.perf_counter() - write_started
        run_env = {
            "dataset_format": json.dumps({"sagemakerCaptureJson": {"captureIndexNames": []}}),
            "dataset_source": str(root / "capture"),
            "output_path": str(root / "run-out"),
            "baseline_statistics": str(root / "baseline-out" / "statistics.json"),
            "baseline_constraints": str(root / "baseline-out" / "constraints.json"),
            "start_time": "2026-05-01T12:00:00Z",
            "end_time": "2026-05-01T13:00:00Z",
            "publish_cloudwatch_metrics": "Disabled",
        }
        run_s = _analyse(run_env)
        violations = json.loads((root / "run-out" / "constraint_violations.json").read_text())
        size_mb = sum(p.stat().st_size for p in capture.iterdir()) / 1e6
    when = time.strftime("%Y-%m-%d %H:%M")
    print(f"## Model Monitor analyzer: {RECORDS:,} records ({when}, {os.cpu_count()} cores)\n")
    print("| step | records | wall s | records/s |")
    print("|---|---|---|---|")
    steps = [
        ("suggest baseline (CSV)", BASELINE, baseline_s),
        (f"write the capture files ({size_mb:.1f} MB)", RECORDS, write_s),
        ("monitoring run (analyzer process)", RECORDS, run_s),
    ]
    for what, count, took in steps:
        print(f"| {what} | {count:,} | {took:.2f} | {count / took:,.0f} |")
    print(f"\nViolations found: {len(violations['violations'])} (expected 0).")
    met = "met" if run_s < GOAL_S else "NOT met"
    print(f"Goal: {RECORDS:,} records in under {GOAL_S:g} s: {met}.")
    return 0 if run_s < GOAL_S and not violations["violations"] else 1


if __name__ == "__main__":
    entry(main)
