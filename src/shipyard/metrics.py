"""Prometheus metrics, in a registry owned by one gateway (tests run several at once)."""

from __future__ import annotations

import bisect
import contextlib
import functools
import operator
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import TypeGuard

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shipyard.statsets import StatSet

# Latency buckets from 0.1 ms: gateway overhead lives well under a millisecond.
_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_QUEUE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip


# Server-side batches: SHIPYARD_MAX_BATCH_SIZE is typically a power of two up to 128 or so.
_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# Model loads take from milliseconds (a small model from the disk cache) to minutes.
_LOAD_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
)  # fmt: skip


class Metrics:
    """Every metric the gateway exports at ``/metrics``."""

    async_backlog: Gauge
    transform_objects: Gauge
    transform_records: Gauge
    async_backlog_per_instance: Gauge
    async_oldest_age: Gauge
    async_backlog_without_capacity: Gauge
    model_cache_hits: Counter
    model_cache_misses: Counter
    model_evictions: Counter
    model_wait: Histogram
    model_download: Histogram
    model_load: Histogram
    model_unload: Histogram

    def __init__(self) -> None:
        # The *_created series double the output and nothing here reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        labels = ("endpoint", "variant")
        self.invocations = _Tallies(
            "shipyard_invocations",
            "Invocations answered, per endpoint and variant.",
            self.registry,
        )
        self.errors_4xx = _Tallies(
            "shipyard_invocation_4xx_errors",
            "Invocations answered with a 4xx status.",
            self.registry,
        )
        self.errors_5xx = _Tallies(
            "shipyard_invocation_5xx_errors",
            "Invocations answered with a 5xx status.",
            self.registry,
        )
        self.latency_logs: dict[tuple[str, str], LatencyLog] = {}
        """Per (endpoint, variant), the latencies the data path appended since the last
        read, and the ModelLatency and OverheadLatency sets in microseconds as CloudWatch
        keeps them since the recorder last took them (cloudwatch/recorder.py); see
        LatencyLog."""
        self.model_latency = _FoldedHistogram(
            "shipyard_model_latency_seconds",
            "Time the instance took to answer, seen from the gateway.",
            self.registry,
            self.fold_latencies,
        )
        self.overhead_latency = _FoldedHistogram(
            "shipyard_overhead_latency_seconds",
            "Time the gateway added to an invocation (total minus model latency).",
            self.registry,
            self.fold_latencies,
        )
        self.batch_size = Histogram(
            "shipyard_batch_size",
            "Server-side batching: the size of the batch that answered each request, as "
            "the instance reported it (X-Shipyard-Batch).",
            labels,
            buckets=_BATCH_SIZES,
            registry=self.registry,
        )
        self.batch_wait = Histogram(
            "shipyard_batch_wait_seconds",
            "Server-side batching: how long each request waited in the instance's queue "
            "before its batch was cut.",
            labels,
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.bidi = BidiMetrics(self.registry)
        self.instances = Gauge(
            "shipyard_instances",
            "Instances per endpoint, variant and state (healthy, unhealthy).",
            (*labels, "state"),
            registry=self.registry,
        )

        self.jobs = Gauge(
            "shipyard_jobs",
            "Active long-running jobs per TrainingJobStatus (InProgress, Stopping).",
            ("status",),
            registry=self.registry,
        )
        self.jobs_finished = Counter(
            "shipyard_jobs_finished",
            "Long-running jobs that reached a final TrainingJobStatus, per status.",
            ("status",),
            registry=self.registry,
        )

        self.cold_starts = Counter(
            "shipyard_serverless_cold_starts",
            "Serverless instances started because requests needed them.",
            labels,
            registry=self.registry,
        )
        self.model_setup_time = Histogram(
            "shipyard_model_setup_time_seconds",
            "ModelSetupTime: how long a serverless cold start took, from asking for the "
            "instance to its first good /ping.",
            labels,
            buckets=_LOAD_BUCKETS,
            registry=self.registry,
        )
        self.serverless_memory_kills = Counter(
            "shipyard_serverless_memory_stops",
            "Serverless instances stopped for going over their MemorySizeInMB.",
            labels,
            registry=self.registry,
        )
        self.shadow_copies_dropped = Counter(
            "shipyard_shadow_copies_dropped",
            "Copies of production requests not sent to a shadow variant because too many "
            "of its copies were still pending (SHIPYARD_SHADOW_MAX_PENDING_COPIES).",
            labels,
            registry=self.registry,
        )

        self.transform_objects = Gauge(
            "shipyard_transform_objects",
            "Input objects of each transform job: state total (found) or done (output written).",
            ("job", "state"),
            registry=self.registry,
        )
        self.transform_records = Gauge(
            "shipyard_transform_records_done",
            "Records of each transform job whose output is written.",
            ("job",),
            registry=self.registry,
        )

        self.capture_records = Counter(
            "shipyard_capture_records",
            "Data capture records per endpoint, variant and outcome: written, dropped (the "
            "buffer was full) or failed (the write failed).",
            (*labels, "outcome"),
            registry=self.registry,
        )

        self._async_metrics()
        self._model_metrics()
        self._admission_metrics()

    def _admission_metrics(self) -> None:
        # A variant's priority queue (routing/priorities.py): per level, as the level's
        # number ("1", "2", ...).
        labels = ("endpoint", "variant", "priority")
        self.queue_time = Histogram(
            "shipyard_queue_time_seconds",
            "QueueTime: how long each request that started on an instance waited for it at "
            "the gateway, per priority level.",
            labels,
            buckets=_QUEUE_BUCKETS,
            registry=self.registry,
        )
        self.admission_rejections = Counter(
            "shipyard_admission_rejections",
            "AdmissionRejections: requests refused by a variant's queue, per priority level "
            "and reason: queue_full (the queue was at its limit) or deadline (still waiting "
            "at its deadline).",
            (*labels, "reason"),
            registry=self.registry,
        )
        self.cancelled_requests = Counter(
            "shipyard_cancelled_requests",
            "CancelledRequests: requests whose client disconnected before they were "
            "answered, per priority level and stage: queued (they left the gateway's "
            "queue, never sent) or running (the connection to their instance was closed).",
            (*labels, "stage"),
            registry=self.registry,
        )

        self.admission_late = Counter(
            "shipyard_admission_late",
            "Requests whose deadline passed while they waited and that ran late "
            "(SHIPYARD_DEADLINE_ACTION=DELAY), per priority level.",
            labels,
            registry=self.registry,
        )

    def watch_queued(self, read: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        """Export ``shipyard_queued_requests`` from ``read()`` at each scrape: (endpoint,
        variant, priority level, requests waiting), read from the router's queues when
        /metrics is asked rather than kept in a gauge on every request."""
        self.registry.register(_Queued(read))

    def _async_metrics(self) -> None:
        # CloudWatch's names for asynchronous endpoints, one gauge each.
        gauges = {
            "async_backlog": ("shipyard_async_backlog_size", "ApproximateBacklogSize: queued "
                              "and running requests."),
            "async_backlog_per_instance": ("shipyard_async_backlog_size_per_instance",
                                           "ApproximateBacklogSizePerInstance."),
            "async_oldest_age": ("shipyard_async_oldest_request_age_seconds",
                                 "ApproximateAgeOfOldestRequest: the oldest queued request."),
            "async_backlog_without_capacity": ("shipyard_async_has_backlog_without_capacity",
                                               "HasBacklogWithoutCapacity: 1 when requests wait "
                                               "and no instance is up."),
        }  # fmt: skip
        for attr, (name, doc) in gauges.items():
            setattr(self, attr, Gauge(name, doc, ("endpoint",), registry=self.registry))
        self.async_queue_time = Histogram(
            "shipyard_async_queue_time_seconds",
            "Time asynchronous requests waited in the queue before an instance took them.",
            ("endpoint",),
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.async_invocations = Counter(
            "shipyard_async_invocations",
            "Asynchronous requests finished, per endpoint and outcome (Completed, Failed).",
            ("endpoint", "status"),
            registry=self.registry,
        )

    def _model_metrics(self) -> None:
        # Multi-model endpoints, under CloudWatch's names: ModelCacheHit is hits / (hits +
        # misses); the histograms' _count series count the loads, downloads and unloads.
        labels = ("endpoint", "variant", "instance")
        counters = {
            "model_cache_hits": ("shipyard_model_cache_hits", "ModelCacheHit: multi-model "
                                 "invocations whose TargetModel was already in memory."),
            "model_cache_misses": ("shipyard_model_cache_misses", "Multi-model invocations "
                                   "that waited for their TargetModel to load."),
            "model_evictions": ("shipyard_model_evictions", "Models unloaded to make room "
                                "for another."),
        }  # fmt: skip
        for attr, (name, doc) in counters.items():
            setattr(self, attr, Counter(name, doc, labels, registry=self.registry))
        self.loaded_models = Gauge(
            "shipyard_loaded_models",
            "LoadedModelCount: models in an instance's memory, as its last answer said.",
            labels,
            registry=self.registry,
        )
        histograms = {
            "model_wait": ("shipyard_model_loading_wait_seconds", "ModelLoadingWaitTime: how "
                           "long a request waited for its TargetModel to download and load."),
            "model_download": ("shipyard_model_downloading_seconds", "ModelDownloadingTime: "
                               "fetching a model's artifact (absent when the disk cache had it)."),
            "model_load": ("shipyard_model_loading_seconds", "ModelLoadingTime: loading a "
                           "model into memory (model_fn)."),
            "model_unload": ("shipyard_model_unloading_seconds", "ModelUnloadingTime: "
                             "unloading the models evicted for a load."),
        }  # fmt: skip
        for attr, (name, doc) in histograms.items():
            histogram = Histogram(name, doc, labels, buckets=_LOAD_BUCKETS, registry=self.registry)
            setattr(self, attr, histogram)

    def for_instance_models(self, endpoint: str, variant: str, instance: str) -> ModelMetrics:
        """Children of one multi-model instance, bound once when the route is published."""
        key = (endpoint, variant, instance)
        return ModelMetrics(
            cache_hits=self.model_cache_hits.labels(*key),
            cache_misses=self.model_cache_misses.labels(*key),
            evictions=self.model_evictions.labels(*key),
            loaded_models=self.loaded_models.labels(*key),
            wait=self.model_wait.labels(*key),
            download=self.model_download.labels(*key),
            load=self.model_load.labels(*key),
            unload=self.model_unload.labels(*key),
        )

    def forget_instance_models(self, endpoint: str, variant: str, instance: str) -> None:
        """Drop the series of an instance that is gone, so /metrics stops showing it."""
        for metric in (
            self.model_cache_hits,
            self.model_cache_misses,
            self.model_evictions,
            self.loaded_models,
            self.model_wait,
            self.model_download,
            self.model_load,
            self.model_unload,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(endpoint, variant, instance)

    def watch_in_flight(self, read: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        """Export ``shipyard_requests_in_flight`` from ``read()`` at each scrape.

        ``read`` yields (endpoint, variant, requests in flight): the router's own count,
        read when /metrics is asked rather than kept in a gauge on every request.
        """
        self.registry.register(_InFlight(read))

    def for_variant(self, endpoint: str, variant: str) -> VariantMetrics:
        """Children bound once per variant, so the hot path never looks labels up."""
        key = (endpoint, variant)
        log = self.latency_logs.get(key)
        if log is None:
            log = self.latency_logs[key] = LatencyLog(
                model=self.model_latency.child(key),
                overhead=self.overhead_latency.child(key),
            )
        return VariantMetrics(
            admission=_AdmissionSeries(self, endpoint, variant),
            invocations=self.invocations.labels(endpoint, variant),
            errors_4xx=self.errors_4xx.labels(endpoint, variant),
            errors_5xx=self.errors_5xx.labels(endpoint, variant),
            latency=log,
            batch_size=functools.partial(self.batch_size.labels, endpoint, variant),
            batch_wait=functools.partial(self.batch_wait.labels, endpoint, variant),
        )

    def fold_latencies(self) -> None:
        """Bring every variant's latency histograms and CloudWatch sets up to date with
        what the data path appended (each reader calls this first)."""
        for log in list(self.latency_logs.values()):
            log.fold()


class BidiMetrics:
    """Bidirectional streams: those open, and the parts relayed each way, per endpoint
    and variant. The open streams are read from the routing tables at each scrape
    (``watch``), so every variant is exported, at 0 when it has none."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("endpoint", "variant")
        self._open = _OpenStreams()
        registry.register(self._open)
        self.parts = Counter(
            "shipyard_bidi_parts",
            "Parts relayed on bidirectional streams: in from clients, out from models.",
            (*labels, "direction"),
            registry=registry,
        )

    def __repr__(self) -> str:
        return "BidiMetrics()"

    def watch(self, read: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        """Export ``shipyard_bidi_streams_active`` from ``read()`` at each scrape:
        (endpoint, variant, streams open)."""
        self._open.read = read

    def counting(self, endpoint: str, variant: str) -> Callable[[str], None]:
        """What counts one part relayed ("in" or "out") on a stream of ``variant``."""
        counted = {d: self.parts.labels(endpoint, variant, d) for d in ("in", "out")}
        return lambda direction: counted[direction].inc()


class _OpenStreams(Collector):
    _labelnames = ("endpoint", "variant")  # as prometheus_client's own keep them

    def __init__(self) -> None:
        self.read: Callable[[], Iterable[tuple[str, str, int]]] = tuple

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "shipyard_bidi_streams_active",
            "Bidirectional streams open, per endpoint and variant.",
            labels=("endpoint", "variant"),
        )
        for endpoint, variant, count in self.read():
            family.add_metric((endpoint, variant), count)
        yield family


class _AdmissionSeries:
    """One variant's priority-queue series, each level's bound at its first use."""

    __slots__ = ("_metrics", "_endpoint", "_variant", "_waits", "_late")

    def __init__(self, metrics: Metrics, endpoint: str, variant: str) -> None:
        self._metrics = metrics
        self._endpoint = endpoint
        self._variant = variant
        self._waits: dict[int, Histogram] = {}
        self._late: dict[int, Counter] = {}

    def queued(self, level: int, waited_s: float) -> None:
        child = self._waits.get(level)
        if child is None:
            child = self._waits[level] = self._metrics.queue_time.labels(
                self._endpoint, self._variant, str(level)
            )
        child.observe(waited_s)

    def refused(self, level: int, reason: str) -> None:
        self._metrics.admission_rejections.labels(
            self._endpoint, self._variant, str(level), reason
        ).inc()

    def cancelled(self, level: int, stage: str) -> None:
        self._metrics.cancelled_requests.labels(
            self._endpoint, self._variant, str(level), stage
        ).inc()

    def late(self, level: int) -> None:
        child = self._late.get(level)
        if child is None:
            child = self._late[level] = self._metrics.admission_late.labels(
                self._endpoint, self._variant, str(level)
            )
        child.inc()


@dataclass(slots=True)
class VariantMetrics:
    admission: _AdmissionSeries
    invocations: _Tally
    errors_4xx: _Tally
    errors_5xx: _Tally
    latency: LatencyLog
    batch_size: Callable[[], Histogram]
    batch_wait: Callable[[], Histogram]
    _batches: tuple[Histogram, Histogram] | None = None

    def queued(self, level: int, waited_s: float) -> None:
        """A request at priority ``level`` started on an instance after ``waited_s``."""
        self.admission.queued(level, waited_s)

    def refused(self, level: int, reason: str) -> None:
        """The priority queue refused a request: ``queue_full`` or ``deadline``."""
        self.admission.refused(level, reason)

    def cancelled(self, level: int, stage: str) -> None:
        """A request's client left before its answer: ``queued`` or ``running``."""
        self.admission.cancelled(level, stage)

    def late(self, level: int) -> None:
        """A request's deadline passed while it waited, and it waits on (DELAY)."""
        self.admission.late(level)

    def observe_batch(self, size: int, wait_s: float) -> None:
        """One answer of a server-side batch. The batch series are bound at the first, so
        a variant that never batches has none (rather than two empty histograms)."""
        if self._batches is None:
            self._batches = (self.batch_size(), self.batch_wait())
        self._batches[0].observe(size)
        self._batches[1].observe(wait_s)


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """One multi-model instance's series; see Metrics._model_metrics for their meaning."""

    cache_hits: Counter
    cache_misses: Counter
    evictions: Counter
    loaded_models: Gauge
    wait: Histogram
    download: Histogram
    load: Histogram
    unload: Histogram


class _Tally:
    """One series of a _Tallies: a plain number, counted on the event loop's thread."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Tallies(Collector):
    """A counter per (endpoint, variant), exported as Prometheus's ``<name>_total``.

    Counted once or twice on every request: prometheus_client's Counter takes a lock on
    each ``inc``, which the data path, on one thread, does not need.
    """

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._children: dict[tuple[str, str], _Tally] = {}
        registry.register(self)

    def labels(self, endpoint: str, variant: str) -> _Tally:
        found = self._children.get((endpoint, variant))
        if found is None:
            found = self._children[(endpoint, variant)] = _Tally()
        return found

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=("endpoint", "variant"))

    def describe(self) -> Iterator[CounterMetricFamily]:
        # The registry learns the names from this, and refuses a second metric of one.
        yield self._family()

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = self._family()
        for labels, tally in list(self._children.items()):
            family.add_metric(labels, tally.value)
        yield family


@dataclass(slots=True)
class _HistogramChild:
    counts: list[int]
    """Per bucket of ``_BUCKETS`` (and one past the last), the values that fell in it."""
    sum: float = 0.0


class _FoldedHistogram(Collector):
    """A latency histogram per (endpoint, variant) exported as Prometheus's, its counts
    kept by LatencyLog.fold rather than by an ``observe`` per request (see LatencyLog)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        registry: CollectorRegistry,
        fold: Callable[[], None],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self._fold = fold
        self._children: dict[tuple[str, str], _HistogramChild] = {}
        registry.register(self)

    def child(self, labels: tuple[str, str]) -> _HistogramChild:
        found = self._children.get(labels)
        if found is None:
            found = self._children[labels] = _HistogramChild([0] * (len(_BUCKETS) + 1))
        return found

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=("endpoint", "variant"))

    def describe(self) -> Iterator[HistogramMetricFamily]:
        # The registry learns the names from this, and refuses a second metric of one.
        yield self._family()

    def collect(self) -> Iterator[HistogramMetricFamily]:
        self._fold()
        family = self._family()
        for labels, child in list(self._children.items()):
            running, buckets = 0, []
            for bound, count in zip((*_BUCKETS, float("inf")), child.counts, strict=True):
                running += count
                buckets.append((_bucket_label(bound), running))
            family.add_metric(labels, buckets, child.sum)
        yield family


def _bucket_label(bound: float) -> str:
    label: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return label


@dataclass(slots=True)
class LatencyLog:
    """One variant's answers' model and overhead latencies, appended on the data path
    and folded into the Prometheus histograms and the CloudWatch sets when they are read.

    Four ``observe`` calls per request (two Prometheus histograms, each taking a lock per
    call, and two sets that each compute a logarithmic bucket) cost the gateway 7-8 µs of
    its ~100 µs per echo request (bench/results/gateway_drift.md); appending two floats
    costs a tenth of a microsecond, and folding them in bulk (every 256 answers, or when
    read) a fraction of what the calls did. Everything runs on the event loop's thread,
    as the readers do.
    """

    model: _HistogramChild
    overhead: _HistogramChild
    model_us: StatSet = field(default_factory=StatSet)
    overhead_us: StatSet = field(default_factory=StatSet)
    pending_model: list[float] = field(default_factory=list)
    pending_overhead: list[float | None] = field(default_factory=list)
    """None where the answer has no overhead of its own (a shadow's copy)."""

    def add(self, model_s: float, overhead_s: float | None) -> None:
        """One answer's latencies, in seconds."""
        self.pending_model.append(model_s)
        self.pending_overhead.append(overhead_s)
        if len(self.pending_model) >= _FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        model, self.pending_model = self.pending_model, []
        overhead, self.pending_overhead = self.pending_overhead, []
        if not model:
            return
        _fold(self.model, self.model_us, model)
        _fold(self.overhead, self.overhead_us, list(filter(_NOT_NONE, overhead)))


_FOLD_EVERY = 256
"""Appended values folded at once, at the latest (a reader folds sooner): a fold holds
the loop about a microsecond per value, so a few hundred keep it well under a
millisecond, and a bigger batch saves nothing per value."""


# A C call per value, as ``_fold`` wants; typed as the guard it is, which a partial
# cannot say.
_NOT_NONE: Callable[[float | None], TypeGuard[float]] = functools.partial(  # type: ignore[assignment]
    operator.is_not, None
)
_BUCKET_OF = functools.partial(bisect.bisect_left, _BUCKETS)
_MICROSECONDS = repeat(1e6)


def _fold(histogram: _HistogramChild, stats: StatSet, values: list[float]) -> None:
    # Chained C calls (map, Counter), no Python step per value: a fold takes two values
    # of every answer the gateway relays.
    if not values:
        return
    counts = histogram.counts
    for bucket, n in Tally(map(_BUCKET_OF, values)).items():
        counts[bucket] += n
    histogram.sum += sum(values)
    stats.observe_many(list(map(operator.mul, values, _MICROSECONDS)))


class _InFlight(Collector):
    def __init__(self, read: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "shipyard_requests_in_flight",
            "Requests sent to a variant's instances and not yet answered (real-time, "
            "multi-model and asynchronous alike).",
            labels=("endpoint", "variant"),
        )
        for endpoint, variant, count in self._read():
            family.add_metric((endpoint, variant), count)
        yield family


class _Queued(Collector):
    def __init__(self, read: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "shipyard_queued_requests",
            "Requests waiting at the gateway for an instance of a variant, per priority level.",
            labels=("endpoint", "variant", "priority"),
        )
        for endpoint, variant, level, count in self._read():
            family.add_metric((endpoint, variant, str(level)), count)
        yield family


CLOUDWATCH_NAMES = {
    "shipyard_invocations": "Invocations",
    "shipyard_invocation_4xx_errors": "Invocation4XXErrors",
    "shipyard_invocation_5xx_errors": "Invocation5XXErrors",
    "shipyard_model_latency_seconds": "ModelLatency",
    "shipyard_overhead_latency_seconds": "OverheadLatency",
    "shipyard_requests_in_flight": "ConcurrentRequestsPerModel",
    "shipyard_model_setup_time_seconds": "ModelSetupTime",
    "shipyard_async_backlog_size": "ApproximateBacklogSize",
    "shipyard_async_backlog_size_per_instance": "ApproximateBacklogSizePerInstance",
    "shipyard_async_oldest_request_age_seconds": "ApproximateAgeOfOldestRequest",
    "shipyard_async_has_backlog_without_capacity": "HasBacklogWithoutCapacity",
    "shipyard_model_cache_hits": "ModelCacheHit",
    "shipyard_model_cache_misses": "ModelCacheHit",
    "shipyard_loaded_models": "LoadedModelCount",
    "shipyard_model_loading_wait_seconds": "ModelLoadingWaitTime",
    "shipyard_model_downloading_seconds": "ModelDownloadingTime",
    "shipyard_model_loading_seconds": "ModelLoadingTime",
    "shipyard_model_unloading_seconds": "ModelUnloadingTime",
    "shipyard_queue_time_seconds": "QueueTime",
    "shipyard_admission_rejections": "AdmissionRejections",
    "shipyard_cancelled_requests": "CancelledRequests",
}
"""Prometheus series -> the CloudWatch metric (namespace ``AWS/SageMaker``) the recorder
writes from the same counts (cloudwatch/recorder.py): latencies there in microseconds,
ModelCacheHit as hits over hits and misses. The reference page of metrics lists them."""

CLOUDWATCH_ONLY = {
    "InvocationsPerInstance": "AWS/SageMaker: each invocation counted as 1/instances.",
    "CPUUtilization": "/aws/sagemaker/Endpoints: each instance's CPU, percent of one core.",
    "MemoryUtilization": "/aws/sagemaker/Endpoints: each instance's memory, percent of its "
    "InstanceType's.",
}
"""CloudWatch metrics the recorder writes that have no Prometheus series."""
