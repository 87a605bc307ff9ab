"""docs/reference/metrics.md: the Prometheus series of ``/metrics``, read from a fresh
Metrics' registry, with the CloudWatch metric each is recorded as (metrics.py)."""

from __future__ import annotations

from prometheus_client.registry import Collector

from shipyard.metrics import CLOUDWATCH_NAMES, CLOUDWATCH_ONLY, Metrics
from shipyard.reference.markdown import code, page, prose, table

_SUFFIXES = {"counter": "_total", "histogram": "_bucket, _sum, _count"}


def _labels(collector: Collector) -> tuple[str, ...]:
    """A collector's label names: prometheus_client's metrics keep them in
    ``_labelnames``, shipyard's own collectors' families likewise."""
    names = getattr(collector, "_labelnames", None)
    if names is None:
        family = next(iter(collector.describe()), None) if hasattr(collector, "describe") else None
        names = getattr(family, "_labelnames", ()) if family is not None else ()
    return tuple(names)


def series() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(name, type, labels, help) of every series a gateway exports, by name."""
    metrics = Metrics()
    metrics.watch_in_flight(lambda: [("endpoint", "variant", 0)])
    metrics.watch_queued(lambda: [("endpoint", "variant", 1, 0)])
    labels: dict[str, tuple[str, ...]] = {}
    for collector in list(metrics.registry._collector_to_names):
        for family in collector.collect():
            labels[family.name] = _labels(collector) or _sample_labels(family)
    out = []
    for family in metrics.registry.collect():
        out.append((family.name, family.type, labels.get(family.name, ()), family.documentation))
    return sorted(out)


def _sample_labels(family: object) -> tuple[str, ...]:
    for sample in getattr(family, "samples", ()):
        return tuple(sample.labels)
    return ()


def render() -> str:
    rows = []
    for name, kind, labels, documentation in series():
        exposed = name + _SUFFIXES.get(kind, "") if kind == "counter" else name
        shown = code(exposed) + (f" ({_SUFFIXES[kind]})" if kind == "histogram" else "")
        cloudwatch = CLOUDWATCH_NAMES.get(name)
        rows.append(
            (
                shown,
                kind,
                ", ".join(code(label) for label in labels),
                code(cloudwatch) if cloudwatch else "",
                prose(documentation),
            )
        )
    only = [(code(name), prose(what)) for name, what in sorted(CLOUDWATCH_ONLY.items())]
    return page(
        "Metrics",
        "What a gateway exports at `GET /metrics` in Prometheus's text format, and the "
        "CloudWatch metric it records from the same counts (namespace `AWS/SageMaker`, "
        "read with GetMetricStatistics or GetMetricData; latencies there in "
        "microseconds). With `auth:`, a key sees only the series of the resources it "
        "reaches.",
        "## Prometheus series\n",
        table(("Series", "Type", "Labels", "CloudWatch", "Meaning"), rows),
        "## CloudWatch only\n",
        "Recorded in CloudWatch, with no Prometheus series.\n",
        table(("Metric", "Meaning"), only),
    )
