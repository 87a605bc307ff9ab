"""Reconciler: converges the instances that run to the endpoints the store describes.

Desired state is in the store (endpoint status, config, desired counts and weights);
actual state is the fleets held here. One converge task runs per endpoint at a time; a
supervise loop restarts instances that die and takes unhealthy ones out of routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from shipyard.control.fleet import Fleet, FleetFailed, Provisioner, Slot
from shipyard.errors import ShipyardError
from shipyard.metrics import Metrics
from shipyard.records import Endpoint, EndpointStatus, VariantState
from shipyard.routing.instance import Instance
from shipyard.routing.model_agent import loaded_models
from shipyard.routing.multimodel import MultiModelRoute, resync
from shipyard.routing.policies import model_policy_for, policy_for
from shipyard.routing.router import EndpointRoute, Router, VariantRoute
from shipyard.storage.metadata import MetadataStore

log = logging.getLogger(__name__)

_PING_FAILURES_BEFORE_RESTART = 3


class Reconciler:
    """Starts, health-checks, restarts and stops instances to match the store."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        provisioner: Provisioner,
        router: Router,
        metrics: Metrics,
        health_check_period_s: float,
        max_in_flight: int,
        model_routing: str = "affinity",
        unhealthy_restart_after_s: float = 20.0,
    ) -> None:
        self.store = store
        self.provisioner = provisioner
        self.router = router
        self.metrics = metrics
        self.health_check_period_s = health_check_period_s
        self.max_in_flight = max_in_flight
        self.unhealthy_restart_after_s = unhealthy_restart_after_s
        self.model_routing = model_routing
        """The policy of multi-model variants: a name from routing.policies.MODEL_POLICIES."""
        self.fleets: dict[str, Fleet] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

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
        await asyncio.gather(*(self.provisioner.stop_slots(f.all_slots()) for f in fleets))

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
            await asyncio.sleep(self.health_check_period_s)
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
            reason = self.provisioner.backend.exit_reason(slot.handle)
            if reason is not None:
                log.warning("instance %s exited: %s", slot.spec.instance_id, reason)
                changed |= await self._restart(fleet, slot)
                continue
            assert slot.instance is not None
            busy = slot.instance.in_flight > 0
            if await self.provisioner.ping(slot.instance, timeout_s=5.0):
                slot.ping_failures, slot.failing_since = 0, None
                if not slot.instance.healthy:
                    slot.instance.healthy = True
                    changed = True  # republish: requests queued meanwhile get a turn
                await self._resync_models(fleet, slot)
                continue
            slot.instance.healthy = False
            now = time.monotonic()
            if slot.failing_since is None:
                slot.failing_since = now
            if not busy:
                slot.ping_failures += 1
            # An idle instance that keeps failing goes after a few pings. A busy one may
            # be a user's server that cannot answer /ping while it works (the built-in
            # runtime always can), so it gets longer; but one that stays silent that long
            # is hung (stopped, deadlocked), and its requests will never be answered.
            if (
                slot.ping_failures >= _PING_FAILURES_BEFORE_RESTART
                or now - slot.failing_since >= self.unhealthy_restart_after_s
            ):
                log.warning(
                    "instance %s failed its health checks for %.0f s; replacing it",
                    slot.spec.instance_id,
                    now - slot.failing_since,
                )
                changed |= await self._restart(fleet, slot)
        if changed:
            self._publish(fleet)

    async def _resync_models(self, fleet: Fleet, slot: Slot) -> None:
        """Correct the router's view of what an idle multi-model instance holds.

        The view is learned from answers and can drift (a report lost with a request that
        gave up); only an idle instance is asked, so no load under way is forgotten.
        """
        instance = slot.instance
        if instance is None or instance.in_flight or fleet.templates[slot.variant].prefix is None:
            return
        names = await loaded_models(instance, timeout_s=5.0)
        if names is not None and not instance.in_flight:
            resync(instance, names)
            gauge = self.metrics.loaded_models
            gauge.labels(fleet.endpoint, slot.variant, instance.instance_id).set(len(names))

    async def _restart(self, fleet: Fleet, slot: Slot) -> bool:
        old = slot.handle
        slot.handle, slot.instance, slot.ping_failures = None, None, 0
        slot.failing_since = None
        self._publish(fleet)
        if old is not None:
            await self.provisioner.backend.stop(old, timeout_s=5.0)
        slot.restarts += 1
        try:
            await self.provisioner.start_slot(slot)
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
            fleet = await self.provisioner.launch(ep.name, config, counts, weights)
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
            fleet = await self.provisioner.launch(ep.name, config, counts, weights)
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
            self._forget_model_series(old, old.all_slots())

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
                await self.provisioner.drain_and_stop(extra)
                self._forget_model_series(fleet, extra)
            missing = state.desired_instance_count - len(slots)
            if missing > 0:
                new = [
                    self.provisioner.new_slot(ep.name, fleet, state.name) for _ in range(missing)
                ]
                try:
                    await asyncio.gather(*(self.provisioner.start_slot(s) for s in new))
                except BaseException as exc:
                    await self.provisioner.stop_slots(new)
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
        await self.provisioner.drain_and_stop(fleet.all_slots())

    # -- routing table and store ------------------------------------------------------

    def _publish(self, fleet: Fleet) -> None:
        variants = []
        for variant in fleet.config.variants:
            instances = [s.instance for s in fleet.slots[variant.name] if s.instance is not None]
            variants.append(
                VariantRoute(
                    variant.name,
                    weight=fleet.weights.get(variant.name, variant.weight),
                    policy=policy_for(variant.routing_strategy, max_in_flight=self.max_in_flight),
                    instances=instances,
                    metrics=self.metrics.for_variant(fleet.endpoint, variant.name),
                    multi_model=self._model_route(fleet, variant.name, instances),
                )
            )
        self.router.publish(
            EndpointRoute(fleet.endpoint, variants, async_config=fleet.config.async_config)
        )
        self._export_instance_gauges()

    def _model_route(
        self, fleet: Fleet, variant: str, instances: list[Instance]
    ) -> MultiModelRoute | None:
        """Set for a variant serving a MultiModel model: its requests then need a TargetModel."""
        template = fleet.templates[variant]
        if template.prefix is None:
            return None
        return MultiModelRoute(
            prefix=template.prefix,
            policy=model_policy_for(self.model_routing, max_in_flight=self.max_in_flight),
            metrics={
                i.instance_id: self.metrics.for_instance_models(
                    fleet.endpoint, variant, i.instance_id
                )
                for i in instances
            },
            agent=template.agent,
        )

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
        self._forget_model_series(fleet, fleet.all_slots())

    def _forget_model_series(self, fleet: Fleet, slots: Sequence[Slot]) -> None:
        """Drop the multi-model series of instances that are gone."""
        for slot in slots:
            if fleet.templates[slot.variant].prefix is not None:
                self.metrics.forget_instance_models(
                    fleet.endpoint, slot.variant, slot.spec.instance_id
                )
