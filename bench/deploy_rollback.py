"""A bad canary rolled back by its alarm: seconds from its first failed request to all
traffic back on the old fleet, and what the clients saw.

    .venv/bin/python bench/deploy_rollback.py
    # RUNS=3 PERIOD=10 TICK=10 CLIENTS=2

A real gateway (``SHIPYARD_METRICS_TICK_S`` = TICK) serves an endpoint of two instances
of tests/models/flaky labelled "old". An alarm watches its ``Invocation5XXErrors``
(Sum >= 2 in one PERIOD-second period). CLIENTS closed-loop boto3 clients send requests
throughout (no retries). UpdateEndpoint moves it to a config of the same model labelled
"bad" that fails 30 % of its requests, with a CANARY of one instance (half the traffic),
a 300 s bake and the alarm as AutoRollbackConfiguration. Reported per run: seconds from
the first failed request to the last answer from the bad fleet (the goal: within two
alarm periods), the failed requests (all the bad model's own), and the old model's
failures (the goal: none).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import entry
from tests.conftest import make_tarball, start_gateway, unique, wait_in_service
from tests.e2e.test_deployments import alarm_on_errors_for, canary, make_config, steady

RUNS = int(os.environ.get("RUNS", "3"))
PERIOD = int(os.environ.get("PERIOD", "10"))
TICK = os.environ.get("TICK", "10")
CLIENTS = int(os.environ.get("CLIENTS", "2"))


def run_once(home: Path) -> tuple[float, int, int, int]:
    gw = start_gateway(home, extra_env={"SHIPYARD_METRICS_TICK_S": TICK})
    try:
        url = make_tarball("flaky", home / "flaky.tar.gz").as_uri()
        name = unique("rollback")
        make_config(gw, f"{name}-a", url, "old")
        make_config(gw, f"{name}-b", url, "bad", fail=30)
        gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-a")
        wait_in_service(gw.sm, name)
        alarm = alarm_on_errors_for(gw, name, period=PERIOD)
        with steady(gw, name, clients=CLIENTS) as traffic:
            time.sleep(PERIOD + 2)  # the alarm OK on good traffic first
            gw.sm.update_endpoint(
                EndpointName=name,
                EndpointConfigName=f"{name}-b",
                DeploymentConfig=canary(300, [alarm]),
            )
            deadline = time.monotonic() + 10 * PERIOD + 60
            while gw.sm.describe_endpoint(EndpointName=name).get("PendingDeploymentSummary"):
                assert time.monotonic() < deadline, "never rolled back"
                time.sleep(0.2)
            time.sleep(2)
        answers = traffic.answers
        failed = [t for t, a in answers if a.startswith("error")]
        bad = [t for t, a in answers if a == "bad" or a.startswith("error")]
        old_failures = sum(1 for _, a in answers if a.startswith("error") and "bad" not in a)
        return max(bad) - min(failed), len(failed), old_failures, len(answers)
    finally:
        gw.stop()


def main() -> int:
    for n in range(RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            seconds, failed, old, total = run_once(Path(tmp))
        print(
            f"run {n + 1}: {seconds:5.1f} s from the first failure to the traffic back "
            f"({seconds / PERIOD:.2f} alarm periods); {failed} failed of {total}, "
            f"{old} of them the old model's"
        )
    return 0


if __name__ == "__main__":
    entry(main)
