"""/metrics across workers (gateway/worker_metrics.py): each worker serves its registry
on a Unix socket, and the one asked gives every worker's series with its label."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shipyard.gateway.worker_metrics import WorkerMetrics


def _registry(calls: int, in_flight: int, latencies: list[float]) -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("calls", "Calls.", ["endpoint"], registry=registry)
    counter.labels("e").inc(calls)
    Gauge("in_flight", "In flight.", ["endpoint"], registry=registry).labels("e").set(in_flight)
    histogram = Histogram("latency_seconds", "Latency.", ["endpoint"], registry=registry)
    for value in latencies:
        histogram.labels("e").observe(value)
    return registry


def test_every_workers_series_labelled_and_a_silent_worker_left_out() -> None:
    async def scenario(folder: Path) -> None:
        registries = [_registry(3, 1, [0.01]), _registry(5, 0, [0.2, 0.3])]
        workers = [WorkerMetrics(r, folder, n, 3) for n, r in enumerate(registries)]
        for worker in workers:
            await worker.start()
        try:
            # Worker 2 of 3 never started: left out, not waited for.
            text = generate_latest(await workers[1].gathered()).decode()
        finally:
            for worker in workers:
                await worker.close()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        calls = {s.labels["worker"]: s.value for s in families["calls"].samples}
        assert calls == {"0": 3.0, "1": 5.0}
        gauges = {s.labels["worker"]: s.value for s in families["in_flight"].samples}
        assert gauges == {"0": 1.0, "1": 0.0}
        counts = {
            s.labels["worker"]: s.value
            for s in families["latency_seconds"].samples
            if s.name == "latency_seconds_count"
        }
        assert counts == {"0": 1.0, "1": 2.0}
        assert text.count("# TYPE calls_total counter") == 1  # one family, both workers in it
        assert not list(folder.iterdir())  # each worker removed its socket

    with tempfile.TemporaryDirectory(prefix="wm-") as folder:  # short: a socket's path
        asyncio.run(scenario(Path(folder)))
