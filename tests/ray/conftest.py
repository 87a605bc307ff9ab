"""Real Ray clusters for the ray backend's tests, started and stopped by the tests.

Every Ray process a cluster starts descends from the ``ray start --block`` it was started
with (raylet, workers, the actors' instance processes), so a cluster is stopped by those
PIDs, never by name. Nodes bind 127.0.0.1, or addresses inside network namespaces the
test made itself (tests/ray/netns.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.conftest import GatewayProcess, free_port, start_gateway

try:
    import ray  # noqa: F401
except ImportError as exc:  # the only reason these tests skip
    pytest.skip(
        f"Ray cannot be imported ({exc}); pip install -e '.[dev]' installs it",
        allow_module_level=True,
    )

RAY = str(Path(sys.executable).with_name("ray"))


@dataclass
class RayNode:
    """One ``ray start --block`` and the Ray processes under it."""

    ip: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def pids(self) -> list[int]:
        """This node's processes, its ``ray start`` first."""
        try:
            leader = psutil.Process(self.process.pid)
            return [leader.pid, *(p.pid for p in leader.children(recursive=True))]
        except psutil.Error:
            return []

    def kill(self) -> None:
        """SIGKILL every process of the node at once: the node is lost, as when its
        machine dies. (SIGKILL, not SIGTERM: a raylet told to stop says goodbye.)"""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.process.wait()
        for pid in self.pids() or pids:  # what was forked meanwhile
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@dataclass
class RayCluster:
    """A head (and maybe workers), all started with the same token."""

    address: str
    env: dict[str, str]
    """What the gateway's Ray driver needs: the token and single-machine addressing."""
    root: Path
    nodes: list[RayNode] = field(default_factory=list)

    def gateway_args(self) -> list[str]:
        return ["--backend", "ray", "--ray-address", self.address]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def cluster_env(root: Path, token: str) -> dict[str, str]:
    return {
        # One machine: without it Ray replaces 127.0.0.1 with the machine's address.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        # A lost node is known within seconds, not half a minute.
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }


def start_node(
    cluster: RayCluster,
    ip: str,
    *,
    head: bool,
    num_cpus: int = 8,
    memory_gib: int = 32,
    wrap: list[str] | None = None,
) -> RayNode:
    """``ray start --block`` on ``ip`` (inside ``wrap``, e.g. ``ip netns exec ns``); the
    node's processes keep their temporary files under the cluster's folder."""
    argv = [RAY, "start", "--block", "--node-ip-address", ip, "--disable-usage-stats"]
    argv += ["--num-cpus", str(num_cpus), "--memory", str(memory_gib << 30)]
    argv += ["--object-store-memory", str(80 << 20)]
    if head:
        port = int(cluster.address.rpartition(":")[2])
        argv += ["--head", "--port", str(port), "--include-dashboard", "false"]
        argv += ["--ray-client-server-port", str(free_port()), "--temp-dir", str(cluster.root)]
    else:
        argv += ["--address", cluster.address]
    log_path = cluster.root / f"node-{ip}-{len(cluster.nodes)}.log"
    env = {**os.environ, **cluster.env, "TMPDIR": str(cluster.root)}
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [*(wrap or []), *argv], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    node = RayNode(ip, process, log_path)
    cluster.nodes.append(node)
    wait_started(node)
    return node


def wait_started(node: RayNode, timeout_s: float = 90) -> None:
    """Until ``ray start`` says the node runs (it has joined the head by then)."""
    deadline = time.monotonic() + timeout_s
    while "Ray runtime started" not in node.log_path.read_text(errors="replace"):
        if node.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray node did not start:\n{node.log_path.read_text()[-3000:]}")
        time.sleep(0.2)


def new_cluster(head_ip: str = "127.0.0.1") -> RayCluster:
    # Not under tmp_path: Ray's socket paths (<temp>/session_…/sockets/plasma_store) must
    # fit in 107 bytes, and pytest's folders are long.
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = cluster_env(root, secrets.token_hex(16))
    return RayCluster(address=f"{head_ip}:{free_port()}", env=env, root=root)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A one-node Ray cluster on 127.0.0.1 with token authentication, per module."""
    cluster = new_cluster()
    try:
        start_node(cluster, "127.0.0.1", head=True)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ray_gateway(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """A factory of gateways on ``ray_cluster`` (``--backend ray``), stopped by PID."""
    started: list[GatewayProcess] = []

    def create(extra_env: dict[str, str] | None = None) -> GatewayProcess:
        gw = start_gateway(
            tmp_path / f"home{len(started)}",
            extra_env={**ray_cluster.env, **(extra_env or {})},
            args=ray_cluster.gateway_args(),
        )
        started.append(gw)
        return gw

    yield create
    for gw in started:
        gw.stop()


def instance_processes(cluster: RayCluster) -> dict[str, int]:
    """Instance id to PID of every instance process running on the cluster's nodes."""
    found = {}
    for node in cluster.nodes:
        for pid in node.pids():
            try:
                process = psutil.Process(pid)
                if "shipyard.runtime" not in process.cmdline():
                    continue
                found[process.environ()["SHIPYARD_INSTANCE_ID"]] = pid
            except (psutil.Error, KeyError):
                continue
    return found
