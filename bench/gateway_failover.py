"""One of two gateways killed under load: requests failed, and seconds to a new holder.

    .venv/bin/python bench/gateway_failover.py
    # PG=postgresql://postgres@127.0.0.1:5432/test CLIENTS=4 COUNT=2 WARM=10 TAIL=10 RUNS=3

Two ``shipyard serve`` processes on one PostgreSQL database (a schema of their own,
dropped afterwards), the default lease settings (``SHIPYARD_LEASE_S`` 6,
``SHIPYARD_LEASE_RENEW_S`` 1, ``SHIPYARD_ROUTES_REFRESH_S`` 0.25) unless set. One endpoint of
COUNT instances of a model whose ``transform_fn`` sleeps 20 ms. CLIENTS closed-loop
client threads per gateway, each with its own keep-alive ``http.client`` connection and
no retries: every answer other than 200 and every connection error is a failure.

After WARM s of load the gateway running the fleet (the one whose process has the
instances as children) is SIGKILLed; its instances die with it. The run goes on until
the survivor has held the lease for TAIL s. Measured from the kill:

- failures on the killed gateway: those in flight at the kill (sent before it), and the
  attempts after it (connection refused: a client of a dead gateway, not a lost request);
- failures on the survivor: those in flight on the instances that died with the killed
  gateway (503, which boto3 retries), and those sent after the kill; its slowest answer
  (requests wait for the new fleet);
- seconds until the survivor holds the lease (the ``leases`` row), and until its new
  fleet's instances are recorded healthy.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy
from harness import (
    Control,
    ServerProcess,
    entry,
    env_float,
    http_status,
    start_gateway,
    table,
    time_budget,
    wait_until,
)

SLEEPY = Path(__file__).resolve().parents[1] / "tests" / "models" / "sleepy"
BODY = json.dumps({"sleep": 0.02}).encode()


@dataclass
class Outcome:
    gateway: str
    sent: float
    done: float
    ok: bool
    error: str = ""


@dataclass
class Load:
    """Closed-loop clients on both gateways until ``stop`` is set."""

    endpoint: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, name: str, url: str, clients: int) -> None:
        for _ in range(clients):
            thread = threading.Thread(target=self._client, args=(name, url), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _client(self, name: str, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        conn: http.client.HTTPConnection | None = None
        path = f"/endpoints/{self.endpoint}/invocations"
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=90)
                conn.request("POST", path, BODY, {"Content-Type": "application/json"})
                response = conn.getresponse()
                body = response.read()
                ok = response.status == 200
                error = "" if ok else f"{response.status} {body[:80]!r}"
            except OSError as exc:
                ok, error = False, type(exc).__name__
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)  # a dead gateway refuses at once: do not spin
            self.outcomes.append(Outcome(name, sent, time.monotonic(), ok, error))

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


def _instances(gateway: ServerProcess) -> list[int]:
    pids = []
    for pid in gateway.track():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"shipyard.runtime" in cmdline and b"--spare" not in cmdline:
            pids.append(pid)
    return pids


def _lease(engine: sqlalchemy.Engine, schema: str, endpoint: str) -> tuple[str | None, Any]:
    query = f"SELECT holder, routes FROM {schema}.leases WHERE kind = 'endpoint' AND name = :n"
    with engine.connect() as conn:
        row = conn.execute(sqlalchemy.text(query), {"n": endpoint}).first()
    return (None, None) if row is None else (row[0], row[1])


def _healthy(routes: Any, old: set[str]) -> int:
    """Healthy instances in ``routes`` other than the ``old`` ones (by address: each
    gateway numbers its instances from 1)."""
    if not routes:
        return 0
    instances = [i for v in routes["variants"] for i in v["instances"]]
    return sum(i["healthy"] and i["url"] not in old for i in instances)


def run_once(pg: str, clients: int, count: int, warm_s: float, tail_s: float) -> dict[str, Any]:
    engine = sqlalchemy.create_engine(pg.replace("postgresql://", "postgresql+psycopg://"))
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    db = f"{pg}?options=-csearch_path%3D{schema}"
    gateways: dict[str, tuple[ServerProcess, str]] = {}
    load = Load("failover")
    try:
        with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
            for name in ("a", "b"):
                gateways[name] = start_gateway(Path(tmp) / name, args=["--db", db])
            Control(gateways["a"][1]).deploy("failover", SLEEPY.as_uri(), count=count)
            for _, url in gateways.values():
                invocations = f"{url}/endpoints/failover/invocations"
                wait_until(lambda u=invocations: http_status(u, BODY) == 200, 30, "an answer")
            for name, (_, url) in gateways.items():
                load.start(name, url, clients)
            time.sleep(warm_s)
            holder = next(n for n, (g, _) in gateways.items() if _instances(g))
            survivor = "b" if holder == "a" else "a"
            old_holder, old_routes = _lease(engine, schema, "failover")
            old_urls = {i["url"] for v in old_routes["variants"] for i in v["instances"]}
            killed = gateways[holder][0]
            killed.track()
            kill_at = time.monotonic()
            os.kill(killed.process.pid, signal.SIGKILL)
            killed.process.wait()
            taken_s = healthy_s = None
            while time.monotonic() - kill_at < 120:
                who, routes = _lease(engine, schema, "failover")
                now = time.monotonic() - kill_at
                if taken_s is None and who not in (None, old_holder):
                    taken_s = now
                fresh = _healthy(routes, old_urls)
                if taken_s is not None and healthy_s is None and fresh >= count:
                    healthy_s = now
                if healthy_s is not None and now >= healthy_s + tail_s:
                    break
                time.sleep(0.05)
            load.finish()
            fleet = _instances(gateways[survivor][0])
    finally:
        load.finish()
        for server, _ in gateways.values():
            server.stop()
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()
    return _summary(load.outcomes, holder, survivor, kill_at, taken_s, healthy_s, fleet)


def _summary(
    outcomes: list[Outcome],
    holder: str,
    survivor: str,
    kill_at: float,
    taken_s: float | None,
    healthy_s: float | None,
    fleet: list[int],
) -> dict[str, Any]:
    on_killed = [o for o in outcomes if o.gateway == holder]
    on_survivor = [o for o in outcomes if o.gateway == survivor]
    after = [o for o in on_survivor if o.done >= kill_at]
    return {
        "in flight on the killed gateway, failed": sum(
            not o.ok and o.sent < kill_at <= o.done for o in on_killed
        ),
        "killed gateway: attempts after the kill (refused)": sum(
            not o.ok and o.sent >= kill_at for o in on_killed
        ),
        "killed gateway: failed before the kill": sum(
            not o.ok and o.done < kill_at for o in on_killed
        ),
        "survivor: failed before the kill": sum(not o.ok and o.done < kill_at for o in on_survivor),
        "survivor: in flight on the dying instances, failed": sum(
            not o.ok and o.sent < kill_at <= o.done for o in on_survivor
        ),
        "survivor: sent after the kill, failed": sum(
            not o.ok and o.sent >= kill_at for o in on_survivor
        ),
        "survivor: answered after the kill": sum(o.ok for o in after),
        "survivor: slowest answer after the kill (s)": max(
            (o.done - o.sent for o in after if o.ok), default=0.0
        ),
        "kill → survivor holds the lease (s)": taken_s,
        "kill → new fleet recorded healthy (s)": healthy_s,
        "instances after (survivor)": len(fleet),
        "errors": sorted({o.error for o in outcomes if not o.ok}),
    }


def main() -> int:
    pg = os.environ.get("PG", "postgresql://postgres@127.0.0.1:5432/test")
    clients = int(env_float("CLIENTS", 4))
    count = int(env_float("COUNT", 2))
    warm_s, tail_s = env_float("WARM", 10), env_float("TAIL", 10)
    runs = int(env_float("RUNS", 3))
    results = []
    with time_budget(runs * 240):
        for i in range(runs):
            result = run_once(pg, clients, count, warm_s, tail_s)
            print(f"run {i + 1}: {json.dumps(result)}", flush=True)
            results.append(result)
    keys = [k for k in results[0] if k != "errors"]
    print(table(["run", *keys], [[i + 1, *(r[k] for k in keys)] for i, r in enumerate(results)]))
    print("errors seen:", sorted({e for r in results for e in r["errors"]}))
    return 0


if __name__ == "__main__":
    entry(main)
