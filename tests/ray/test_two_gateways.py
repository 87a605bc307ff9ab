"""Two gateways on the ray backend, sharing a store, on the real two-node cluster of
test_two_nodes.py: one fleet whose instances outlive the gateway that started them.

Both gateways run in the head's namespace and share a SQLite file in the test's folder:
the leases' compare-and-set runs under SQLite's own write lock (BEGIN IMMEDIATE), which
serialises the two processes as PostgreSQL's row locks would, and both read one clock.
"""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess, deploy, wait_in_service, wait_until
from tests.ray.conftest import instance_processes
from tests.ray.test_one_node import s3_model
from tests.ray.test_two_nodes import TwoNodes, _placed, gateway_in, two_nodes  # noqa: F401

pytestmark = pytest.mark.timeout(400)

# The default lease (6 s); renewed every 0.5 s, as tests/e2e/test_gateways.py does.
LEASES = {"SHIPYARD_LEASE_RENEW_S": "0.5"}


@dataclass
class Load:
    """Clients invoking one endpoint through one gateway, each request timed."""

    gw: GatewayProcess
    threads: int = 2
    outcomes: list[tuple[float, float, bool]] = field(default_factory=list)
    """(sent, answered, succeeded), monotonic seconds."""
    pids: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    """The failures, as their clients saw them (for the assertions' messages)."""
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self, endpoint: str) -> None:
        for _ in range(self.threads):
            threading.Thread(target=self._run, args=(endpoint,), daemon=True).start()

    def _run(self, endpoint: str) -> None:
        client = self.gw.client("sagemaker-runtime", max_attempts=1, read_timeout=15)
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                answer = client.invoke_endpoint(
                    EndpointName=endpoint, Body=b'{"sleep": 0.05}', ContentType="application/json"
                )
                self.pids.add(json.loads(answer["Body"].read())["pid"])
                self.outcomes.append((sent, time.monotonic(), True))
            except Exception as exc:
                self.outcomes.append((sent, time.monotonic(), False))
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def failed(self, *, sent_before: float = float("inf")) -> int:
        return sum(not ok for sent, _, ok in self.outcomes if sent < sent_before)

    def longest_gap_s(self, after: float) -> float:
        """The longest time without a request answered, from ``after`` on."""
        answered = sorted(done for _, done, ok in self.outcomes if ok and done >= after)
        return max((b - a for a, b in zip([after, *answered], answered, strict=False)), default=0)


def _answers(loads: dict[str, Load], gateways: list[GatewayProcess]) -> str:
    """What each gateway's clients got, and the gateways' logs' ends."""
    lines = []
    for url, load in loads.items():
        ok = sum(ok for _, _, ok in load.outcomes)
        lines.append(f"{url}: {ok} answered, {load.failed()} failed, pids {sorted(load.pids)}")
        lines += [f"  {error}" for error in load.errors[-3:]]
    for gw in gateways:
        lines += [f"--- {gw.url} log", *gw.log().splitlines()[-40:]]
    return "\n".join(lines)


def _identity(gw: GatewayProcess) -> str:
    """The gateway's name in the store (shipyard/app.py: host and home)."""
    return hashlib.sha1(f"{socket.gethostname()}:{gw.home.resolve()}".encode()).hexdigest()[:16]


def _holder(db: Path, endpoint: str) -> str | None:
    with sqlite3.connect(db, timeout=10) as conn:
        row = conn.execute(
            "SELECT holder FROM leases WHERE kind = 'endpoint' AND name = ?", (endpoint,)
        ).fetchone()
    return None if row is None else row[0]


def test_a_fleet_outlives_its_gateway_and_the_next_lease_holder_adopts_it(
    two_nodes: TwoNodes,  # noqa: F811
    tmp_path: Path,
) -> None:
    nodes = two_nodes
    db = tmp_path / "store.db"
    args = ["--db", f"sqlite:///{db}"]
    first = gateway_in(nodes, tmp_path / "a", args=args, extra_env=LEASES)
    second = gateway_in(nodes, tmp_path / "b", args=args, extra_env=LEASES)
    gateways = [first, second]
    try:
        deploy(first.sm, "ep", s3_model(nodes.bucket, "sleepy"), count=4)
        holder_id = _holder(db, "ep")
        holder, survivor = (first, second) if holder_id == _identity(first) else (second, first)
        assert holder_id == _identity(holder), (holder_id, _identity(first), _identity(second))
        placed = _placed(holder)
        assert sorted(set(placed.values())) == sorted([nodes.head_ip, nodes.worker_ip]), placed
        fleet = instance_processes(nodes.cluster)
        assert len(fleet) == 4, fleet

        loads = {holder.url: Load(holder), survivor.url: Load(survivor)}
        for load in loads.values():
            load.start("ep")
        try:
            wait_until(lambda: all(load.pids for load in loads.values()), "both answer", 90)
        except AssertionError:
            raise AssertionError(_answers(loads, gateways)) from None
        time.sleep(1.0)
        killed_at = time.monotonic()
        holder.process.send_signal(signal.SIGKILL)  # by its PID: no goodbye, no release
        holder.process.wait()
        loads[holder.url].stop.set()

        # The survivor takes the lease once it expires, and adopts the four instances.
        wait_until(
            lambda: survivor.log().count("adopted instance instance/ep/") == 4,
            "the survivor adopts the fleet",
            timeout_s=60,
        )
        adopted_s = time.monotonic() - killed_at
        assert _holder(db, "ep") == _identity(survivor)
        time.sleep(2.0)
        survivor_load = loads[survivor.url]
        survivor_load.stop.set()
        time.sleep(0.5)

        # One fleet: the same four processes, none started since.
        assert instance_processes(nodes.cluster) == fleet
        assert "started instance" not in survivor.log()
        assert survivor_load.pids <= set(fleet.values())
        killed_load = loads[holder.url]
        assert survivor_load.failed() == 0, "the survivor's clients lost requests"
        print(
            json.dumps(
                {
                    "requests_through_killed_gateway": len(killed_load.outcomes),
                    # In flight as it died, and sent to it dead before its clients stopped.
                    "failed_on_killed_gateway_in_flight": killed_load.failed(sent_before=killed_at),
                    "failed_on_killed_gateway_after": killed_load.failed()
                    - killed_load.failed(sent_before=killed_at),
                    "requests_through_survivor": len(survivor_load.outcomes),
                    "failed_on_survivor": survivor_load.failed(),
                    "survivor_longest_gap_s": round(survivor_load.longest_gap_s(killed_at), 2),
                    "seconds_to_adopted_fleet": round(adopted_s, 2),
                }
            )
        )

        # Deleted through the survivor: every instance stops, adopted or not.
        survivor.sm.delete_endpoint(EndpointName="ep")
        wait_until(lambda: not instance_processes(nodes.cluster), "no instance left", 60)
        an_async_endpoint_is_answered_on_both_nodes(nodes, survivor)
    finally:
        # What a SIGKILLed gateway started outlives it: the cluster's stop (by the PIDs
        # under each node's ``ray start``) ends it with the rest.
        for gw in gateways:
            gw.stop()


def an_async_endpoint_is_answered_on_both_nodes(nodes: TwoNodes, gw: GatewayProcess) -> None:
    """Requests queued in the store, answered by instances on both nodes, each answer
    written to the S3 server on the bridge."""
    bucket, sm = nodes.bucket, gw.sm
    sm.create_model(
        ModelName="later",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": s3_model(bucket, "sleepy")},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    sm.create_endpoint_config(
        EndpointConfigName="later",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "later",
                # 4 vCPU each: the head holds two, the worker one, so three span both nodes
                # (Ray's SPREAD alone may put two on one node).
                "InstanceType": "ml.c5.xlarge",
                "InitialInstanceCount": 3,
            }
        ],
        AsyncInferenceConfig={
            "OutputConfig": {
                "S3OutputPath": f"s3://{bucket.name}/async/ok",
                "S3FailurePath": f"s3://{bucket.name}/async/failed",
            }
        },
    )
    sm.create_endpoint(EndpointName="later", EndpointConfigName="later")
    wait_in_service(sm, "later")
    keys = []
    for n in range(16):
        source = bucket.put(f"async/in/{n}.json", b'{"sleep": 0.3}')
        answer = gw.rt.invoke_endpoint_async(
            EndpointName="later", InputLocation=source, ContentType="application/json"
        )
        keys.append(answer["OutputLocation"].removeprefix(f"s3://{bucket.name}/"))

    def outputs() -> list[dict[str, int]] | None:
        found = []
        for key in keys:
            try:
                body = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()
            except bucket.client.exceptions.NoSuchKey:
                return None
            found.append(json.loads(body))
        return found

    wait_until(lambda: outputs() is not None, "every async answer in S3", timeout_s=90)
    answered_by = {answer["pid"] for answer in outputs() or []}
    on = {pid: node.ip for node in nodes.cluster.nodes for pid in node.pids()}
    assert {on.get(pid) for pid in answered_by} == {nodes.head_ip, nodes.worker_ip}, (
        answered_by,
        on,
    )
    sm.delete_endpoint(EndpointName="later")
    wait_until(lambda: not instance_processes(nodes.cluster), "no instance left", 60)
