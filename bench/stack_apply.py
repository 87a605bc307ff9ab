"""``shipyard apply`` on a stack of many resources: create, re-apply unchanged, one change, destroy.

    .venv/bin/python bench/stack_apply.py > bench/results/stack_apply.md
    # knobs: MODELS=100 ENDPOINTS=10 ROUNDS=3

The stack declares ``MODELS`` models, as many endpoint configs, and ``ENDPOINTS``
endpoints on the first configs (one instance of an echo model each) with a scaling
target each. Every step runs the CLI as a user does, a process of its own
(``shipyard apply FILE --yes``), so the times include its start (imports, boto3).
"Re-apply" is the cost of a plan alone: every resource is read (List*, a ListTags per
model, config and endpoint, DescribeEndpoint per endpoint) and nothing changes. "One
change" changes one endpoint's variant weight: a new config version, an UpdateEndpoint
waited for until InService, and the old version deleted.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from harness import entry, start_gateway, table, time_budget

ROOT = Path(__file__).resolve().parent.parent
MODELS = int(os.environ.get("MODELS", "100"))
ENDPOINTS = int(os.environ.get("ENDPOINTS", "10"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def stack(model_url: str, *, weight: float) -> dict[str, Any]:
    models: dict[str, Any] = {}
    configs: dict[str, Any] = {}
    for i in range(MODELS):
        models[f"m{i}"] = {
            "PrimaryContainer": {"Image": "shipyard/python", "ModelDataUrl": model_url},
            "ExecutionRoleArn": "arn:aws:iam::123456789012:role/x",
        }
        variant = {
            "VariantName": "v1",
            "ModelName": f"m{i}",
            "InstanceType": "ml.m5.large",
            "InitialInstanceCount": 1,
            "InitialVariantWeight": weight if i == 0 else 1.0,
        }
        configs[f"c{i}"] = {"ProductionVariants": [variant]}
    endpoints = {f"e{i}": {"EndpointConfigName": f"c{i}"} for i in range(ENDPOINTS)}
    scaling = {
        f"e{i}/v1": {"MinCapacity": 1, "MaxCapacity": 1, "TargetValue": 1000}
        for i in range(ENDPOINTS)
    }
    return {
        "models": models,
        "endpoint_configs": configs,
        "endpoints": endpoints,
        "scaling": scaling,
    }


def timed(url: str, *args: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "shipyard", *args, "--yes", "--url", url],
        capture_output=True,
        text=True,
        timeout=600,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"shipyard {' '.join(args)} failed:\n{done.stderr}")
    return elapsed


def floor(url: str) -> float:
    """The CLI's own start and one control-plane call: ``endpoints delete`` of no endpoint."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "shipyard", "endpoints", "delete", "none", "--yes", "--url", url],
        capture_output=True,
        timeout=60,
    )
    return time.perf_counter() - started


def main() -> int:
    rows: dict[str, list[float]] = {
        "apply (create)": [],
        "re-apply (unchanged)": [],
        "apply (one change)": [],
        "destroy": [],
        "floor: endpoints delete nothing": [],
    }
    with tempfile.TemporaryDirectory() as tmp, time_budget(1800):
        root = Path(tmp)
        tarball = root / "echo.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(ROOT / "tests" / "models" / "echo", arcname=".")
        server, url = start_gateway(root / "home", env={"SHIPYARD_HEALTH_CHECK_PERIOD_S": "1"})
        try:
            path = root / "bench.yaml"
            for _ in range(ROUNDS):
                path.write_text(yaml.safe_dump(stack(tarball.as_uri(), weight=1.0)))
                rows["apply (create)"].append(timed(url, "apply", str(path)))
                rows["re-apply (unchanged)"].append(timed(url, "apply", str(path)))
                path.write_text(yaml.safe_dump(stack(tarball.as_uri(), weight=2.0)))
                rows["apply (one change)"].append(timed(url, "apply", str(path)))
                rows["destroy"].append(timed(url, "destroy", str(path)))
                rows["floor: endpoints delete nothing"].append(floor(url))
        finally:
            server.stop()
    print(
        f"{MODELS} models, {MODELS} endpoint configs, {ENDPOINTS} endpoints (1 instance "
        f"each) with a scaling target each; {ROUNDS} rounds; seconds, CLI process included.\n"
    )
    print(
        table(
            ["step", "median s", "min s", "max s"],
            [
                [step, f"{statistics.median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}"]
                for step, v in rows.items()
            ],
        )
    )
    return 0


if __name__ == "__main__":
    entry(main)
