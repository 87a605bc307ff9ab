"""The latency log and the tallies (metrics.py) export what prometheus_client's own
Histogram and Counter would, fed the same values, and the CloudWatch sets get what one
``observe`` per value gave."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from shipyard.metrics import _BUCKETS, Metrics
from shipyard.statsets import StatSet


def _lines(registry: CollectorRegistry, prefix: str) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_latencies_and_counts_export_as_prometheus_client_would() -> None:
    rng = random.Random(7)
    model = [rng.choice([0.0, 1e-5, 0.0001, 0.001, 2.5]) * rng.random() for _ in range(600)]
    model += list(_BUCKETS) + [120.0]  # a value on every bound, and one past the last
    overhead = [v / 7 for v in model]

    metrics = Metrics()
    ours = metrics.for_variant("e", "v")
    reference = CollectorRegistry()
    labels = ("endpoint", "variant")
    histograms = {
        name: Histogram(name, doc, labels, buckets=_BUCKETS, registry=reference).labels("e", "v")
        for name, doc in (
            ("shipyard_model_latency_seconds", metrics.model_latency.documentation),
            ("shipyard_overhead_latency_seconds", metrics.overhead_latency.documentation),
        )
    }
    count = Counter(
        "shipyard_invocations", metrics.invocations.documentation, labels, registry=reference
    ).labels("e", "v")
    for m, o in zip(model, overhead, strict=True):  # past 256 answers: folds on the way
        ours.latency.add(m, o)
        ours.invocations.inc()
        histograms["shipyard_model_latency_seconds"].observe(m)
        histograms["shipyard_overhead_latency_seconds"].observe(o)
        count.inc()

    for prefix in (
        "shipyard_model_latency_seconds",
        "shipyard_overhead_latency_seconds",
        "shipyard_invocations_total",
    ):
        got, want = _lines(metrics.registry, prefix), _lines(reference, prefix)
        assert got and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            name_a, value_a = a.rsplit(" ", 1)
            name_b, value_b = b.rsplit(" ", 1)
            assert name_a == name_b
            assert abs(float(value_a) - float(value_b)) <= 1e-9 * max(1.0, abs(float(value_b)))


def test_the_cloudwatch_sets_get_every_latency_in_microseconds_and_a_shadow_no_overhead() -> None:
    metrics = Metrics()
    ours = metrics.for_variant("e", "v")
    ours.latency.add(0.002, 0.0001)
    ours.latency.add(0.004, None)  # a shadow's copy: no overhead of its own
    model, overhead = ours.latency.model_us, ours.latency.overhead_us
    assert model.count == 0  # appended, not yet folded
    metrics.fold_latencies()
    assert (model.count, model.sum, model.min, model.max) == (2, 6000.0, 2000.0, 4000.0)
    assert (overhead.count, overhead.sum) == (1, 100.0)


def test_observe_many_is_observe_for_each_value() -> None:
    rng = random.Random(3)
    values = [rng.expovariate(1 / 300) for _ in range(500)] + [0.0, 0.0, 17.0, -4.5, -0.2]
    one_by_one, bulk = StatSet(), StatSet()
    for value in values:
        one_by_one.observe(value)
    bulk.observe_many(values[:250])
    bulk.observe_many(values[250:])
    assert (bulk.count, bulk.min, bulk.max) == (one_by_one.count, one_by_one.min, one_by_one.max)
    assert abs(bulk.sum - one_by_one.sum) < 1e-6
    assert bulk.hist == one_by_one.hist
    for statistic in ("p50", "p99", "Average"):
        assert bulk.value(statistic) == one_by_one.value(statistic)


def test_observe_many_refuses_nan_as_observe_does() -> None:
    with pytest.raises(ValueError):
        StatSet().observe(math.nan)
    with pytest.raises(ValueError):
        StatSet().observe_many([1.0, math.nan])
