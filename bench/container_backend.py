"""The same sklearn model served by the built-in runtime and by a container image.

The image holds the built-in runtime itself (this tree and scikit-learn, installed with
pip into a folder on Debian's Python 3.11), so the difference measured is the container's:
its network namespace and published port, its cgroup, its start. Both endpoints sit on
one gateway with one instance each; wrk posts the peer harness's request at c=8 and c=32,
the two endpoints interleaved, for two rounds. Then: seconds from CreateEndpoint to
InService (the image already present; median of 3 each, interleaved), and each idle
instance's memory (the RSS of its processes, read on the host; a container's through the
engine's ``top``).

The engine is Podman's Docker-compatible service, started here on a socket of its own
with its storage in a temporary folder, as the tests start it (tests/containers/), from
the Debian root filesystem they cache (made with debootstrap when missing).

    .venv/bin/pip install '.[bench]' && .venv/bin/python bench/container_backend.py
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import psutil
from gateway_overhead import write_sklearn
from harness import (
    PEER_BODY,
    Control,
    ServerProcess,
    cpu_probe_ms,
    entry,
    env_float,
    measure,
    post,
    require_wrk,
    start_gateway,
    table,
    time_budget,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shipyard-tests"
ROOTFS = CACHE / "rootfs-bookworm-python3.tar"
BASE = "localhost/shipyard-bench/python:bookworm"
IMAGE = "localhost/shipyard-bench/runtime:1"
SERVE = """#!/bin/sh
# The SageMaker hosting contract: `serve`, port 8080, the model at /opt/ml/model.
[ "$1" = serve ] || { echo "expected serve, got $*" >&2; exit 2; }
exec python3 -m shipyard.runtime --host 0.0.0.0 --port "${SAGEMAKER_BIND_TO_PORT:-8080}" \\
  --model-dir /opt/ml/model
"""


def rootfs() -> Path:
    if ROOTFS.exists():
        return ROOTFS
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / "rootfs.partial"
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", "--include=python3", "bookworm", target],
        check=True,
        capture_output=True,
    )
    partial = ROOTFS.with_suffix(".partial.tar")
    subprocess.run(["tar", "-C", target, "-cf", partial, "."], check=True)
    partial.replace(ROOTFS)
    shutil.rmtree(target, ignore_errors=True)
    return ROOTFS


def start_engine(work: Path) -> tuple[ServerProcess, list[str], dict[str, str], str]:
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE))
    conf = work / "containers.conf"
    conf.write_text(
        f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]\n'
        '[engine]\nruntime = "runc"\nevents_logger = "file"\n'
    )
    env = {"CONTAINERS_CONF": str(conf)}
    # Podman refuses a run root longer than 50 characters: mkdtemp's is short.
    podman = ["podman", "--root", str(work / "root"), "--runroot", str(work / "run")]
    socket = work / "podman.sock"
    service = ServerProcess.start(
        "podman",
        [*podman, "system", "service", "--time=0", f"unix://{socket}"],
        work / "podman.log",
        env,
    )
    wait_until(socket.exists, 30, "podman's socket")
    return service, podman, {**os.environ, **env}, f"unix://{socket}"


def build_image(work: Path, podman: list[str], env: dict[str, str]) -> None:
    import numpy
    import sklearn  # type: ignore[import-untyped, import-not-found, unused-ignore]

    subprocess.run(
        [*podman, "import", str(rootfs()), BASE], env=env, check=True, capture_output=True
    )
    context = work / "context"
    site = context / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), str(ROOT),
         f"scikit-learn=={sklearn.__version__}", f"numpy=={numpy.__version__}"],
        check=True,
    )  # fmt: skip
    (context / "serve").write_text(SERVE)
    (context / "serve").chmod(0o755)
    (context / "Containerfile").write_text(
        f"FROM {BASE}\nCOPY site /opt/shipyard\nCOPY serve /usr/local/bin/serve\n"
        'ENV PYTHONPATH=/opt/shipyard\nENTRYPOINT ["/usr/local/bin/serve"]\n'
    )
    subprocess.run(
        [*podman, "build", "-q", "-f", str(context / "Containerfile"), "-t", IMAGE, str(context)],
        env=env,
        check=True,
        capture_output=True,
    )


def deploy(control: Control, name: str, image: str, model_url: str) -> float:
    """Seconds from CreateEndpoint to InService."""
    control.call(
        "CreateModel",
        {
            "ModelName": name,
            "PrimaryContainer": {"Image": image, "ModelDataUrl": model_url},
            "ExecutionRoleArn": "arn:aws:iam::123456789012:role/bench",
        },
    )
    variant = {
        "VariantName": "v1",
        "ModelName": name,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }
    control.call(
        "CreateEndpointConfig", {"EndpointConfigName": name, "ProductionVariants": [variant]}
    )
    started = time.monotonic()
    control.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})
    while time.monotonic() < started + 120:
        described = control.call("DescribeEndpoint", {"EndpointName": name})
        if described["EndpointStatus"] == "InService":
            return time.monotonic() - started
        if described["EndpointStatus"] == "Failed":
            raise RuntimeError(f"{name}: {described.get('FailureReason')}")
        time.sleep(0.02)
    raise TimeoutError(f"{name} not InService after 120 s")


def delete(control: Control, name: str) -> None:
    control.call("DeleteEndpoint", {"EndpointName": name})
    control.call("DeleteEndpointConfig", {"EndpointConfigName": name})
    control.call("DeleteModel", {"ModelName": name})


def rss(pids: list[int]) -> float:
    """MiB resident in ``pids`` and their descendants."""
    total = 0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            for p in [process, *process.children(recursive=True)]:
                total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def builtin_pids(gateway: ServerProcess) -> list[int]:
    found = []
    for child in psutil.Process(gateway.process.pid).children():
        try:
            if "shipyard.runtime" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def container_pids(docker_host: str) -> list[int]:
    import docker

    client = docker.DockerClient(base_url=docker_host)
    try:
        # Each container's first process, as the host sees it; rss() adds its descendants.
        containers = client.containers.list(filters={"label": "dev.shipyard.endpoint"})
        return [int(c.attrs["State"]["Pid"]) for c in containers]
    finally:
        client.close()


def load(url: str, kinds: list[str], warmup: float, duration: float) -> list[tuple[Any, ...]]:
    """Two rounds at c=8 and c=32, the endpoints interleaved (in turn first)."""
    rows: list[tuple[Any, ...]] = []
    for round_ in (1, 2):
        for connections in (8, 32):
            for kind in kinds if round_ == 1 else reversed(kinds):
                endpoint = f"{url}/endpoints/{kind.replace('-', '')}/invocations"
                r = measure(endpoint, PEER_BODY, connections, warmup, duration)
                rows.append((round_, connections, kind, r.rps, r.p50_ms, r.p99_ms, r.note))
    return rows


def main() -> int:
    require_wrk()
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if missing:
        print(f"needs {', '.join(missing)} (make install-dev installs them)", file=sys.stderr)
        return 2
    duration = env_float("BENCH_DURATION_S", 15)
    warmup = env_float("BENCH_WARMUP_S", 3)
    probe_before = cpu_probe_ms()
    work = Path(tempfile.mkdtemp(prefix="bench-containers-"))
    servers: list[ServerProcess] = []
    try:
        with time_budget(1800):
            service, podman, engine_env, docker_host = start_engine(work)
            servers.append(service)
            build_image(work, podman, engine_env)
            model = work / "sklearn"
            if not write_sklearn(model):
                print("needs scikit-learn: pip install '.[bench]'", file=sys.stderr)
                return 2
            artifact = work / "sklearn.tar.gz"
            with tarfile.open(artifact, "w:gz") as tar:
                tar.add(model, arcname=".")
            gateway, url = start_gateway(work / "home", env={"DOCKER_HOST": docker_host})
            servers.insert(0, gateway)
            control = Control(url)
            kinds = {"built-in": "shipyard/python", "container": IMAGE}

            starts: dict[str, list[float]] = {k: [] for k in kinds}
            for n in range(3):
                for kind, image in kinds.items():
                    name = f"start-{kind.replace('-', '')}-{n}"
                    starts[kind].append(deploy(control, name, image, artifact.as_uri()))
                    delete(control, name)

            for kind, image in kinds.items():
                deploy(control, kind.replace("-", ""), image, artifact.as_uri())
            time.sleep(5)  # idle
            memory = {
                "built-in": rss(builtin_pids(gateway)),
                "container": rss(container_pids(docker_host)),
            }
            for kind in kinds:  # both answer the model's predictions
                status, answer = post(
                    f"{url}/endpoints/{kind.replace('-', '')}/invocations", PEER_BODY.read_bytes()
                )
                if status != 200 or "predictions" not in json.loads(answer):
                    raise RuntimeError(f"{kind}: {status} {answer[:300]!r}")
            rows = load(url, list(kinds), warmup, duration)
            probe_after = cpu_probe_ms()
    finally:
        for server in servers:  # the gateway first: it stops its containers
            server.stop()
        if (work / "root").exists():  # the images, and with them the storage's mounts
            subprocess.run(
                ["podman", "--root", str(work / "root"), "--runroot", str(work / "run"),
                 "rmi", "--all", "--force"],
                capture_output=True,
                env={**os.environ, "CONTAINERS_CONF": str(work / "containers.conf")},
            )  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)

    print(f"# Built-in runtime vs a container image ({date.today()})\n")
    print(f"CPU probe {probe_before} ms before, {probe_after} ms after; {duration:g} s runs.\n")
    print(table(["round", "c", "served by", "req/s", "p50 ms", "p99 ms", "errors"], rows))
    ratios = []
    for round_ in (1, 2):
        for connections in (8, 32):
            by = {r[2]: r for r in rows if r[0] == round_ and r[1] == connections}
            ratios.append(
                (round_, connections, by["container"][3] / by["built-in"][3],
                 by["container"][5] / by["built-in"][5])
            )  # fmt: skip
    print()
    print(table(["round", "c", "req/s container / built-in", "p99 container / built-in"], ratios))
    print()
    print(
        table(
            ["served by", "CreateEndpoint to InService, s (median of 3)", "each", "idle RSS MiB"],
            [
                (k, statistics.median(v), " / ".join(f"{x:.2f}" for x in v), memory[k])
                for k, v in starts.items()
            ],
        )
    )
    print(json.dumps({"starts": starts, "memory": memory}))
    return 0


if __name__ == "__main__":
    entry(main)
