"""The recorder: what the data path counts, written to the store as CloudWatch datapoints.

Every ``tick_s`` (10 s) it takes what accumulated since the last tick, off the request
path and on the event loop (where the data path counts, so nothing is counted twice or
lost between a read and a reset):

- per variant (``EndpointName``, ``VariantName``) and per inference component
  (``InferenceComponentName``), under ``AWS/SageMaker``: ``Invocations``,
  ``Invocation4XXErrors``, ``Invocation5XXErrors`` (1 per failed request, 0 per other,
  as SageMaker sends them, so Average is the error rate), ``InvocationsPerInstance``
  (1/instances per request), ``ModelLatency`` and ``OverheadLatency`` in microseconds,
  and ``ConcurrentRequestsPerModel`` sampled each tick;
- per asynchronous endpoint (``EndpointName``): ``ApproximateBacklogSize``,
  ``ApproximateBacklogSizePerInstance``, ``ApproximateAgeOfOldestRequest``,
  ``HasBacklogWithoutCapacity``;
- per serverless variant: ``ModelSetupTime`` (microseconds) of its cold starts;
- per variant with a priority queue (routing/priorities.py): ``QueueTime``
  (microseconds each started request waited) and ``AdmissionRejections``;
- per variant, ``CancelledRequests``: requests whose client left before their answer;
- per multi-model variant: ``ModelCacheHit`` (1 per hit, 0 per miss), ``LoadedModelCount``
  (each instance's, each tick), ``ModelLoadingWaitTime``, ``ModelDownloadingTime``,
  ``ModelLoadingTime`` and ``ModelUnloadingTime`` (microseconds);
- under ``/aws/sagemaker/Endpoints``, per variant (``EndpointName``, ``VariantName``), each
  instance's ``CPUUtilization`` (percent of one core, summed over cores, as SageMaker's)
  and ``MemoryUtilization`` (percent of its InstanceType's memory), read from the backend
  in a worker thread (``Instances``).

Each tick's readings are added to the rows of the 10 s and 60 s periods they fall in, in
one transaction, in a worker thread. Nothing is written for a series with no values in a
period, as CloudWatch publishes nothing then (alarms see missing data). Rows older than
the retention are purged once an hour, and so are series not written within it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shipyard.async_inference.consumer import BacklogReading
from shipyard.backends.base import Backend
from shipyard.instance_types import memory_bytes
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet
from shipyard.routing.router import Router
from shipyard.statsets import StatSet
from shipyard.storage.metrics import Dimensions, MetricStore, Point

log = logging.getLogger(__name__)

SAGEMAKER = "AWS/SageMaker"
ENDPOINTS = "/aws/sagemaker/Endpoints"
PERIODS = (10, 60)
_UNITS = {
    "ModelLatency": "Microseconds",
    "OverheadLatency": "Microseconds",
    "ModelSetupTime": "Microseconds",
    "QueueTime": "Microseconds",
    "ModelLoadingWaitTime": "Microseconds",
    "ModelDownloadingTime": "Microseconds",
    "ModelLoadingTime": "Microseconds",
    "ModelUnloadingTime": "Microseconds",
    "ApproximateAgeOfOldestRequest": "Seconds",
    "CPUUtilization": "Percent",
    "MemoryUtilization": "Percent",
}
"""The units SageMaker reports its metrics in, where not "None" (its metrics pages):
GetMetricStatistics answers with them, and a Unit asked for that is not the metric's
finds nothing, as in CloudWatch."""
"""Every recorded metric is kept at both: 10 s rows for high-resolution reads and
alarms (kept ``HIGH_RESOLUTION_KEEP_S``), 60 s rows for the retention."""

HIGH_RESOLUTION_KEEP_S = 3 * 3600
"""As CloudWatch keeps sub-minute datapoints: three hours."""

Reading = tuple[str, str, Dimensions, StatSet]
"""(namespace, metric name, dimensions, values) taken at one tick."""


@dataclass
class _Counters:
    """The cumulative counters of one variant at the last tick."""

    invocations: float = 0.0
    errors_4xx: float = 0.0
    errors_5xx: float = 0.0


@dataclass
class Readings:
    """Reads what the data path counted since the last call (``take``)."""

    metrics: Metrics
    router: Router
    backlogs: dict[str, BacklogReading]
    _last: dict[tuple[str, str], _Counters] = field(default_factory=dict)
    _totals: dict[tuple[str, ...], float] = field(default_factory=dict)

    def take(self) -> list[Reading]:
        dims = self._dimensions()
        out = list(self._invocations(dims))
        out.extend(self._latencies(dims))
        out.extend(self._concurrency(dims))
        out.extend(self._backlogs())
        out.extend(self._setup_times(dims))
        out.extend(self._multi_model(dims))
        out.extend(self._admission(dims))
        return out

    def _admission(self, dims: dict[tuple[str, str], tuple[Dimensions, int]]) -> Iterator[Reading]:
        """A priority queue's QueueTime (microseconds, each started request's wait, all
        levels together) and AdmissionRejections (the requests it refused); and any
        variant's CancelledRequests (those whose client left, queued or running)."""
        yield from self._means("QueueTime", self.metrics.queue_time, dims)
        refused = _per_variant(self.metrics.admission_rejections, "_total")
        for key, total in refused.items():
            n = self._delta(("refused", *key), total)
            found = dims.get(key)
            if n > 0 and found is not None:
                yield SAGEMAKER, "AdmissionRejections", found[0], StatSet.of(n, n, 1.0, 1.0)
        cancelled = _per_variant(self.metrics.cancelled_requests, "_total")
        for key, total in cancelled.items():
            n = self._delta(("cancelled", *key), total)
            found = dims.get(key)
            if n > 0 and found is not None:
                yield SAGEMAKER, "CancelledRequests", found[0], StatSet.of(n, n, 1.0, 1.0)

    def _multi_model(
        self, dims: dict[tuple[str, str], tuple[Dimensions, int]]
    ) -> Iterator[Reading]:
        m = self.metrics
        hits = _per_variant(m.model_cache_hits, "_total")
        misses = _per_variant(m.model_cache_misses, "_total")
        for key in hits.keys() | misses.keys():
            h = self._delta(("hits", *key), hits.get(key, 0.0))
            n = h + self._delta(("misses", *key), misses.get(key, 0.0))
            found = dims.get(key)
            if n > 0 and found is not None:
                yield SAGEMAKER, "ModelCacheHit", found[0], _ones(n, h)
        for family in m.loaded_models.collect():
            for s in family.samples:
                found = dims.get((s.labels["endpoint"], s.labels["variant"]))
                if found is not None:
                    stats = StatSet()
                    stats.observe(s.value)
                    yield SAGEMAKER, "LoadedModelCount", found[0], stats
        for name, histogram in (
            ("ModelLoadingWaitTime", m.model_wait),
            ("ModelDownloadingTime", m.model_download),
            ("ModelLoadingTime", m.model_load),
            ("ModelUnloadingTime", m.model_unload),
        ):
            yield from self._means(name, histogram, dims)

    def _delta(self, key: tuple[str, ...], value: float) -> float:
        """How much a cumulative value grew since the last tick (all of it, the first)."""
        last = self._totals.get(key, 0.0)
        self._totals[key] = value
        return max(value - last, 0.0)

    def _dimensions(self) -> dict[tuple[str, str], tuple[Dimensions, int]]:
        """Per (endpoint, label) published now, its dimensions and healthy instances."""
        found: dict[tuple[str, str], tuple[Dimensions, int]] = {}
        for route in list(self.router.routes.values()):
            for variant in route.variants:
                healthy = sum(1 for i in variant.instances if i.healthy)
                found[(route.name, variant.name)] = (
                    (("EndpointName", route.name), ("VariantName", variant.name)),
                    healthy,
                )
            for name, copies in route.components.items():
                healthy = sum(1 for i in copies.instances if i.healthy)
                found[(route.name, name)] = ((("InferenceComponentName", name),), healthy)
        return found

    def _invocations(
        self, dims: dict[tuple[str, str], tuple[Dimensions, int]]
    ) -> Iterator[Reading]:
        now: dict[tuple[str, str], _Counters] = {}
        for attr, metric in (
            ("invocations", self.metrics.invocations),
            ("errors_4xx", self.metrics.errors_4xx),
            ("errors_5xx", self.metrics.errors_5xx),
        ):
            for family in metric.collect():
                for s in family.samples:
                    if s.name.endswith("_total"):
                        key = (s.labels["endpoint"], s.labels["variant"])
                        setattr(now.setdefault(key, _Counters()), attr, s.value)
        for key, counters in now.items():
            last = self._last.get(key) or _Counters()
            self._last[key] = counters
            found = dims.get(key)
            n = counters.invocations - last.invocations
            if found is None or n <= 0:
                continue
            where, healthy = found
            e4 = max(counters.errors_4xx - last.errors_4xx, 0.0)
            e5 = max(counters.errors_5xx - last.errors_5xx, 0.0)
            yield SAGEMAKER, "Invocations", where, StatSet.of(n, n, 1.0, 1.0)
            yield SAGEMAKER, "Invocation4XXErrors", where, _ones(n, e4)
            yield SAGEMAKER, "Invocation5XXErrors", where, _ones(n, e5)
            share = 1.0 / max(healthy, 1)
            per = (
                "InvocationsPerCopy"
                if where[0][0] == "InferenceComponentName"
                else ("InvocationsPerInstance")
            )
            yield SAGEMAKER, per, where, StatSet.of(n, n * share, share, share)
        for key in [k for k in self._last if k not in now]:
            del self._last[key]

    def _latencies(self, dims: dict[tuple[str, str], tuple[Dimensions, int]]) -> Iterator[Reading]:
        for key, log in list(self.metrics.latency_logs.items()):
            log.fold()
            found = dims.get(key)
            for name, stats in (
                ("ModelLatency", log.model_us),
                ("OverheadLatency", log.overhead_us),
            ):
                if stats.count <= 0:
                    continue
                taken = _take(stats)
                if found is not None:
                    yield SAGEMAKER, name, found[0], taken

    def _concurrency(
        self, dims: dict[tuple[str, str], tuple[Dimensions, int]]
    ) -> Iterator[Reading]:
        for endpoint, label, busy in self.router.in_flight():
            found = dims.get((endpoint, label))
            if found is None:
                continue
            where, healthy = found
            name = (
                "ConcurrentRequestsPerCopy"
                if where[0][0] == "InferenceComponentName"
                else "ConcurrentRequestsPerModel"
            )
            stats = StatSet()
            stats.observe(busy / max(healthy, 1))
            yield SAGEMAKER, name, where, stats

    def _backlogs(self) -> Iterator[Reading]:
        for endpoint, backlog in list(self.backlogs.items()):
            where = (("EndpointName", endpoint),)
            values = {
                "ApproximateBacklogSize": float(backlog.size),
                "ApproximateBacklogSizePerInstance": backlog.size / max(backlog.instances, 1),
                "ApproximateAgeOfOldestRequest": backlog.oldest_age_s,
                "HasBacklogWithoutCapacity": 1.0 if backlog.without_capacity else 0.0,
            }
            for name, value in values.items():
                stats = StatSet()
                stats.observe(value)
                yield SAGEMAKER, name, where, stats

    def _setup_times(
        self, dims: dict[tuple[str, str], tuple[Dimensions, int]]
    ) -> Iterator[Reading]:
        return self._means("ModelSetupTime", self.metrics.model_setup_time, dims)

    def _means(
        self, name: str, histogram: Any, dims: dict[tuple[str, str], tuple[Dimensions, int]]
    ) -> Iterator[Reading]:
        """A latency histogram's growth since the last tick, in microseconds: its count
        and sum make the period's average exact; minimum and maximum are taken to be it."""
        sums = _per_variant(histogram, "_sum")
        for key, count in _per_variant(histogram, "_count").items():
            n = self._delta((name, "count", *key), count)
            spent = self._delta((name, "sum", *key), sums.get(key, 0.0))
            found = dims.get(key)
            if n > 0 and found is not None:
                mean = spent / n * 1e6
                yield SAGEMAKER, name, found[0], StatSet.of(n, spent * 1e6, mean, mean)


def _per_variant(metric: Any, suffix: str) -> dict[tuple[str, str], float]:
    """A per-instance series added up per (endpoint, variant)."""
    out: dict[tuple[str, str], float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith(suffix):
                key = (s.labels["endpoint"], s.labels["variant"])
                out[key] = out.get(key, 0.0) + s.value
    return out


@dataclass
class Instances:
    """Each instance's CPU and memory use, from its backend (blocking: in a thread)."""

    fleets: Mapping[str, Fleet]
    backend: Backend
    clock: Callable[[], float] = time.monotonic
    _cpu: dict[str, tuple[float, float]] = field(default_factory=dict)

    def take(self) -> list[Reading]:
        out: list[Reading] = []
        seen = set()
        for fleet in list(self.fleets.values()):
            types = {v.name: v.instance_type for v in fleet.config.variants}
            for variant, slots in list(fleet.slots.items()):
                if variant not in types:
                    continue  # an inference component's copies: not an instance
                where = (("EndpointName", fleet.endpoint), ("VariantName", variant))
                for slot in list(slots):
                    handle = slot.handle
                    if handle is None:
                        continue
                    seen.add(handle.instance_id)
                    out.extend(self._instance(handle, types[variant], where))
        for gone in [k for k in self._cpu if k not in seen]:
            del self._cpu[gone]
        return out

    def _instance(self, handle: Any, instance_type: str | None, where: Dimensions) -> list[Reading]:
        readings: list[Reading] = []
        used = self.backend.memory_bytes(handle)
        if used is not None and instance_type:
            stats = StatSet()
            stats.observe(100.0 * used / memory_bytes(instance_type))
            readings.append((ENDPOINTS, "MemoryUtilization", where, stats))
        spent, now = self.backend.cpu_seconds(handle), self.clock()
        if spent is not None:
            last = self._cpu.get(handle.instance_id)
            self._cpu[handle.instance_id] = (now, spent)
            if last is not None and now > last[0]:
                stats = StatSet()
                stats.observe(100.0 * max(spent - last[1], 0.0) / (now - last[0]))
                readings.append((ENDPOINTS, "CPUUtilization", where, stats))
        return readings


def _ones(n: float, ones: float) -> StatSet:
    """``n`` values, ``ones`` of them 1 and the rest 0."""
    ones = min(ones, n)
    stats = StatSet.of(n, ones, 0.0 if ones < n else 1.0, 1.0 if ones > 0 else 0.0)
    stats.hist = {"0": n - ones, "+0": ones} if ones else {"0": n}
    return stats


def _take(stats: StatSet) -> StatSet:
    """A copy of ``stats``, which is emptied (the data path goes on adding to it)."""
    taken = stats.copy()
    stats.count, stats.sum = 0.0, 0.0
    stats.min, stats.max = float("inf"), float("-inf")
    stats.hist = {}
    return taken


class Recorder:
    """Writes the readings of each tick as datapoints (see the module)."""

    def __init__(
        self,
        *,
        store: MetricStore,
        read: Callable[[], Iterable[Reading]],
        source: str,
        read_slowly: Callable[[], Iterable[Reading]] | None = None,
        retention_days: float,
        tick_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.read = read
        self.read_slowly = read_slowly
        """Readings that block (the backend's view of each instance): taken in a thread."""
        self.source = source
        self.retention_s = retention_days * 86_400
        self.tick_s = tick_s
        self._clock = clock
        self._purged_at = 0.0

    def __repr__(self) -> str:
        return f"Recorder(source={self.source!r}, tick_s={self.tick_s:g})"

    def collect(self, at: float) -> list[Point]:
        """This tick's readings as points of the 10 s and 60 s periods they fall in
        (those of the tick's middle: a tick on a boundary counts for the period before)."""
        return self._points(self.read(), at)

    def _points(self, readings: Iterable[Reading], at: float) -> list[Point]:
        middle = at - self.tick_s / 2
        points = []
        for namespace, name, dims, stats in readings:
            for period in PERIODS:
                start = int(middle // period * period)
                points.append(Point(namespace, name, dims, period, start, stats, _UNITS.get(name)))
        return points

    async def run(self) -> None:
        """Tick until cancelled, each tick's points written as soon as they are taken:
        a period's rows grow tick by tick (the store merges them), so a datapoint is
        readable within one tick, and complete one tick after its period ends."""
        try:
            while True:
                # Just after the tick's boundary, so a 10 s period is written whole at once.
                await asyncio.sleep(self.tick_s - self._clock() % self.tick_s + 0.05)
                await self._tick(self._clock())
        finally:
            # The gateway stops: what was counted since the last tick is not lost.
            with contextlib.suppress(Exception):
                await self._tick(self._clock())

    async def _tick(self, at: float) -> None:
        points = self.collect(at)
        try:
            if self.read_slowly is not None:
                slow = await asyncio.to_thread(lambda: list(self.read_slowly()))  # type: ignore[misc]
                points.extend(self._points(slow, at))
            await asyncio.to_thread(self.store.write, points, self.source, seen=int(at))
            if at - self._purged_at >= 3600:
                self._purged_at = at
                await asyncio.to_thread(self._purge, at)
        except Exception:  # a store that is down loses this tick, not the loop
            log.exception("recording %d datapoints failed", len(points))

    def _purge(self, at: float) -> None:
        self.store.purge(period=10, before=int(at - HIGH_RESOLUTION_KEEP_S))
        self.store.purge(period=60, before=int(at - self.retention_s))
        # A series with no datapoint within the retention (none left to read): gone, and
        # out of the callers' series quota.
        self.store.purge_series(before=int(at - self.retention_s))
        # CloudWatch keeps alarm history two weeks, deleted alarms' included.
        self.store.purge_history(before=datetime.fromtimestamp(at - 14 * 86_400, UTC))
