"""Inference components: what routing by InferenceComponentName costs, and how densely
copies pack.

    .venv/bin/python bench/components.py        # ROUNDS=3 REQUESTS=2000

One gateway serves the echo model twice: as a plain endpoint (one instance) and as an
inference component with one copy on an endpoint of components. One keep-alive HTTP
client sends REQUESTS invocations to each in turn, ROUNDS times alternating which goes
first, and the latency of each request is timed at the client: the difference of the
medians is what the component's route adds on the gateway. Packing is computed with the
placement the reconciler uses (control/placement.py): copies of a 1-core, 2 GiB
component on one ml.m5.4xlarge (16 vCPUs, 64 GiB), against the instances a plain
endpoint needs for as many models (one each).
"""

from __future__ import annotations

import http.client
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from harness import ROLE_ARN, Control, cpu_probe_ms, entry, start_gateway, table, time_budget

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from shipyard.control.placement import Demand, place  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
FROM_ZERO = int(os.environ.get("FROM_ZERO", "20"))
REQUESTS = int(os.environ.get("REQUESTS", "2000"))


def _tarball(folder: Path, dest: Path) -> str:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(folder, arcname=".")
    return dest.as_uri()


def _timed(port: int, endpoint: str, headers: dict[str, str], n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    path = f"/endpoints/{endpoint}/invocations"
    out = []
    try:
        for _ in range(n):
            began = time.perf_counter()
            conn.request("POST", path, b'{"x": 1}', {"Content-Type": "application/json", **headers})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{endpoint}: HTTP {response.status}")
            out.append((time.perf_counter() - began) * 1000)
    finally:
        conn.close()
    return out


def _copies(control: Control) -> int:
    described = control.call("DescribeInferenceComponent", {"InferenceComponentName": "echo-ic"})
    return int(described["RuntimeConfig"]["CurrentCopyCount"])


def _from_zero(control: Control, port: int, times: int) -> list[float]:
    """Scale the component to zero, then time one request: it starts a copy and waits."""
    out = []
    for _ in range(times):
        control.call(
            "UpdateInferenceComponentRuntimeConfig",
            {"InferenceComponentName": "echo-ic", "DesiredRuntimeConfig": {"CopyCount": 0}},
        )
        while _copies(control) != 0:
            time.sleep(0.05)
        headers = {"X-Amzn-SageMaker-Inference-Component": "echo-ic"}
        out += _timed(port, "ic", headers, 1)
    return out


def main() -> int:
    probe_before = cpu_probe_ms()
    with tempfile.TemporaryDirectory() as tmp, time_budget(600):
        home = Path(tmp) / "home"
        model = _tarball(ROOT / "tests" / "models" / "echo", Path(tmp) / "echo.tar.gz")
        gateway, url = start_gateway(home)
        try:
            control = Control(url)
            control.deploy("plain", model)
            control.call(
                "CreateEndpointConfig",
                {
                    "EndpointConfigName": "ic",
                    "ExecutionRoleArn": ROLE_ARN,
                    "ProductionVariants": [
                        {"VariantName": "AllTraffic", "InstanceType": "ml.m5.large",
                         "InitialInstanceCount": 1}
                    ],
                },
            )  # fmt: skip
            control.call("CreateEndpoint", {"EndpointName": "ic", "EndpointConfigName": "ic"})
            while (
                control.call("DescribeEndpoint", {"EndpointName": "ic"})["EndpointStatus"]
                != "InService"
            ):
                time.sleep(0.2)
            control.call(
                "CreateInferenceComponent",
                {
                    "InferenceComponentName": "echo-ic",
                    "EndpointName": "ic",
                    "VariantName": "AllTraffic",
                    "Specification": {
                        "ModelName": "plain",
                        "ComputeResourceRequirements": {
                            "NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024,
                        },
                    },
                    "RuntimeConfig": {"CopyCount": 1},
                },
            )  # fmt: skip
            while (
                control.call("DescribeInferenceComponent", {"InferenceComponentName": "echo-ic"})[
                    "InferenceComponentStatus"
                ]
                != "InService"
            ):
                time.sleep(0.2)
            port = int(url.rsplit(":", 1)[1])
            kinds = {
                "plain variant": ("plain", {}),
                "component": ("ic", {"X-Amzn-SageMaker-Inference-Component": "echo-ic"}),
            }
            samples: dict[str, list[float]] = {k: [] for k in kinds}
            for endpoint, headers in kinds.values():
                _timed(port, endpoint, headers, 200)  # warm-up
            for round_ in range(ROUNDS):
                order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
                for kind in order:
                    endpoint, headers = kinds[kind]
                    samples[kind] += _timed(port, endpoint, headers, REQUESTS)
            zero = _from_zero(control, port, FROM_ZERO)
        finally:
            gateway.stop()
    probe_after = cpu_probe_ms()
    rows = []
    base = statistics.median(samples["plain variant"])
    for kind, values in samples.items():
        cuts = statistics.quantiles(values, n=100)
        p50 = statistics.median(values)
        rows.append([kind, len(values), f"{p50:.3f}", f"{cuts[98]:.3f}", f"{p50 - base:+.3f}"])
    print(table(["route", "requests", "p50 ms", "p99 ms", "p50 vs plain ms"], rows))
    cuts = statistics.quantiles(zero, n=100, method="inclusive")
    print(
        f"\nFrom zero copies to the answer, {len(zero)} times: p50 "
        f"{statistics.median(zero):.0f} ms, p99 {cuts[98]:.0f} ms, max {max(zero):.0f} ms"
    )
    plan = place("ml.m5.4xlarge", [Demand("m", 64, 1, 2048)], least=1, most=1, keep_all=True)
    print(
        f"\nPacking: {plan.copies('m')} copies of a 1-core, 2 GiB component fit on one "
        f"ml.m5.4xlarge; a plain endpoint serving {plan.copies('m')} such models needs "
        f"{plan.copies('m')} instances (one model each)."
    )
    print(f"CPU probe before/after: {probe_before:.1f} / {probe_after:.1f} ms")
    return 0


if __name__ == "__main__":
    entry(main)
