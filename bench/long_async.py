"""Long asynchronous requests: each must complete on the instance it started on.

An asynchronous endpoint exists for requests that take minutes. This starts a gateway
with the built-in runtime serving a model that sleeps as long as each request says,
sends one request per LONG_ASYNC_MINUTES entry (default "1 10": one of 1 minute and
one of 10, at once, on two instances), and reports for each: its outcome, how long it
took end to end, and whether the instance that answered is the one that loaded the
model before (its PID), i.e. it was never restarted mid-request. Meanwhile it samples
/metrics for shipyard_requests_in_flight, which must show the work.

    .venv/bin/python bench/long_async.py            # about 10 minutes
    LONG_ASYNC_MINUTES="60" .venv/bin/python bench/long_async.py
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import Control, entry, start_gateway, table, time_budget

HERE = Path(__file__).resolve().parent
SLEEPY = HERE.parent / "tests" / "models" / "sleepy"
MINUTES = [float(m) for m in os.environ.get("LONG_ASYNC_MINUTES", "1 10").split()]
RESULTS = HERE / "results" / "long_async.md"


def invoke_async(url: str, endpoint: str, input_uri: str, timeout_s: int) -> dict[str, str]:
    request = urllib.request.Request(
        f"{url}/endpoints/{endpoint}/async-invocations", data=b"", method="POST"
    )
    request.add_header("X-Amzn-SageMaker-InputLocation", input_uri)
    request.add_header("X-Amzn-SageMaker-Content-Type", "application/json")
    request.add_header("X-Amzn-SageMaker-InvocationTimeoutSeconds", str(timeout_s))
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
        return {
            "id": body["InferenceId"],
            "output": response.headers["X-Amzn-SageMaker-OutputLocation"],
            "failure": response.headers["X-Amzn-SageMaker-FailureLocation"],
        }


def in_flight(url: str, endpoint: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = rf'^shipyard_requests_in_flight\{{endpoint="{endpoint}",variant="v1"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def main() -> int:
    longest_s = max(MINUTES) * 60
    with time_budget(longest_s + 300), tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Replaced within 20 s if an instance stopped answering /ping (the default).
        server, url = start_gateway(root / "home")
        try:
            return run(root, url, longest_s)
        finally:
            server.stop()


def run(root: Path, url: str, longest_s: float) -> int:
    control = Control(url)
    name = "long"
    out = root / "out"
    control.call(
        "CreateModel",
        {
            "ModelName": name,
            "PrimaryContainer": {"Image": "shipyard/python", "ModelDataUrl": str(SLEEPY)},
        },
    )
    control.call(
        "CreateEndpointConfig",
        {
            "EndpointConfigName": name,
            "ProductionVariants": [
                {
                    "VariantName": "v1",
                    "ModelName": name,
                    "InstanceType": "ml.m5.large",
                    "InitialInstanceCount": len(MINUTES),
                    "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
                }
            ],
            "AsyncInferenceConfig": {
                "OutputConfig": {"S3OutputPath": (out / "ok").as_uri()},
                "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 1},
            },
        },
    )
    control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})
    while control.call("DescribeEndpoint", {"EndpointName": name})["EndpointStatus"] != "InService":
        time.sleep(0.2)

    pids_before = {p.name for p in Path("/proc").iterdir() if p.name.isdigit()}
    sent: list[tuple[float, float, dict[str, str]]] = []
    for minutes in MINUTES:
        body = root / f"{uuid.uuid4().hex}.json"
        body.write_text(json.dumps({"sleep": minutes * 60}))
        timeout_s = int(minutes * 60 * 2 + 60)
        sent.append((minutes, time.monotonic(), invoke_async(url, name, body.as_uri(), timeout_s)))

    peak = 0.0
    done: dict[str, tuple[str, float, Any]] = {}
    deadline = time.monotonic() + longest_s * 2 + 120
    while len(done) < len(sent) and time.monotonic() < deadline:
        peak = max(peak, in_flight(url, name))
        for _, started, request in sent:
            if request["id"] in done:
                continue
            ok = Path(request["output"].removeprefix("file://"))
            failed = Path(request["failure"].removeprefix("file://"))
            if ok.exists():
                done[request["id"]] = ("Completed", time.monotonic() - started, ok.read_text())
            elif failed.exists():
                done[request["id"]] = ("Failed", time.monotonic() - started, failed.read_text())
        time.sleep(1.0)

    rows = []
    code = 0
    for minutes, _, request in sent:
        outcome, took_s, detail = done.get(request["id"], ("no outcome", float("nan"), ""))
        if outcome != "Completed":
            code = 1
            rows.append([f"{minutes:g} min", outcome, f"{took_s:.0f} s", detail[:120], ""])
            continue
        answer = json.loads(detail)
        same = "yes" if str(answer["pid"]) in pids_before else "no (restarted)"
        code |= same != "yes"
        rows.append(
            [f"{minutes:g} min", outcome, f"{took_s:.0f} s", f"slept {answer['slept']}", same]
        )
    report = table(["request", "outcome", "end to end", "answer", "instance kept"], rows)
    report += f"\n\npeak shipyard_requests_in_flight: {peak:g} (of {len(MINUTES)} requests)\n"
    print(report)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    RESULTS.write_text(
        f"# Long asynchronous requests ({stamp})\n\n"
        f'`LONG_ASYNC_MINUTES="{" ".join(f"{m:g}" for m in MINUTES)}" '
        f".venv/bin/python bench/long_async.py`\n\n{report}"
    )
    return code


if __name__ == "__main__":
    entry(main)
