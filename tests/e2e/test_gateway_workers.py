"""``shipyard serve --workers N``: N gateways on one port and one home, one fleet each
endpoint; and one home never served by two gateways that are one holder.

Real ``shipyard serve`` processes; workers and instances found by PID (/proc), instances
also by the PID the ``sleepy`` model answers with.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import GatewayProcess, deploy, free_port, unique, wait_until
from tests.e2e.processes import alive, children, instance_pids

JSON = {"Content-Type": "application/json"}
T = TypeVar("T")


def _workers(gw: GatewayProcess, count: int = 2, starts: int | None = None) -> list[int]:
    """The workers' PIDs, once ``count`` run and ``starts`` (default ``count``) workers
    logged that they serve and told the supervisor so: each worker listens on the
    supervisor's socket from its first instruction, so only its log says it is up."""
    wanted = count if starts is None else starts

    def up() -> bool:
        served = gw.log().count("worker serving")
        return len(_alive_children(gw)) == count and served >= wanted

    try:
        wait_until(up, f"{count} workers up")
    except AssertionError as exc:
        tail = "\n".join(gw.log().splitlines()[-40:])
        raise AssertionError(f"{exc}; children {_alive_children(gw)}; log:\n{tail}") from exc
    return _alive_children(gw)


def _alive_children(gw: GatewayProcess) -> list[int]:
    return [pid for pid in children(gw.process.pid) if alive(pid)]


def _instances(workers: list[int]) -> list[int]:
    return [pid for worker in workers for pid in instance_pids(worker)]


def _answering_pids(gw: GatewayProcess, name: str, n: int = 20) -> set[int]:
    """The instance PIDs behind ``n`` invocations, each on a connection of its own."""
    port = int(gw.url.rsplit(":", 1)[1])
    pids = set()
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request(
            "POST", f"/endpoints/{name}/invocations", b"{}", {"Content-Type": "application/json"}
        )
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
        pids.add(json.loads(answer.read())["pid"])
        conn.close()
    return pids


def _established(pid: int, port: int, clients: set[int]) -> int:
    """How many of the connections from the client ports ``clients`` to ``port`` process
    ``pid`` holds (a gateway's boto3 client keeps connections of its own open)."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED
        and c.laddr.port == port
        and c.raddr
        and c.raddr.port in clients
    )


def held_until_both_take_one(
    gw: GatewayProcess, workers: list[int], ask: Callable[[http.client.HTTPConnection], T]
) -> list[T]:
    """``ask`` a request on one new connection after another, each answered and held
    open, until every worker holds one (or 400 are open); what each ``ask`` gave. The
    workers accept from one socket, so connections opened one at a time may all go to
    one worker for a while. The connections are closed before this returns."""
    port = int(gw.url.rsplit(":", 1)[1])
    conns: list[http.client.HTTPConnection] = []
    answers: list[T] = []

    clients: set[int] = set()

    def every_worker_holds_one() -> bool:
        if len(conns) < 400:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conns.append(conn)
            answers.append(ask(conn))
            clients.add(conn.sock.getsockname()[1])
        return min(_established(worker, port, clients) for worker in workers) >= 1

    try:
        wait_until(every_worker_holds_one, "connections held by every worker")
        assert sum(_established(worker, port, clients) for worker in workers) == len(conns)
    finally:
        for conn in conns:
            conn.close()
    return answers


def _holds(pid: int, client_port: int) -> bool:
    """Whether process ``pid`` holds the server end of the client's connection from
    ``client_port``."""
    return any(
        c.raddr and c.raddr.port == client_port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED
    )


def test_workers_share_the_port_and_run_one_fleet(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    gw = gateway_factory(args=["--workers", "2"])
    workers = _workers(gw)
    name = unique("shared")
    deploy(gw.sm, name, model_tarball("sleepy"), count=1)
    answering = _answering_pids(gw, name)
    assert len(answering) == 1
    assert _instances(workers) == sorted(answering), "one fleet, whichever worker answers"
    described = gw.sm.describe_endpoint(EndpointName=name)
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 1
    # Named by the worker that runs it, so no two workers on the home name two alike.
    holder = next(w for w in workers if instance_pids(w))
    index = psutil.Process(holder).environ()["SHIPYARD_WORKER"]
    instance_id = psutil.Process(instance_pids(holder)[0]).environ()["SHIPYARD_INSTANCE_ID"]
    assert instance_id == f"{name}-v1-" + ("" if index == "0" else f"w{index}-") + "1"

    # Both workers take connections from the one socket: opened one at a time and held,
    # with a request answered on each, they do not all stay with one worker.
    def healthz(conn: http.client.HTTPConnection) -> bytes:
        conn.request("GET", "/healthz")
        return conn.getresponse().read()

    assert set(held_until_both_take_one(gw, workers, healthz)) == {b"ok"}

    # The port is the supervisor's alone: no process of the same user joins it (as one
    # could with SO_REUSEPORT, a sandboxed model's included) to take its connections.
    with socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError, match="in use"):
            thief.bind(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])))


def test_sigterm_stops_every_worker_and_every_instance(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    gw = gateway_factory(args=["--workers", "2"])
    workers = _workers(gw)
    name = unique("stopped")
    deploy(gw.sm, name, model_tarball("sleepy"), count=2)
    wait_until(lambda: len(_instances(workers)) == 2, "two instances")
    instances = _instances(workers)
    assert gw.stop(signal.SIGTERM) == 0
    left = [pid for pid in workers + instances if alive(pid)]
    assert not left, f"still running: {left}"


def test_a_killed_worker_is_started_again_and_leaves_the_others_fleets_alone(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    gw = gateway_factory(args=["--workers", "2"], extra_env={"SHIPYARD_LEASE_RENEW_S": "0.5"})
    workers = _workers(gw)
    name = unique("again")
    deploy(gw.sm, name, model_tarball("sleepy"), count=1)
    wait_until(lambda: len(_instances(workers)) == 1, "one instance")
    holder = next(w for w in workers if instance_pids(w))
    (instance,) = instance_pids(holder)
    other = next(w for w in workers if w != holder)

    # The worker without the fleet dies and is started again, a few seconds after it came
    # up (a worker that served is no worker that failed to start, however young): at its
    # start it stops what it left running, and nothing of the other worker's.
    psutil.Process(other).kill()
    wait_until(lambda: other not in _alive_children(gw), "the worker gone")
    restarted = [w for w in _workers(gw, starts=3) if w != holder]
    assert len(restarted) == 1, "the holder was restarted too"
    assert f"(pid {other}) was killed by signal 9" in gw.log()  # the supervisor says so
    assert f"started again (pid {restarted[0]})" in gw.log()
    assert alive(instance), "a restarted worker stopped another worker's instance"

    # It read the other worker's routes before it took a connection: no 429 while it
    # catches up. Invocations, each the first request of a connection of its own, until
    # the restarted worker has answered one (each connection goes to whichever worker
    # accepts it first), every one of them answered by the same instance.
    port = int(gw.url.rsplit(":", 1)[1])
    conns: list[http.client.HTTPConnection] = []

    def answered_by_the_restarted_worker() -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conns.append(conn)
        conn.request(
            "POST", f"/endpoints/{name}/invocations", b"{}", {"Content-Type": "application/json"}
        )
        answer = conn.getresponse()
        body = answer.read()
        assert answer.status == 200, body
        assert json.loads(body)["pid"] == instance
        assert conn.sock is not None
        return _holds(restarted[0], conn.sock.getsockname()[1])

    try:
        wait_until(answered_by_the_restarted_worker, "an answer from the restarted worker")
    finally:
        for conn in conns:
            conn.close()
    assert alive(instance)

    # The worker running the fleet dies: its instance with it, and the fleet comes back.
    psutil.Process(holder).kill()
    wait_until(lambda: holder not in _alive_children(gw), "the holder gone")
    _workers(gw, starts=4)

    def answers() -> bool:
        try:
            return len(_answering_pids(gw, name, n=6)) == 1
        except (AssertionError, OSError):
            return False

    wait_until(answers, "the endpoint answers through both workers", timeout_s=60)
    assert gw.process.poll() is None
    wait_until(lambda: len(_instances(_alive_children(gw))) == 1, "one fleet", timeout_s=60)


def test_only_worker_0_serves_grpc_and_the_others_run_without_it(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    grpc_port = free_port()
    gw = gateway_factory(args=["--workers", "2", "--grpc-port", str(grpc_port)])
    _workers(gw)  # both started: worker 1 did not try the gRPC port
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        assert client.is_server_live()
    finally:
        client.close()
    grpc_servers = [pid for pid in _alive_children(gw) if _listens(pid, grpc_port)]
    assert len(grpc_servers) == 1


def _listens(pid: int, port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in psutil.Process(pid).net_connections(kind="tcp")
    )


def test_a_port_in_use_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "shipyard", "serve", "--workers", "2"]
        command += ["--port", str(port), "--home", str(tmp_path / "home")]
        done = subprocess.run(command, capture_output=True, timeout=90)
    assert done.returncode == 2
    assert b"address already in use" in done.stderr.lower()
    assert not (tmp_path / "home" / "gateway.lock").exists(), "a worker was started"


def test_workers_that_cannot_start_end_the_supervisor(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "shipyard", "serve", "--workers", "2"]
    command += ["--port", str(free_port()), "--home", str(tmp_path / "home")]
    command += ["--config", str(tmp_path / "missing.yaml")]
    done = subprocess.run(command, capture_output=True, timeout=90)
    assert done.returncode not in (0, None)
    assert b"missing.yaml" in done.stderr + done.stdout
    assert b"failed to start: stopping the others" in done.stderr


def test_a_second_gateway_on_a_home_in_use_is_refused(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    first = gateway_factory()
    name = unique("alone")
    deploy(first.sm, name, model_tarball("sleepy"), count=1)
    command = [sys.executable, "-m", "shipyard", "serve", "--port", str(free_port())]
    command += ["--home", str(first.home)]
    done = subprocess.run(command, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"another gateway serves from it" in done.stderr
    assert instance_pids(first.process.pid) != [], "the first one's fleet stays"
    assert len(_answering_pids(first, name, n=3)) == 1

    first.stop(signal.SIGKILL)  # the lock goes with the process
    again = gateway_factory(first.home)
    wait_until(lambda: _answers(again, name), "the restarted gateway answers", timeout_s=60)


def _answers(gw: GatewayProcess, name: str) -> bool:
    try:
        return len(_answering_pids(gw, name, n=1)) == 1
    except (AssertionError, OSError):
        return False


def _invocations_by_worker(gw: GatewayProcess, name: str) -> dict[str, float]:
    """shipyard_invocations_total of endpoint ``name`` per worker label, from one scrape
    of ``/metrics`` on a connection of its own (any worker may answer it)."""
    status, text = gw.get("/metrics")
    assert status == 200
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == "shipyard_invocations_total" and sample.labels["endpoint"] == name:
                worker = sample.labels["worker"]
                counts[worker] = counts.get(worker, 0.0) + sample.value
    return counts


def test_metrics_show_every_workers_series_whichever_worker_answers(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    gw = gateway_factory(args=["--workers", "2"])
    workers = _workers(gw)
    name = unique("counted")
    deploy(gw.sm, name, model_tarball("sleepy"), count=1)

    def invoke(conn: http.client.HTTPConnection) -> int:
        conn.request("POST", f"/endpoints/{name}/invocations", b"{}", JSON)
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
        return int(json.loads(answer.read())["pid"])

    sent = len(held_until_both_take_one(gw, workers, invoke))
    # Whichever worker answers a scrape, it shows both workers' counts, which add up to
    # every request made.
    for _ in range(6):
        counts = _invocations_by_worker(gw, name)
        assert set(counts) == {"0", "1"} and all(n >= 1 for n in counts.values()), counts
        assert sum(counts.values()) == sent, counts

    # A worker gone is left out of the scrape, and the one left still answers.
    os.kill(workers[1], signal.SIGKILL)
    wait_until(lambda: not alive(workers[1]), "worker killed")
    status, _ = gw.get("/metrics")
    assert status == 200


def test_calls_through_an_update_are_all_answered_whichever_worker_takes_them(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    """The worker that runs the endpoint replaces its fleet; the other learns the new
    routes from the store a moment later. No call may fail in between: the old fleet
    serves until every worker routes to the new one (a CI run had one call of 579 cut:
    sent on a kept-alive connection the old instance closed as it stopped)."""
    gw = gateway_factory(args=["--workers", "2"])
    _workers(gw)
    name = unique("upd")
    model = model_tarball("sleepy")
    deploy(gw.sm, name, model, count=1)
    gw.sm.create_endpoint_config(
        EndpointConfigName=f"{name}-next",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": name,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
    )
    port = int(gw.url.rsplit(":", 1)[1])
    answers: list[tuple[int, bytes, int]] = []  # status, body, pid
    done = threading.Event()

    def call_until_done() -> None:
        while not done.is_set():
            # A connection each: the two workers take them in turn.
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", f"/endpoints/{name}/invocations", b"{}", JSON)
                answer = conn.getresponse()
                body = answer.read()
                pid = json.loads(body)["pid"] if answer.status == 200 else 0
                answers.append((answer.status, body, pid))
            finally:
                conn.close()

    callers = [threading.Thread(target=call_until_done) for _ in range(2)]
    for caller in callers:
        caller.start()
    try:
        # Both workers know the endpoint once a run of calls is answered: one learns it
        # from the store a refresh after the other created it.
        wait_until(
            lambda: len(answers) >= 20 and all(a[0] == 200 for a in answers[-20:]),
            "calls answered by both workers before the update",
        )
        start = len(answers)
        before = {pid for _, _, pid in answers}
        gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-next")
        gw.sm.get_waiter("endpoint_in_service").wait(
            EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
        )
        # Served by the new fleet alone for a while, through whichever worker.
        wait_until(
            lambda: len([a for a in answers[-40:] if a[2] and a[2] not in before]) == 40,
            "calls answered by the new fleet",
        )
    finally:
        done.set()
        for caller in callers:
            caller.join(timeout=60)
    failed = [(status, body) for status, body, _ in answers[start:] if status != 200]
    assert not failed, f"{len(failed)} of {len(answers) - start} calls failed: {failed[:3]}"
