"""What holding requests at the gateway costs a fast model: RANDOM against
LEAST_OUTSTANDING_REQUESTS on one instance, same model, same run.

LEAST_OUTSTANDING_REQUESTS sends a one-at-a-time instance only what it can start on (plus
one more when it answers in under 1 ms); this shows the throughput that leaves. sklearn
rows need scikit-learn (the peer venv has it: /tmp/peers/shipyard/bin/python).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import harness as h

MODELS = Path(os.environ.get("PEERS_ROOT", "/tmp/peers")) / "shipyard_models"
BODY = h.PEER_BODY
STRATEGIES = ("RANDOM", "LEAST_OUTSTANDING_REQUESTS")


def main() -> int:
    duration = h.env_float("DURATION", 6)
    concs = h.env_ints("CONCS", (8, 32))
    models = [m for m in ("sklearn", "echo") if (MODELS / m).is_dir()]
    if not models:
        print(f"no model folders under {MODELS}: run the peer harness's shipyard slot once")
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gateway, url = h.start_gateway(Path(tmp) / "home")
        try:
            control = h.Control(url)
            for model in models:
                for strategy in STRATEGIES:
                    name = f"{model}-{strategy[:3].lower()}"
                    control.deploy(name, (MODELS / model).as_uri(), strategy=strategy)
            for model in models:
                for conc in concs:
                    row: list[object] = [model, conc]
                    for strategy in STRATEGIES:
                        target = f"{url}/endpoints/{model}-{strategy[:3].lower()}/invocations"
                        r = h.run_wrk(target, BODY, connections=conc, duration_s=duration)
                        row.append(f"{r.rps:,.0f} ({r.p99_ms:.1f})")
                    rows.append(row)
        finally:
            gateway.stop()
    print(h.table(["model", "conc", "RANDOM req/s (p99 ms)", "LOR req/s (p99 ms)"], rows))
    return 0


if __name__ == "__main__":
    h.entry(main)
