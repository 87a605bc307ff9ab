"""Autoscaler: target tracking on the gateway's own counters.

Every tick (a second, or the period if shorter) it samples what the data path already
counts: invocations per variant (the ``shipyard_invocations`` counter), requests in
flight (the router's count) and, for asynchronous endpoints, the queue as the consumer
last saw it. Nothing on the request path changes and nothing there reads the store.
Each evaluation adds what other gateways sharing the store recorded for the targets this
one scales (``MetricReader.read_elsewhere``, their finished CloudWatch rows, read in a
worker thread): none for a gateway alone.

Every ``SHIPYARD_AUTOSCALING_PERIOD_S`` it evaluates each scalable target's policies:

- a per-instance metric (InvocationsPerInstance, ConcurrentRequestsPerModel,
  ApproximateBacklogSizePerInstance) asks for ``ceil(total / TargetValue)`` instances;
  any other for ``ceil(current * value / TargetValue)``, as target tracking does;
- several policies on one target: the largest wins, so a target scales in only when
  every policy agrees; DisableScaleIn keeps a policy from asking for fewer;
- ScaleOutCooldown runs from the last scale-out, ScaleInCooldown from the last step
  either way (AWS's default is 300 s each); the result is kept within
  [MinCapacity, MaxCapacity], and a count outside it is brought inside at once;
- an asynchronous variant at zero instances with requests waiting comes back to
  ``max(1, MinCapacity)`` at once (HasBacklogWithoutCapacity; the consumer wakes us).

A step changes DesiredInstanceCount through ``update_weights_and_capacities``, exactly
as a user's call would (new instances take traffic once healthy, removed ones drain
first), with its activity recorded in the same transaction. The activity ends, with its
event, once the endpoint is InService again. One step per target is in flight at a time.

Invocations are counted over a sliding window (``SHIPYARD_AUTOSCALING_WINDOW_S``, 60 s)
and given per minute, as CloudWatch's InvocationsPerInstance is.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from shipyard.async_inference.consumer import BacklogReading
from shipyard.autoscaling.scaling import (
    DEFAULT_COOLDOWN_S,
    PREDEFINED_METRICS,
    STEP_SCALING,
    metric_endpoint,
    step_wanted,
)
from shipyard.background import Wakeup
from shipyard.control.components import ComponentService
from shipyard.control.endpoints import EndpointService
from shipyard.errors import InvalidParameter, ObjectNotFound, ResourceNotFound, ShipyardError
from shipyard.events.kinds import scaling_activity_event
from shipyard.metrics import Metrics
from shipyard.records import (
    SHORT_OF_CAPACITY,
    ActivityStatus,
    ComponentStatus,
    Endpoint,
    EndpointStatus,
    Event,
    InferenceComponent,
    ScalableTarget,
    ScalingActivity,
    ScalingPolicy,
)
from shipyard.routing.router import Router
from shipyard.storage.metadata import now
from shipyard.storage.metrics import MetricStore, series_key
from shipyard.storage.scaling import ScalingStore, policies_by_target

log = logging.getLogger(__name__)


_SAGEMAKER = "AWS/SageMaker"
"""The namespace the gateways record invocations and concurrency under."""

PER_INSTANCE = frozenset(
    {
        "InvocationsPerInstance",
        "ConcurrentRequestsPerModel",
        "ApproximateBacklogSizePerInstance",
        "InvocationsPerCopy",
        "ConcurrentRequestsPerCopy",
    }
)


@dataclass
class _Series:
    """Samples of one cumulative counter, oldest first, within the window."""

    points: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, at: float, value: float, window_s: float) -> None:
        self.points.append((at, value))
        while len(self.points) > 2 and self.points[1][0] <= at - window_s:
            self.points.popleft()

    def per_minute(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, v0), (t1, v1) = self.points[0], self.points[-1]
        if t1 - t0 < 0.5:
            return None
        return max(v1 - v0, 0.0) / (t1 - t0) * 60.0


@dataclass
class _Gauge:
    """Recent samples of a level (requests in flight), averaged over the last period."""

    points: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, at: float, value: float, keep_s: float) -> None:
        self.points.append((at, value))
        while self.points and self.points[0][0] < at - keep_s:
            self.points.popleft()

    def mean(self) -> float | None:
        if not self.points:
            return None
        return sum(v for _, v in self.points) / len(self.points)


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """What the other gateways sharing the store recorded for one variant or component:
    its invocations per minute, and its requests in flight per instance (each gateway's
    mean, added up). None where they recorded nothing."""

    invocations_per_minute: float | None
    concurrency: float | None


_ROW_S = 10
"""The CloudWatch rows read for other gateways' counts: the 10 s ones, which every
gateway's recorder writes whole just after each ends (cloudwatch/recorder.py)."""


class MetricReader:
    """What the data path counts, sampled off it; values under CloudWatch's names.

    A gateway counts only the requests it routed. Where several gateways share the store
    (``--workers``, or gateways on other hosts), the one that scales an endpoint adds what
    the others recorded as CloudWatch datapoints (``read_elsewhere``): its own counts are
    current, the others' as of their last 10 s row."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        router: Router,
        healthy: Callable[[str], dict[str, int]],
        backlogs: dict[str, BacklogReading],
        window_s: float,
        period_s: float,
        metric_store: MetricStore | None = None,
        source: str = "",
        settle_s: float = 12.0,
    ) -> None:
        self.metrics = metrics
        self.router = router
        self.healthy = healthy
        self.backlogs = backlogs
        self.window_s = window_s
        self.period_s = period_s
        self.metric_store = metric_store
        self.source = source
        """This gateway's source in the store's rows (its identity): the rows left out."""
        self.settle_s = settle_s
        """How long after a row's period ends every gateway has written it: a recorder's
        tick and its reads of the instances (the alarms wait as long)."""
        self._invocations: dict[tuple[str, str], _Series] = {}
        self._in_flight: dict[tuple[str, str], _Gauge] = {}
        self.elsewhere: dict[tuple[str, str], Elsewhere] = {}
        """Per (endpoint, variant or component), the other gateways' counts as last read."""

    def __repr__(self) -> str:
        return f"MetricReader(window_s={self.window_s:g}, series={len(self._invocations)})"

    def sample(self, at: float) -> None:
        for family in self.metrics.invocations.collect():
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = (s.labels["endpoint"], s.labels["variant"])
                    series = self._invocations.setdefault(key, _Series())
                    series.add(at, s.value, self.window_s)
        for endpoint, variant, count in self.router.in_flight():
            gauge = self._in_flight.setdefault((endpoint, variant), _Gauge())
            gauge.add(at, float(count), self.period_s)

    def read_elsewhere(
        self, keys: Iterable[tuple[str, str, bool]], at: float
    ) -> dict[tuple[str, str], Elsewhere] | None:
        """What the other gateways sharing the store recorded for each ``(endpoint, name,
        is a component)``, in the rows they have all written by ``at`` (epoch seconds,
        ``settle_s`` after a row's period ends): invocations over the window, requests in
        flight over the period. Blocking: call it in a worker thread. Empty without a
        store; None if the store could not be read (keep the last reading: the others'
        share dropped for a pass would look like a fall in traffic)."""
        store = self.metric_store
        if store is None:
            return {}
        done = int((at - self.settle_s) // _ROW_S * _ROW_S)
        calls_s = _ROW_S * max(math.ceil(self.window_s / _ROW_S), 1)
        level_s = _ROW_S * max(math.ceil(self.period_s / _ROW_S), 1)
        wanted: dict[tuple[str, str], tuple[str, str]] = {}
        for endpoint, name, component in keys:
            if component:
                dims: tuple[tuple[str, str], ...] = (("InferenceComponentName", name),)
                level_name = "ConcurrentRequestsPerCopy"
            else:
                dims = (("EndpointName", endpoint), ("VariantName", name))
                level_name = "ConcurrentRequestsPerModel"
            wanted[(endpoint, name)] = (
                series_key(_SAGEMAKER, "Invocations", dims),
                series_key(_SAGEMAKER, level_name, dims),
            )
        if not wanted:
            return {}
        try:
            calls = store.sums_by_source(
                [c for c, _ in wanted.values()],
                period=_ROW_S,
                start=done - calls_s,
                end=done,
                other_than=self.source,
            )
            levels = store.sums_by_source(
                [lv for _, lv in wanted.values()],
                period=_ROW_S,
                start=done - level_s,
                end=done,
                other_than=self.source,
            )
        except Exception:
            log.exception("reading other gateways' counts failed; keeping the last reading")
            return None
        found: dict[tuple[str, str], Elsewhere] = {}
        for key, (calls_key, level_key) in wanted.items():
            by_source = calls.get(calls_key)
            rate = (
                sum(total for _, total in by_source.values()) / calls_s * 60.0
                if by_source
                else None
            )
            means = [total / count for count, total in levels.get(level_key, {}).values() if count]
            level = sum(means) if means else None
            if rate is not None or level is not None:
                found[key] = Elsewhere(rate, level)
        return found

    def value(self, metric: str, endpoint: str, variant: str) -> float | None:
        """``metric``'s value for the variant (per instance where the name says so): this
        gateway's counts, and the other gateways' as last read (``elsewhere``)."""
        instances = max(self.healthy(endpoint).get(variant, 0), 1)
        elsewhere = self.elsewhere.get((endpoint, variant))
        if metric in ("InvocationsPerInstance", "InvocationsPerCopy", "Invocations"):
            series = self._invocations.get((endpoint, variant))
            rate = series.per_minute() if series is not None else None
            if elsewhere is not None and elsewhere.invocations_per_minute is not None:
                rate = (rate or 0.0) + elsewhere.invocations_per_minute
            if rate is None:
                return None
            return rate if metric == "Invocations" else rate / instances
        if metric in ("ConcurrentRequestsPerModel", "ConcurrentRequestsPerCopy"):
            gauge = self._in_flight.get((endpoint, variant))
            level = gauge.mean() if gauge is not None else None
            per_instance = None if level is None else level / instances
            if elsewhere is not None and elsewhere.concurrency is not None:
                # Theirs is recorded per instance already (busy / healthy, as they saw it).
                per_instance = (per_instance or 0.0) + elsewhere.concurrency
            return per_instance
        backlog = self.backlogs.get(endpoint)
        if backlog is None:
            return None
        if metric == "ApproximateBacklogSize":
            return float(backlog.size)
        if metric == "ApproximateBacklogSizePerInstance":
            return backlog.size / max(backlog.instances, 1)
        if metric == "ApproximateAgeOfOldestRequest":
            return backlog.oldest_age_s
        if metric == "HasBacklogWithoutCapacity":
            return 1.0 if backlog.without_capacity else 0.0
        return None

    def forget(self, keep: Iterable[tuple[str, str]]) -> None:
        """Drop the series of variants no longer published."""
        alive = set(keep)
        for table in (self._invocations, self._in_flight):
            for key in [k for k in table if k not in alive]:
                del table[key]


@dataclass(frozen=True, slots=True)
class _Proposal:
    count: int
    cause: str
    scale_out_cooldown_s: float
    scale_in_cooldown_s: float
    disable_scale_in: bool


class Autoscaler:
    """Evaluates target-tracking policies and changes DesiredInstanceCount."""

    def __init__(
        self,
        *,
        store: ScalingStore,
        endpoints: EndpointService,
        reader: MetricReader,
        period_s: float,
        notify: Sequence[str] = (),
        on_event: Callable[[], None] = lambda: None,
        acts_on: Callable[[str], bool] = lambda endpoint: True,
        wakeup: Wakeup | None = None,
        components: ComponentService | None = None,
    ) -> None:
        self.store = store
        self.components = components
        """Inference components, whose DesiredCopyCount targets are scaled like variants."""
        self.acts_on = acts_on
        """Whether this gateway scales an endpoint: the one holding its fleet lease does,
        so gateways sharing the store never step one target twice."""
        self.endpoints = endpoints
        self.reader = reader
        self.period_s = period_s
        self.notify = tuple(notify)
        self._on_event = on_event
        self._wake = wakeup or Wakeup()
        """Set to evaluate now; shared with whoever knows when (the async consumer)."""
        self._last_out: dict[str, datetime] = {}
        self._last_any: dict[str, datetime] = {}
        self._open: dict[str, ScalingActivity] = {}
        """Per ResourceId, its step in flight."""
        self._stepped: dict[str, datetime] = {}
        """Per step scaling policy ARN, when an alarm last made it step (its Cooldown)."""

    def __repr__(self) -> str:
        return f"Autoscaler(period_s={self.period_s:g}, open={sorted(self._open)})"

    def wake(self) -> None:
        """Evaluate now (a target or policy changed, or requests wait with no instance);
        safe from any thread."""
        self._wake.set()

    async def run(self) -> None:
        self._wake.bind()
        await asyncio.to_thread(self._load)
        tick = min(1.0, self.period_s)
        next_at = time.monotonic()
        while True:
            at = time.monotonic()
            self.reader.sample(at)
            if at >= next_at:
                next_at = at + self.period_s
                try:
                    await self.evaluate()
                except Exception:  # one bad pass must not stop scaling
                    log.exception("autoscaling pass failed")
            if await self._wake.wait(min(tick, max(next_at - time.monotonic(), 0.01))):
                next_at = time.monotonic()

    def _load(self) -> None:
        """Cooldowns and steps in flight as the store has them (after a restart)."""
        for resource, started in self.store.last_activity_times().items():
            self._last_out[resource] = started
            self._last_any[resource] = started
        for activity in self.store.open_activities():
            self._open[activity.resource_id] = activity

    # -- one pass ---------------------------------------------------------------------

    async def evaluate(self) -> None:
        """Finish steps that converged, then take the next step of each target.

        The store is read and written in worker threads; the decisions are made here, on
        the event loop, where the fleets and the samples live.
        """
        endpoints, targets, policies = await asyncio.to_thread(self._read)
        components = await asyncio.to_thread(self._read_components)
        await asyncio.to_thread(self._finish_steps, endpoints, components)
        self.reader.forget(
            [(e.name, v.name) for e in endpoints.values() for v in e.variants]
            + [(c.endpoint, c.name) for c in components.values()]
        )
        elsewhere = await asyncio.to_thread(
            self.reader.read_elsewhere, self._read_here(targets, components, policies), time.time()
        )
        if elsewhere is not None:
            self.reader.elsewhere = elsewhere
        asynchronous = await asyncio.to_thread(self._asynchronous, endpoints, targets)
        for target in targets:
            try:
                if target.component is not None:
                    await self._evaluate_copies(target, components, policies)
                else:
                    await self._evaluate_variant(target, endpoints, policies, asynchronous)
            except Exception:
                # One target's failure (a policy that cannot be computed, a store error on
                # its step) must not stop every other endpoint of the gateway scaling.
                log.exception("autoscaling %s failed; evaluating the others", target.resource_id)

    async def _evaluate_variant(
        self,
        target: ScalableTarget,
        endpoints: dict[str, Endpoint],
        policies: dict[str, list[ScalingPolicy]],
        asynchronous: set[str],
    ) -> None:
        """One pass for a variant's DesiredInstanceCount."""
        endpoint = endpoints.get(target.endpoint)
        if endpoint is None or target.resource_id in self._open:
            return
        if not self.acts_on(target.endpoint):
            return
        if endpoint.status is not EndpointStatus.IN_SERVICE:
            return  # a step or an update is under way; look again next pass
        state = next((v for v in endpoint.variants if v.name == target.variant), None)
        if state is None:
            return
        current = state.desired_instance_count
        wanted, cause = self._wanted(
            target,
            current,
            policies.get(target.resource_id, []),
            zero_ok=target.endpoint in asynchronous,
        )
        if wanted is not None and wanted != current:
            await asyncio.to_thread(self._step, target, current, wanted, cause)

    def _asynchronous(
        self, endpoints: dict[str, Endpoint], targets: Iterable[ScalableTarget]
    ) -> set[str]:
        """The endpoints of the variant targets whose config is asynchronous now: only
        their variants may scale to zero. A target's MinCapacity 0 was checked when it was
        registered, but UpdateEndpoint may since have moved its endpoint to a real-time
        config. Blocking: call it in a worker thread."""
        names = {t.endpoint for t in targets if t.component is None}
        return {n for n in names if n in endpoints and self._is_async(endpoints[n].config_name)}

    def _is_async(self, config_name: str) -> bool:
        try:
            config = self.endpoints.store.get_endpoint_config(config_name)
        except ResourceNotFound:
            return False  # at least one instance: the safe side for a variant
        return config.async_config is not None

    def _read_here(
        self,
        targets: Iterable[ScalableTarget],
        components: dict[str, InferenceComponent],
        policies: dict[str, list[ScalingPolicy]],
    ) -> set[tuple[str, str, bool]]:
        """``(endpoint, variant or component, is a component)`` of what the policies of
        the targets this gateway scales read (a customized metric may name another
        endpoint's variant)."""
        keys = set()
        for target in targets:
            component = components.get(target.component or "")
            if component is not None and self.acts_on(component.endpoint):
                keys.add((component.endpoint, component.name, True))
            elif target.component is None and self.acts_on(target.endpoint):
                keys.add((target.endpoint, target.variant, False))
                for policy in policies.get(target.resource_id, []):
                    custom = policy.config.get("CustomizedMetricSpecification") or {}
                    keys.add((metric_endpoint(custom, target.endpoint), target.variant, False))
        return keys

    def _read_components(self) -> dict[str, InferenceComponent]:
        if self.components is None:
            return {}
        return {c.name: c for c in self.components.list()}

    async def _evaluate_copies(
        self,
        target: ScalableTarget,
        components: dict[str, InferenceComponent],
        policies: dict[str, list[ScalingPolicy]],
    ) -> None:
        """One pass for an inference component's DesiredCopyCount: as for a variant's
        instances, with its copies in their place."""
        component = components.get(target.component or "")
        if component is None or target.resource_id in self._open:
            return
        if not self.acts_on(component.endpoint):
            return
        if component.status is not ComponentStatus.IN_SERVICE and not _short(component):
            return  # a step or an update is under way; look again next pass
        target = replace(target, endpoint=component.endpoint, variant=component.name)
        current = component.copies
        wanted, cause = self._wanted(
            target, current, policies.get(target.resource_id, []), zero_ok=True
        )
        if wanted is not None and wanted != current:
            await asyncio.to_thread(self._step, target, current, wanted, cause)

    def _read(
        self,
    ) -> tuple[dict[str, Endpoint], list[ScalableTarget], dict[str, list[ScalingPolicy]]]:
        endpoints = {e.name: e for e in self.endpoints.store.list_endpoints()}
        return endpoints, self.store.list_targets(), policies_by_target(self.store.list_policies())

    def _step(self, target: ScalableTarget, current: int, wanted: int, cause: str) -> None:
        stamp = now()
        what = "copy count" if target.component is not None else "instance count"
        activity = ScalingActivity(
            activity_id=str(uuid.uuid4()),
            resource_id=target.resource_id,
            description=f"Setting desired {what} to {wanted}.",
            cause=f"At {stamp.isoformat(timespec='seconds')} {cause}",
            started=stamp,
            status=ActivityStatus.IN_PROGRESS,
            from_count=current,
            to_count=wanted,
        )
        try:
            if target.component is not None and self.components is not None:
                self.components.update_copies(
                    target.component,
                    wanted,
                    also=lambda conn: self.store.start_activity(conn, activity),
                )
            else:
                self.endpoints.update_weights_and_capacities(
                    target.endpoint,
                    {target.variant: (None, wanted)},
                    also=lambda conn: self.store.start_activity(conn, activity),
                )
        except ShipyardError as exc:
            if endpoint_moved(exc):
                return  # the user changed the endpoint meanwhile; next pass decides again
            failed = ScalingActivity(
                **{**_fields(activity), "status": ActivityStatus.FAILED},
                ended=now(),
                status_message=f"Failed to set desired {what} to {wanted}: {exc.message}",
            )
            self.store.record_activity(failed, self._event(target, failed))
            self._on_event()
            self._last_any[target.resource_id] = stamp
            log.warning("scaling %s failed: %s", target.resource_id, exc.message)
            return
        log.info("scaling %s from %d to %d: %s", target.resource_id, current, wanted, cause)
        self._open[target.resource_id] = activity
        self._last_any[target.resource_id] = stamp
        if wanted > current:
            self._last_out[target.resource_id] = stamp

    def _wanted(
        self,
        target: ScalableTarget,
        current: int,
        policies: list[ScalingPolicy],
        *,
        zero_ok: bool,
    ) -> tuple[int | None, str]:
        """The count the target should have now and why; None when it should stay.
        ``zero_ok``: the target may scale to zero (an asynchronous endpoint's variant, an
        inference component)."""
        low, high = _bounds(target, zero_ok)
        out_ok = not target.suspended.get("DynamicScalingOutSuspended", False)
        in_ok = not target.suspended.get("DynamicScalingInSuspended", False)
        if current < low:
            return low, f"the current capacity {current} is below the minimum capacity {low}."
        if current > high:
            return high, f"the current capacity {current} is above the maximum capacity {high}."
        backlog = self.reader.backlogs.get(target.endpoint)
        if current == 0 and backlog is not None and backlog.without_capacity and out_ok:
            wanted = max(1, low)
            return wanted, (
                f"{backlog.queued} request(s) wait with no instance to run them "
                "(HasBacklogWithoutCapacity)."
            )
        proposals = [p for p in (self._propose(target, current, x) for x in policies) if p]
        if not proposals:
            return None, ""
        when = now()
        best = max(proposals, key=lambda p: p.count)
        wanted = min(max(best.count, low), high)
        if wanted > current:
            last = self._last_out.get(target.resource_id)
            if not out_ok or _cooling(last, best.scale_out_cooldown_s, when):
                return None, ""
            return wanted, best.cause
        if wanted < current:
            if not in_ok or any(p.disable_scale_in for p in proposals):
                return None, ""
            last = self._last_any.get(target.resource_id)
            if _cooling(last, max(p.scale_in_cooldown_s for p in proposals), when):
                return None, ""
            return wanted, best.cause
        return None, ""

    def _propose(
        self, target: ScalableTarget, current: int, policy: ScalingPolicy
    ) -> _Proposal | None:
        config = policy.config
        predefined = config.get("PredefinedMetricSpecification")
        custom: dict[str, Any] = config.get("CustomizedMetricSpecification") or {}
        if predefined is not None:
            metric = PREDEFINED_METRICS.get(predefined.get("PredefinedMetricType", ""))
            endpoint = target.endpoint
            shown = predefined.get("PredefinedMetricType", "")
        else:
            metric = custom.get("MetricName")
            endpoint = metric_endpoint(custom, target.endpoint)
            shown = metric or ""
        if metric is None:
            return None
        value = self.reader.value(metric, endpoint, target.variant)
        if value is None:
            return None
        goal = float(config["TargetValue"])
        if metric in PER_INSTANCE:
            instances = max(self.reader.healthy(target.endpoint).get(target.variant, 0), 1)
            quotient = value * instances / goal
        else:
            quotient = current * value / goal
        if not math.isfinite(quotient):
            # A TargetValue stored before PutScalingPolicy refused ones this small: no
            # count of instances follows from it, so the policy asks for nothing.
            log.warning(
                "policy %s of %s: %s %g over TargetValue %g is not a number of instances",
                policy.name, target.resource_id, shown, value, goal,
            )  # fmt: skip
            return None
        count = math.ceil(round(quotient, 9))
        relation = ">" if count > current else "<" if count < current else "="
        return _Proposal(
            count=count,
            cause=(
                f"target tracking policy {policy.name}: {shown} is {value:.4g} {relation} "
                f"target {goal:g}; it asks for {count} instance(s)."
            ),
            scale_out_cooldown_s=float(config.get("ScaleOutCooldown", DEFAULT_COOLDOWN_S)),
            scale_in_cooldown_s=float(config.get("ScaleInCooldown", DEFAULT_COOLDOWN_S)),
            disable_scale_in=bool(config.get("DisableScaleIn", False)),
        )

    # -- step scaling -----------------------------------------------------------------

    def run_step_policy(
        self, arn: str, alarm: str, state: str, value: float | None, threshold: float
    ) -> str:
        """Run the step scaling policy ``arn`` for ``alarm``, whose value is ``value``
        against ``threshold``; what it did, in words. Called by the alarm's
        evaluation (or SetAlarmState), from a worker thread."""
        policy = next((p for p in self.store.list_policies() if p.arn == arn), None)
        if policy is None:
            raise ObjectNotFound(f"No scaling policy has the ARN {arn}.")
        if policy.policy_type != STEP_SCALING:
            raise InvalidParameter(
                f"Policy {policy.name} is a {policy.policy_type} policy: alarms run step "
                "scaling policies only."
            )
        target = self.store.get_target(policy.resource_id)
        if target is None:
            raise ObjectNotFound(f"Policy {policy.name} has no scalable target.")
        if target.resource_id in self._open:
            return (
                f"Policy {policy.name} waits: a scaling activity of {target.resource_id} is "
                "under way."
            )
        when = now()
        cooldown = float(policy.config.get("Cooldown", DEFAULT_COOLDOWN_S))
        if _cooling(self._stepped.get(arn), cooldown, when):
            return f"Policy {policy.name} is in its cooldown of {cooldown:g} s."
        current = self._current(target)
        if current is None:
            return f"{target.resource_id} is being updated; the policy runs at the next period."
        breach = None if value is None else value - threshold
        wanted = step_wanted(policy.config, current, breach)
        if wanted is None:
            return f"No step of policy {policy.name} covers the alarm's value {value}."
        zero_ok = target.component is not None or self._endpoint_is_async(target.endpoint)
        low, high = _bounds(target, zero_ok)
        wanted = min(max(wanted, low), high)
        out = wanted > current
        key = "DynamicScalingOutSuspended" if out else "DynamicScalingInSuspended"
        if target.suspended.get(key, False):
            return f"{key} is set on {target.resource_id}."
        if wanted == current:
            return f"{target.resource_id} is already at {current}."
        self._stepped[arn] = when
        self._step(
            target,
            current,
            wanted,
            f"monitor alarm {alarm} in state {state} triggered policy {policy.name}.",
        )
        return f"Setting {target.resource_id} from {current} to {wanted}."

    def _endpoint_is_async(self, name: str) -> bool:
        try:
            return self._is_async(self.endpoints.store.get_endpoint(name).config_name)
        except ResourceNotFound:
            return False

    def _current(self, target: ScalableTarget) -> int | None:
        """The target's desired capacity now; None while it is being changed."""
        if target.component is not None:
            if self.components is None:
                return None
            component = self.components.describe(target.component)
            if component.status is not ComponentStatus.IN_SERVICE:
                return None
            return component.copies
        try:
            endpoint = self.endpoints.store.get_endpoint(target.endpoint)
        except ResourceNotFound:
            return None
        if endpoint.status is not EndpointStatus.IN_SERVICE:
            return None
        state = next((v for v in endpoint.variants if v.name == target.variant), None)
        return None if state is None else state.desired_instance_count

    # -- ending steps -----------------------------------------------------------------

    def _finish_steps(
        self, endpoints: dict[str, Endpoint], components: dict[str, InferenceComponent]
    ) -> None:
        for resource, activity in list(self._open.items()):
            name = resource.split("/")[1]
            if resource.startswith("inference-component/"):
                outcome = _copies_outcome(activity, components.get(name), name)
                if outcome is not None:
                    self._end(resource, activity, *outcome)
                continue
            endpoint = endpoints.get(name)
            if endpoint is not None and endpoint.status is EndpointStatus.UPDATING:
                continue
            if endpoint is None or endpoint.status is not EndpointStatus.IN_SERVICE:
                status, message = (
                    ActivityStatus.FAILED,
                    f"Failed to set desired instance count to {activity.to_count}: endpoint "
                    f"{name} is {'gone' if endpoint is None else endpoint.status}.",
                )
            elif endpoint.failure_reason:
                status, message = (
                    ActivityStatus.FAILED,
                    f"Failed to set desired instance count to {activity.to_count}: "
                    f"{endpoint.failure_reason}",
                )
            else:
                status, message = (
                    ActivityStatus.SUCCESSFUL,
                    f"Successfully set desired instance count to {activity.to_count}. Change "
                    "successfully fulfilled by sagemaker.",
                )
            self._end(resource, activity, status, message)

    def _end(
        self, resource: str, activity: ScalingActivity, status: ActivityStatus, message: str
    ) -> None:
        """Record the end of a step with its event, in one transaction."""
        ended = ScalingActivity(
            **{**_fields(activity), "status": status},
            ended=now(),
            status_message=message,
        )
        target = self.store.get_target(resource)
        event = self._event(target, ended) if target is not None else None
        self.store.finish_activity(
            activity.activity_id,
            status=status,
            message=message,
            ended=ended.ended or now(),
            event=event,
        )
        if event is not None:
            self._on_event()
        del self._open[resource]

    def _event(self, target: ScalableTarget, activity: ScalingActivity) -> Event:
        return scaling_activity_event(target, activity, self.notify)


def _copies_outcome(
    activity: ScalingActivity, component: InferenceComponent | None, name: str
) -> tuple[ActivityStatus, str] | None:
    """How a step of a component's copies ended; None while it is under way."""
    if component is None or component.status in (ComponentStatus.DELETING, ComponentStatus.FAILED):
        state = "gone" if component is None else component.status.value
        return ActivityStatus.FAILED, (
            f"Failed to set desired copy count to {activity.to_count}: inference component "
            f"{name} is {state}."
        )
    if component.status is ComponentStatus.IN_SERVICE and not component.failure_reason:
        return ActivityStatus.SUCCESSFUL, (
            f"Successfully set desired copy count to {activity.to_count}. Change "
            "successfully fulfilled by sagemaker."
        )
    if component.failure_reason:
        return ActivityStatus.FAILED, (
            f"Failed to set desired copy count to {activity.to_count}: {component.failure_reason}"
        )
    return None


def endpoint_moved(exc: ShipyardError) -> bool:
    """Whether ``exc`` says the endpoint changed under the step (not a refusal to scale)."""
    return exc.message.startswith(("Cannot update endpoint", "Could not find endpoint"))


def _bounds(target: ScalableTarget, zero_ok: bool) -> tuple[int, int]:
    """(MinCapacity, MaxCapacity) as the autoscaler holds the target to them: a target
    that may not scale to zero (a real-time variant: MinCapacity 0 is for asynchronous
    ones only) keeps at least one instance, whatever MinCapacity (and MaxCapacity) it
    kept from an asynchronous config."""
    if zero_ok:
        return target.min_capacity, target.max_capacity
    low = max(target.min_capacity, 1)
    return low, max(target.max_capacity, low)


def _cooling(last: datetime | None, cooldown_s: float, when: datetime) -> bool:
    return last is not None and when - last < timedelta(seconds=cooldown_s)


def _fields(activity: ScalingActivity) -> dict[str, Any]:
    return {
        "activity_id": activity.activity_id,
        "resource_id": activity.resource_id,
        "description": activity.description,
        "cause": activity.cause,
        "started": activity.started,
        "from_count": activity.from_count,
        "to_count": activity.to_count,
    }


def _short(component: InferenceComponent) -> bool:
    """A component left Updating because its copies fit nowhere (a step past the
    capacity): a step is not under way, and the policy may take it back in."""
    return component.status is ComponentStatus.UPDATING and (
        component.failure_reason or ""
    ).startswith(SHORT_OF_CAPACITY)
