"""/metrics across workers (gateway/ops/worker_metrics.py): each worker serves its registry
on a Unix socket, and the one asked gives every worker's series with its label; and what
a key scoped to some resources sees of it (gateway/ops/routes.py)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shipyard.gateway.ops.routes import _Reached, _Text, _visible, scoped
from shipyard.gateway.ops.worker_metrics import WorkerMetrics, _grouped
from shipyard.metrics import Metrics


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
            text = (await workers[1].exposition()).decode()
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


_AWKWARD = ["plain", 'a "quoted" {brace} = value', "back\\slash", "new\nline", "sp ace"]


def test_labels_added_as_text_read_back_as_the_parser_reads_them() -> None:
    """Each worker labels its samples as text (no parser on the event loop): whatever
    the label values hold, the result reads back as the same samples, plus ``worker``."""
    registry = CollectorRegistry()
    counter = Counter("odd", "Odd labels.", ["endpoint"], registry=registry)
    for n, value in enumerate(_AWKWARD):
        counter.labels(value).inc(n + 1)
    Gauge("bare", "No labels.", registry=registry).set(7)
    before = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    metrics = WorkerMetrics(registry, Path("/nowhere"), 3, 4)
    text = metrics.render()
    assert text.endswith(b"# EOF\n")
    after = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "worker")), s.value)
        for f in text_string_to_metric_families(_grouped([text[:-6]]).decode())
        for s in f.samples
        if s.labels["worker"] == "3"
    }
    assert after == before


def test_a_cut_answer_is_left_out_and_a_scoped_key_sees_only_what_it_reaches() -> None:
    async def scenario(folder: Path) -> None:
        registries = [_registry(3, 1, [0.01]), _registry(5, 0, [0.2])]
        for registry, other in zip(registries, ("f", "g"), strict=True):
            Counter("jobs_done", "Per job.", ["job"], registry=registry).labels(other).inc()
        workers = [WorkerMetrics(r, folder, n, 3) for n, r in enumerate(registries)]
        for worker in workers:
            await worker.start()
        # Worker 2 answers half its text and hangs up: left out, the scrape goes on.
        cut = workers[1].render()[:200]

        async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(cut)
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(half, path=str(folder / "2.sock"))
        try:
            everything = await workers[0].exposition()
            scoped_text = scoped(
                _Text(everything.decode()), lambda labels: labels.get("job") != "g"
            )
            text = everything.decode()
        finally:
            server.close()
            for worker in workers:
                await worker.close()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert {s.labels["worker"] for s in families["calls"].samples} == {"0", "1"}
        jobs = {s.labels["job"] for f in text_string_to_metric_families(scoped_text.decode())
                if f.name == "jobs_done" for s in f.samples}  # fmt: skip
        assert jobs == {"f"}

    with tempfile.TemporaryDirectory(prefix="wm-") as folder:
        asyncio.run(scenario(Path(folder)))


def test_a_key_scoped_to_endpoints_sees_no_other_transform_job() -> None:
    """A series names a transform job in its ``job`` label: a key that cannot reach the
    job does not see it, as it does not see another team's endpoint (gateway/ops/routes.py)."""
    metrics = Metrics()
    metrics.transform_records.labels("team-a-job").set(1)
    metrics.transform_records.labels("team-b-job").set(2)

    class Edge:
        def reaches(self, arn: str) -> bool:
            return "/team-a-" in arn

    visible = _visible(Edge(), "us-east-1", "000000000000")  # type: ignore[arg-type]
    view = CollectorRegistry(auto_describe=False)
    view.register(_Reached(metrics.registry, visible))
    text = generate_latest(view).decode()
    assert 'job="team-a-job"' in text and "team-b-job" not in text
