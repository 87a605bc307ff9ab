"""Reconciler: converges the instances that run to the endpoints the store describes.

Desired state is in the store (endpoint status, config, desired counts and weights);
actual state is the fleets held here. One converge task runs per endpoint at a time; a
supervise loop restarts instances that die and takes unhealthy ones out of routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipyard.backends.base import Backend, BackendError, InstanceHandle, InstanceSpec
from shipyard.errors import ShipyardError
from shipyard.metrics import Metrics
from shipyard.records import Endpoint, EndpointConfig, EndpointStatus, VariantState
from shipyard.routing.instance import Instance
from shipyard.routing.policies import policy_for
from shipyard.routing.router import EndpointRoute, Router, VariantRoute
from shipyard.storage.artifacts import ArtifactError, ArtifactStore
from shipyard.storage.metadata import MetadataStore

log = logging.getLogger(__name__)

_PING_FAILURES_BEFORE_RESTART = 3


class FleetFailed(Exception):
    """A fleet could not be brought up; the message becomes the FailureReason."""


@dataclass(eq=False)
class Slot:
    """One instance the reconciler keeps alive: its spec, process and router view."""

    spec: InstanceSpec
    variant: str
    handle: InstanceHandle | None = None
    instance: Instance | None = None
    ping_failures: int = 0
    restarts: int = 0
    restart_at: float = 0.0

    def __repr__(self) -> str:
        return f"Slot(id={self.spec.instance_id!r}, variant={self.variant!r})"


@dataclass(eq=False)
class Fleet:
    """The instances serving one endpoint config of one endpoint."""

    endpoint: str
    config: EndpointConfig
    slots: dict[str, list[Slot]]
    weights: dict[str, float]
    images: dict[str, str] = field(default_factory=dict)

    def all_slots(self) -> list[Slot]:
        return [s for slots in self.slots.values() for s in slots]


@dataclass(frozen=True, slots=True)
class ReconcilerSettings:
    home: Path
    start_timeout_s: float
    health_check_period_s: float
    drain_timeout_s: float
    max_in_flight: int


class Reconciler:
    """Starts, health-checks, restarts and stops instances to match the store."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        backend: Backend,
        artifacts: ArtifactStore,
        router: Router,
        metrics: Metrics,
        settings: ReconcilerSettings,
    ) -> None:
        self.store = store
        self.backend = backend
        self.artifacts = artifacts
        self.router = router
        self.metrics = metrics
        self.settings = settings
        self.fleets: dict[str, Fleet] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"Reconciler(fleets={sorted(self.fleets)})"

    # -- public -----------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a converge pass now; safe to call from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def current_instance_counts(self, endpoint: str) -> dict[str, int]:
        fleet = self.fleets.get(endpoint)
        if fleet is None:
            return {}
        return {
            name: sum(1 for s in slots if s.instance is not None and s.instance.healthy)
            for name, slots in fleet.slots.items()
        }

    async def run(self) -> None:
        """Converge forever; cancelled by the app's lifespan."""
        self._loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._converge_loop(), name="reconciler.converge")
            group.create_task(self._supervise_loop(), name="reconciler.supervise")

    async def stop_all(self) -> None:
        """Stop every instance: converge tasks first, then all fleets, concurrently."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        fleets = list(self.fleets.values())
        self.fleets.clear()
        for fleet in fleets:
            self.router.withdraw(fleet.endpoint)
        await asyncio.gather(*(self._stop_slots(f.all_slots()) for f in fleets))

    # -- loops ------------------------------------------------------------------------

    async def _converge_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._converge_once()
            except Exception:
                log.exception("converge pass failed; retrying")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()

    async def _converge_once(self) -> None:
        endpoints = await asyncio.to_thread(self.store.list_endpoints)
        seen = set()
        for ep in endpoints:
            seen.add(ep.name)
            if ep.name in self._tasks:
                continue
            fleet = self.fleets.get(ep.name)
            if ep.status is EndpointStatus.DELETING:
                self._spawn(ep.name, self._delete(ep))
            elif ep.status is EndpointStatus.CREATING:
                self._spawn(ep.name, self._create(ep))
            elif ep.status is EndpointStatus.UPDATING:
                self._spawn(ep.name, self._update(ep))
            elif ep.status is EndpointStatus.IN_SERVICE and fleet is None:
                self._spawn(ep.name, self._create(ep))  # after a gateway restart
            elif ep.status is EndpointStatus.FAILED and fleet is not None:
                self._spawn(ep.name, self._retire_endpoint(ep.name))
        for name in list(self.fleets):
            if name not in seen and name not in self._tasks:
                self._spawn(name, self._retire_endpoint(name))

    def _spawn(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"reconciler.{name}")
        self._tasks[name] = task

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.pop(name, None)
            if not t.cancelled() and t.exception() is not None:
                log.error("converging %s failed", name, exc_info=t.exception())
            self._wake.set()

        task.add_done_callback(done)

    async def _supervise_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_check_period_s)
            for fleet in list(self.fleets.values()):
                if fleet.endpoint in self._tasks:
                    continue  # a converge task owns this fleet right now
                try:
                    await self._supervise(fleet)
                except Exception:
                    log.exception("supervising %s failed", fleet.endpoint)
            self._export_instance_gauges()

    async def _supervise(self, fleet: Fleet) -> None:
        changed = False
        for slot in fleet.all_slots():
            if slot.handle is None:
                if time.monotonic() >= slot.restart_at:
                    changed |= await self._restart(fleet, slot)
                continue
            reason = self.backend.exit_reason(slot.handle)
            if reason is not None:
                log.warning("instance %s exited: %s", slot.spec.instance_id, reason)
                changed |= await self._restart(fleet, slot)
                continue
            assert slot.instance is not None
            busy = slot.instance.in_flight > 0
            if await self._ping(slot.instance, timeout_s=5.0):
                slot.ping_failures = 0
                if not slot.instance.healthy:
                    slot.instance.healthy = True
            elif not busy:
                # A busy instance may be slow to answer /ping while it predicts; only an
                # idle one that keeps failing is restarted.
                slot.ping_failures += 1
                slot.instance.healthy = False
                if slot.ping_failures >= _PING_FAILURES_BEFORE_RESTART:
                    changed |= await self._restart(fleet, slot)
        if changed:
            self._publish(fleet)

    async def _restart(self, fleet: Fleet, slot: Slot) -> bool:
        old = slot.handle
        slot.handle, slot.instance, slot.ping_failures = None, None, 0
        self._publish(fleet)
        if old is not None:
            await self.backend.stop(old, timeout_s=5.0)
        slot.restarts += 1
        try:
            await self._start_slot(slot)
        except FleetFailed as exc:
            backoff = min(2.0**slot.restarts, 60.0)
            slot.restart_at = time.monotonic() + backoff
            log.warning("restart of %s failed (%s); next try in %gs", slot, exc, backoff)
            return True
        log.info("restarted instance %s", slot.spec.instance_id)
        return True

    # -- converge steps ---------------------------------------------------------------

    async def _create(self, ep: Endpoint) -> None:
        try:
            config = await asyncio.to_thread(self.store.get_endpoint_config, ep.config_name)
            counts = {v.name: v.desired_instance_count for v in ep.variants}
            weights = {v.name: v.desired_weight for v in ep.variants}
            fleet = await self._launch(ep.name, config, counts, weights)
        except (FleetFailed, ShipyardError) as exc:
            await self._change(ep.name, status=EndpointStatus.FAILED, failure_reason=str(exc))
            return
        self.fleets[ep.name] = fleet
        self._publish(fleet)
        if ep.status is EndpointStatus.CREATING:
            await self._change(
                ep.name, expect=[EndpointStatus.CREATING], status=EndpointStatus.IN_SERVICE
            )

    async def _update(self, ep: Endpoint) -> None:
        if ep.pending_config_name is None:
            await self._rescale(ep)
            return
        try:
            config = await asyncio.to_thread(self.store.get_endpoint_config, ep.pending_config_name)
            counts = {v.name: v.instance_count for v in config.variants}
            weights = {v.name: v.weight for v in config.variants}
            fleet = await self._launch(ep.name, config, counts, weights)
        except (FleetFailed, ShipyardError) as exc:
            # Blue/green: the old fleet never stopped serving, so a failed update rolls
            # back by simply not swapping.
            await self._change(
                ep.name,
                status=EndpointStatus.IN_SERVICE
                if ep.name in self.fleets
                else EndpointStatus.FAILED,
                pending_config_name=None,
                failure_reason=f"Update to endpoint configuration {ep.pending_config_name} "
                f"failed, the endpoint keeps its previous configuration: {exc}",
            )
            return
        old = self.fleets.get(ep.name)
        self.fleets[ep.name] = fleet
        self._publish(fleet)
        await self._change(
            ep.name,
            status=EndpointStatus.IN_SERVICE,
            config_name=config.name,
            pending_config_name=None,
            failure_reason=None,
            variants=tuple(
                VariantState(v.name, v.weight, v.instance_count) for v in config.variants
            ),
        )
        if old is not None:
            await self._retire(old)

    async def _rescale(self, ep: Endpoint) -> None:
        fleet = self.fleets.get(ep.name)
        if fleet is None:
            await self._create(ep)
            if ep.name not in self.fleets:
                return
            fleet = self.fleets[ep.name]
        for state in ep.variants:
            fleet.weights[state.name] = state.desired_weight
            slots = fleet.slots[state.name]
            extra = slots[state.desired_instance_count :]
            if extra:
                del slots[state.desired_instance_count :]
                self._publish(fleet)
                await self._drain_and_stop(extra)
            missing = state.desired_instance_count - len(slots)
            if missing > 0:
                new = [self._new_slot(ep.name, fleet, state.name) for _ in range(missing)]
                try:
                    await asyncio.gather(*(self._start_slot(s) for s in new))
                except BaseException as exc:
                    await self._stop_slots(new)
                    if not isinstance(exc, FleetFailed):
                        raise
                    await self._change(
                        ep.name,
                        status=EndpointStatus.IN_SERVICE,
                        failure_reason=f"Scaling variant {state.name} failed: {exc}",
                    )
                    return
                slots.extend(new)
        self._publish(fleet)
        await self._change(ep.name, status=EndpointStatus.IN_SERVICE, failure_reason=None)

    async def _delete(self, ep: Endpoint) -> None:
        await self._retire_endpoint(ep.name)
        with contextlib.suppress(ShipyardError):
            await asyncio.to_thread(self.store.delete_endpoint, ep.name)

    async def _retire_endpoint(self, name: str) -> None:
        self.router.withdraw(name)
        fleet = self.fleets.pop(name, None)
        if fleet is not None:
            await self._retire(fleet)
            self._forget_gauges(fleet)

    async def _retire(self, fleet: Fleet) -> None:
        await self._drain_and_stop(fleet.all_slots())

    # -- instances --------------------------------------------------------------------

    async def _launch(
        self,
        endpoint: str,
        config: EndpointConfig,
        counts: dict[str, int],
        weights: dict[str, float],
    ) -> Fleet:
        """Start every instance of ``config`` and return once all pass ``/ping``."""
        fleet = Fleet(endpoint=endpoint, config=config, slots={}, weights=dict(weights))
        for variant in config.variants:
            model = await asyncio.to_thread(self.store.get_model, variant.model_name)
            model_dir = await asyncio.to_thread(self._model_dir, model.model_data_url, variant.name)
            fleet.images[variant.name] = model.image
            fleet.slots[variant.name] = [
                self._new_slot(endpoint, fleet, variant.name, model_dir, model.environment)
                for _ in range(counts.get(variant.name, variant.instance_count))
            ]
        slots = fleet.all_slots()
        try:
            results = await asyncio.gather(
                *(self._start_slot(s) for s in slots), return_exceptions=True
            )
        except BaseException:
            # Cancelled (the gateway is stopping): instances that did come up must not outlive it.
            await self._stop_slots(slots)
            raise
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self._stop_slots(slots)
            first = failures[0]
            if not isinstance(first, FleetFailed | ShipyardError):
                raise first
            raise FleetFailed(str(first))
        return fleet

    def _model_dir(self, url: str | None, variant: str) -> Path:
        if not url:
            empty = self.settings.home / "models" / "_empty"
            empty.mkdir(parents=True, exist_ok=True)
            return empty
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        dest = self.settings.home / "models" / digest
        try:
            return self.artifacts.fetch_model(url, dest)
        except ArtifactError as exc:
            raise FleetFailed(f"Production variant {variant}: {exc}") from exc

    def _new_slot(
        self,
        endpoint: str,
        fleet: Fleet,
        variant: str,
        model_dir: Path | None = None,
        environment: dict[str, str] | None = None,
    ) -> Slot:
        if model_dir is None:  # another instance of an existing variant
            template = fleet.slots[variant][0].spec
            model_dir, environment = template.model_dir, template.environment
        instance_id = f"{endpoint}-{variant}-{next(self._ids)}"
        log_dir = self.settings.home / "logs" / endpoint
        log_dir.mkdir(parents=True, exist_ok=True)
        spec = InstanceSpec(
            instance_id=instance_id,
            image=fleet.images[variant],
            model_dir=model_dir,
            environment=dict(environment or {}),
            log_path=log_dir / f"{instance_id}.log",
        )
        return Slot(spec=spec, variant=variant)

    async def _start_slot(self, slot: Slot) -> None:
        """Start the slot's process and wait for its first good ``/ping``."""
        try:
            handle = await self.backend.start(slot.spec)
        except BackendError as exc:
            raise FleetFailed(str(exc)) from exc
        instance = Instance(slot.spec.instance_id, slot.variant, handle.url)
        try:
            await self._wait_ready(slot, handle, instance)
        except BaseException:
            # Failed, timed out or cancelled (gateway stopping): never leave it running.
            instance.pool.close()
            await self.backend.stop(handle, timeout_s=5.0)
            raise
        slot.handle, slot.instance = handle, instance

    async def _wait_ready(self, slot: Slot, handle: InstanceHandle, instance: Instance) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        delay = 0.02
        while True:
            reason = self.backend.exit_reason(handle)
            if reason is not None:
                raise FleetFailed(
                    f"Instance {slot.spec.instance_id} of production variant {slot.variant} "
                    f"failed to start: {reason}"
                )
            if await self._ping(instance, timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                raise FleetFailed(
                    f"Instance {slot.spec.instance_id} of production variant {slot.variant} "
                    f"did not pass the /ping health check within "
                    f"{self.settings.start_timeout_s:g} s."
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    async def _ping(self, instance: Instance, *, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                response = await instance.pool.request(b"GET", b"/ping", [])
        except (TimeoutError, OSError, Exception):
            return False
        return response.status == 200

    async def _drain_and_stop(self, slots: Sequence[Slot]) -> None:
        """Wait for in-flight requests on ``slots`` to finish (bounded), then stop them."""
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while time.monotonic() < deadline and any(
            s.instance is not None and s.instance.in_flight > 0 for s in slots
        ):
            await asyncio.sleep(0.05)
        await self._stop_slots(slots)

    async def _stop_slots(self, slots: Sequence[Slot]) -> None:
        async def stop(slot: Slot) -> None:
            if slot.instance is not None:
                slot.instance.pool.close()
            if slot.handle is not None:
                await self.backend.stop(slot.handle)
            slot.handle, slot.instance = None, None

        await asyncio.gather(*(stop(s) for s in slots))

    # -- routing table and store ------------------------------------------------------

    def _publish(self, fleet: Fleet) -> None:
        variants = []
        for variant in fleet.config.variants:
            instances = [s.instance for s in fleet.slots[variant.name] if s.instance is not None]
            variants.append(
                VariantRoute(
                    variant.name,
                    weight=fleet.weights.get(variant.name, variant.weight),
                    policy=policy_for(
                        variant.routing_strategy, max_in_flight=self.settings.max_in_flight
                    ),
                    instances=instances,
                    metrics=self.metrics.for_variant(fleet.endpoint, variant.name),
                )
            )
        self.router.publish(EndpointRoute(fleet.endpoint, variants))
        self._export_instance_gauges()

    async def _change(self, name: str, **changes: Any) -> None:
        try:
            await asyncio.to_thread(self.store.change_endpoint, name, **changes)
        except ShipyardError as exc:
            # The user moved the endpoint meanwhile (deleted it, say); the next pass sees it.
            log.info("endpoint %s changed underneath a converge step: %s", name, exc)

    def _export_instance_gauges(self) -> None:
        for fleet in self.fleets.values():
            for variant, slots in fleet.slots.items():
                healthy = sum(1 for s in slots if s.instance is not None and s.instance.healthy)
                gauge = self.metrics.instances
                gauge.labels(fleet.endpoint, variant, "healthy").set(healthy)
                gauge.labels(fleet.endpoint, variant, "unhealthy").set(len(slots) - healthy)

    def _forget_gauges(self, fleet: Fleet) -> None:
        for variant in fleet.slots:
            for state in ("healthy", "unhealthy"):
                with contextlib.suppress(KeyError):
                    self.metrics.instances.remove(fleet.endpoint, variant, state)
