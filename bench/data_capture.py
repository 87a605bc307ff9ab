"""What data capture costs: the same model with capture at 100 % and without, side by side.

    .venv/bin/python bench/data_capture.py        # DURATION=8 WARMUP=2 CONCS="1 8" ROUNDS=3

One gateway serves, per model (``echo``; ``sklearn`` too when scikit-learn is
importable), two endpoints of one instance each: ``<model>-off`` (no DataCaptureConfig)
and ``<model>-on`` (InitialSamplingPercentage 100, Input and Output, to a file://
folder). For each concurrency, ROUNDS rounds run wrk against one endpoint and then the
other (a warm-up run, then a measured one), alternating so that drift of this noisy
machine hits both alike; the medians of the rounds are reported, with the throughput
ratio on / off. Since this machine's load swings throughput from run to run, each run
also reads the gateway process's own CPU time (``/proc/<pid>/stat``, utime + stime) and
divides it by the requests answered: the CPU the gateway spends per invocation, with and
without capture, is the steadier figure of what capture costs. After the runs the
gateway's ``shipyard_capture_records_total`` says how many records were written, dropped
(buffer full) or failed: capture that kept up drops none.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from gateway_overhead import check, write_echo, write_sklearn
from harness import (
    PEER_BODY,
    ROLE_ARN,
    Control,
    ServerProcess,
    WrkResult,
    cpu_probe_ms,
    entry,
    env_float,
    env_ints,
    measure,
    require_wrk,
    start_gateway,
    table,
    time_budget,
)

Run = tuple[WrkResult, float]
"""A measured run and the gateway's CPU per request in it (µs)."""
Rows = list[tuple[str, int, list[Run], list[Run]]]
_TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def measure_cpu(pid: int, target: str, connections: int, warmup_s: float, duration_s: float) -> Run:
    """``measure``, and the gateway's CPU per request during the measured part."""
    if warmup_s > 0:
        measure(target, PEER_BODY, connections, 0, warmup_s)
    before = cpu_ticks(pid)
    result = measure(target, PEER_BODY, connections, 0, duration_s)
    used = (cpu_ticks(pid) - before) * _TICK_US
    return result, used / result.requests if result.requests else 0.0


def deploy(control: Control, name: str, model_url: str, capture: dict[str, Any] | None) -> None:
    control.call(
        "CreateModel",
        {
            "ModelName": name,
            "PrimaryContainer": {"Image": "shipyard/python", "ModelDataUrl": model_url},
            "ExecutionRoleArn": ROLE_ARN,
        },
    )
    config: dict[str, Any] = {
        "EndpointConfigName": name,
        "ProductionVariants": [
            {
                "VariantName": "v1",
                "ModelName": name,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
    }
    if capture is not None:
        config["DataCaptureConfig"] = capture
    control.call("CreateEndpointConfig", config)
    control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})


def wait_in_service(control: Control, name: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = control.call("DescribeEndpoint", {"EndpointName": name})["EndpointStatus"]
        if status == "InService":
            return
        if status == "Failed":
            raise RuntimeError(f"endpoint {name} failed")
        time.sleep(0.2)
    raise TimeoutError(f"endpoint {name} not InService after {timeout_s:g} s")


def capture_counts(gateway_url: str) -> dict[str, float]:
    """outcome -> records, summed over endpoints, from the gateway's /metrics."""
    with urllib.request.urlopen(gateway_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("shipyard_capture_records_total{"):
            labels, value = line.rsplit(" ", 1)
            outcome = labels.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = counts.get(outcome, 0.0) + float(value)
    return counts


def run(
    models: dict[str, Path],
    work: Path,
    concs: list[int],
    rounds: int,
    warmup_s: float,
    duration_s: float,
) -> tuple[Rows, dict[str, float]]:
    body = PEER_BODY.read_bytes()
    started: list[ServerProcess] = []
    try:
        gateway, url = start_gateway(work / "home")
        started.append(gateway)
        control = Control(url)
        capture = {
            "EnableCapture": True,
            "InitialSamplingPercentage": 100,
            "DestinationS3Uri": (work / "capture").as_uri(),
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        }
        for model, model_dir in models.items():
            deploy(control, f"{model}-off", model_dir.as_uri(), None)
            deploy(control, f"{model}-on", model_dir.as_uri(), capture)
        for model in models:
            for side in ("off", "on"):
                wait_in_service(control, f"{model}-{side}")
                check(f"{url}/endpoints/{model}-{side}/invocations", body, model)
        gateway.track()
        rows: Rows = []
        for model in models:
            for c in concs:
                off: list[Run] = []
                on: list[Run] = []
                pid = gateway.process.pid
                for _ in range(rounds):
                    for side, results in (("off", off), ("on", on)):
                        target = f"{url}/endpoints/{model}-{side}/invocations"
                        results.append(measure_cpu(pid, target, c, warmup_s, duration_s))
                    print(
                        f"  {model} c={c}: off {off[-1][0].rps:,.0f} req/s "
                        f"{off[-1][1]:.0f} us/req | on {on[-1][0].rps:,.0f} req/s "
                        f"{on[-1][1]:.0f} us/req",
                        file=sys.stderr,
                        flush=True,
                    )
                rows.append((model, c, off, on))
        time.sleep(6)  # one flush interval: what is buffered is written before counting
        return rows, capture_counts(url)
    finally:
        for server in reversed(started):
            left = server.stop()
            if left:
                print(f"WARNING: {server} left PIDs alive after SIGKILL: {left}", file=sys.stderr)


def _median(runs: list[Run], field: str) -> float:
    return statistics.median(getattr(r, field) for r, _ in runs)


def _cpu(runs: list[Run]) -> float:
    return statistics.median(cpu for _, cpu in runs)


def render(rows: Rows) -> str:
    headers = [
        "model",
        "conc",
        "off req/s",
        "off p50 ms",
        "off p99 ms",
        "on req/s",
        "on p50 ms",
        "on p99 ms",
        "req/s on/off",
        "off CPU us/req",
        "on CPU us/req",
        "CPU on/off",
        "errors",
    ]
    out = []
    for model, c, off, on in rows:
        errors = sum(r.errors for r, _ in off + on)
        off_rps, on_rps = _median(off, "rps"), _median(on, "rps")
        out.append(
            [
                model,
                c,
                off_rps,
                _median(off, "p50_ms"),
                _median(off, "p99_ms"),
                on_rps,
                _median(on, "p50_ms"),
                _median(on, "p99_ms"),
                f"{on_rps / off_rps:.2f}" if off_rps else "-",
                _cpu(off),
                _cpu(on),
                f"{_cpu(on) / _cpu(off):.2f}" if _cpu(off) else "-",
                errors,
            ]
        )
    return table(headers, out)


def main() -> int:
    require_wrk()
    duration_s = env_float("DURATION", 8.0)
    warmup_s = env_float("WARMUP", 2.0)
    concs = env_ints("CONCS", [1, 8])
    rounds = int(env_float("ROUNDS", 3))
    with tempfile.TemporaryDirectory(prefix="shipyard-bench-") as tmp:
        work = Path(tmp)
        models = {"echo": work / "models" / "echo"}
        write_echo(models["echo"])
        notes = []
        if write_sklearn(work / "models" / "sklearn"):
            models["sklearn"] = work / "models" / "sklearn"
        else:
            notes.append(f"sklearn: skipped, scikit-learn is not importable by {sys.executable}")
        runs = len(models) * len(concs) * rounds * 2
        budget = runs * (warmup_s + duration_s + 15) + 180
        probe_before = cpu_probe_ms()
        when = time.strftime("%Y-%m-%d %H:%M")
        with time_budget(budget):
            rows, counts = run(models, work, concs, rounds, warmup_s, duration_s)
        probe_after = cpu_probe_ms()
        files = sum(1 for _ in (work / "capture").rglob("*.jsonl"))
    print(f"## Data capture at 100 % vs off ({when}, {os.cpu_count()} cores)\n")
    print(
        f"wrk -t1 -cC, {warmup_s:g} s warm-up + {duration_s:g} s measured per run, {rounds} "
        f"rounds alternating off / on, medians shown; body {PEER_BODY} "
        f"({len(PEER_BODY.read_bytes())} B); one instance per endpoint behind one gateway; "
        f"capture to a file:// folder. CPU probe {probe_before} ms before / {probe_after} ms "
        "after (lower = faster).\n"
    )
    print(render(rows) + "\n")
    written = counts.get("written", 0.0)
    print(
        f"Capture records: {written:,.0f} written in {files:,} files, "
        f"{counts.get('dropped', 0.0):,.0f} dropped, {counts.get('failed', 0.0):,.0f} failed.\n"
    )
    for note in notes:
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    entry(main)
