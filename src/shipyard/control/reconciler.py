"""Reconciler: converges the instances that run to the endpoints the store describes.

Desired state is in the store (endpoint status, config, desired counts and weights);
actual state is the fleets held here. Two loops, and one part each for what they do:

- the converge loop reads the store and starts at most one step per endpoint at a time
  (control/convergence.py: create, update, rescale, delete);
- the supervise loop checks the instances of every fleet no step owns at the moment
  (control/supervision.py: health, restarts, hung instances) and stops serverless
  instances that have been idle long enough (control/serverless.py, which also starts
  them for demand and watches their memory);
- both publish what changed to the router (control/publishing.py), the only way
  instances reach the data path.

Gateways sharing the store each converge only the endpoints whose fleet lease they hold
(leases.py), claimed on every converge pass; a fleet whose lease ran out is
retired at once. On a backend whose instances outlive their gateway (Ray), the gateway
that takes a lease over from a holder that died adopts the instances it recorded that
still answer, and stops the rest (Provisioner.launch). The holder records its fleets'
routes in the store, and the other gateways publish them as their own tables
(control/mirror.py), so however many gateways run, an endpoint has one fleet and every
gateway routes to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from shipyard.background import Wakeup
from shipyard.capture.writer import CaptureWriter
from shipyard.control.convergence import Converger
from shipyard.control.mirror import FleetMirror, RouteRecorder
from shipyard.control.publishing import RoutePublisher
from shipyard.control.serverless import ServerlessScaler, start_failed
from shipyard.control.serverless_use import ServerlessUse
from shipyard.control.supervision import InstanceSupervisor
from shipyard.errors import ShipyardError
from shipyard.leases import Leases
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, Provisioner
from shipyard.records import Endpoint, EndpointStatus, InferenceComponent
from shipyard.routing.router import Router
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.serverless_use import ServerlessUseStore

log = logging.getLogger(__name__)


_SERVING = frozenset({EndpointStatus.IN_SERVICE, EndpointStatus.UPDATE_ROLLBACK_FAILED})
"""Statuses of an endpoint whose fleet serves (a rollback that failed left it serving
what it could bring back)."""


class Reconciler:
    """Starts, health-checks, restarts and stops instances to match the store."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        provisioner: Provisioner,
        router: Router,
        metrics: Metrics,
        leases: Leases,
        health_check_period_s: float,
        max_in_flight: int,
        model_routing: str = "affinity",
        unhealthy_restart_after_s: float = 20.0,
        serverless_idle_s: float = 300.0,
        serverless_slots: int = 1,
        routes_refresh_s: float = 1.0,
        capture: CaptureWriter | None = None,
    ) -> None:
        self.store = store
        self.leases = leases
        self.routes_refresh_s = routes_refresh_s
        self.provisioner = provisioner
        self.health_check_period_s = health_check_period_s
        self.fleets: dict[str, Fleet] = {}
        self.publisher = RoutePublisher(
            router=router,
            metrics=metrics,
            max_in_flight=max_in_flight,
            model_routing=model_routing,
            serverless_slots=serverless_slots,
            capture=capture,
        )
        self.serverless = ServerlessScaler(
            provisioner=provisioner,
            router=router,
            metrics=metrics,
            fleets=self.fleets,
            publish=self._publish_current,
            idle_s=serverless_idle_s,
            slots=serverless_slots,
        )
        self.publisher.on_demand = self._demand
        self.publisher.on_component_demand = self._component_demand
        self.recorder = RouteRecorder(leases=leases.store, period_s=leases.renew_s)
        self.serverless_use = ServerlessUse(
            ServerlessUseStore(store.engine, gateway=leases.store.holder),
            period_s=leases.renew_s,
            keep_s=self.publisher.router.timeout_s + leases.renew_s,
            fail=self._fail_waiting,
        )
        self.serverless.on_failed = self.serverless_use.failed
        self.publisher.on_change = self._record
        self.mirror = FleetMirror(
            store=store, leases=leases.store, publisher=self.publisher, holds=leases.holds
        )
        self.converger = Converger(
            store=store,
            provisioner=provisioner,
            publisher=self.publisher,
            fleets=self.fleets,
            serverless=self.serverless,
        )
        self.supervisor = InstanceSupervisor(
            provisioner=provisioner,
            publish=self._publish_current,
            metrics=metrics,
            unhealthy_restart_after_s=unhealthy_restart_after_s,
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._deleting: set[str] = set()
        """Endpoints whose running step (in ``_tasks``) is their delete."""
        self._wake = Wakeup()
        self._from_zero: set[str] = set()
        """Components a request asked to bring back from zero copies, being recorded."""
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"Reconciler(fleets={sorted(self.fleets)})"

    def _publish_current(self, fleet: Fleet) -> None:
        """Publish what serves ``fleet``'s endpoint now: ``fleet``, or the fleet that
        replaced it while a health check or a memory check was under way (which must not
        route the endpoint back to the old one, but may have changed a slot the two
        share: an inference component's copies are handed over)."""
        current = self.fleets.get(fleet.endpoint)
        if current is not None:
            self.publisher.publish(current)

    # -- public -----------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a converge pass now; safe to call from any thread."""
        self._wake.set()

    def fleet_of(self, endpoint: str) -> Fleet | None:
        """The endpoint's fleet: the one run here, else the copy of the holder's that the
        mirror keeps. What DescribeEndpoint, the console and the CLI count from, so
        they agree whichever gateway answers."""
        return self.fleets.get(endpoint) or self.mirror.fleets.get(endpoint)

    def current_instance_counts(self, endpoint: str) -> dict[str, int]:
        fleet = self.fleet_of(endpoint)
        if fleet is None:
            return {}
        return fleet.healthy()

    def current_copies(self, component: InferenceComponent) -> int:
        """How many copies of ``component`` answer their health checks now."""
        fleet = self.fleet_of(component.endpoint)
        if fleet is None or component.name not in fleet.components:
            return 0
        slots = fleet.slots.get(component.name, [])
        return sum(1 for s in slots if s.instance is not None and s.instance.healthy)

    async def announce_known(self) -> None:
        """Publish a not-ready table for every endpoint the store has in service, then
        the routes other gateways recorded for the fleets they hold.

        Called before the gateway says it is ready: after a restart, requests to an
        endpoint whose instances are still starting get ModelNotReady (429, retried by
        clients), never "not found"; and a gateway that starts beside others (a worker
        started again) routes to their fleets from its first request, rather than
        answering 429 until the mirror's first pass.
        """
        for ep in await asyncio.to_thread(self.store.list_endpoints):
            if ep.status not in (
                EndpointStatus.IN_SERVICE,
                EndpointStatus.UPDATING,
                EndpointStatus.ROLLING_BACK,
            ):
                continue
            try:
                config = await asyncio.to_thread(self.store.get_endpoint_config, ep.config_name)
            except ShipyardError:
                continue  # its config was deleted: the converge step reports it
            self.publisher.publish_starting(ep.name, config)
        try:
            await self.mirror.refresh(self.store.list_endpoints)
        except Exception:  # the mirror's loop tries again in routes_refresh_s
            log.exception("mirroring the routes of other gateways failed; retrying")

    async def run(self) -> None:
        """Converge and supervise until cancelled (by the app's lifespan)."""
        self._wake.bind()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._converge_loop(), name="reconciler.converge")
            group.create_task(self._supervise_loop(), name="reconciler.supervise")
            group.create_task(self.serverless.watch_memory(), name="reconciler.memory")
            group.create_task(self.recorder.run(), name="reconciler.record-routes")
            group.create_task(self._mirror_loop(), name="reconciler.mirror")
            group.create_task(self.serverless_use.run(), name="reconciler.serverless-use")

    async def stop_all(self) -> None:
        """Stop every instance: converge tasks first, then all fleets, concurrently; then
        hand their leases back, so another gateway starts them now rather than once the
        leases expire."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.serverless.stop()
        fleets = list(self.fleets.values())
        self.fleets.clear()
        for fleet in fleets:
            self.publisher.withdraw(fleet.endpoint)
        await asyncio.gather(*(self.provisioner.stop_slots(f.all_slots()) for f in fleets))
        self.mirror.close()
        await self.leases.release(self.leases.held())

    # -- loops ------------------------------------------------------------------------

    async def _converge_loop(self) -> None:
        while True:
            try:
                await self._converge_once()
            except Exception:
                log.exception("converge pass failed; retrying")
            await self._wake.wait(min(1.0, self.leases.renew_s))

    async def _converge_once(self) -> None:
        names = [ep.name for ep in await asyncio.to_thread(self.store.list_endpoints)]
        held = await self.leases.claim(names)
        # Components first: a component step judged by a stale read repeats harmlessly
        # (it places what the store asks, again).
        components = await asyncio.to_thread(self.converger.components.list)
        # Read again after the claim: from here to each spawn nothing may be awaited, or
        # a step finishing meanwhile would be judged by the status it found, and repeated.
        endpoints = await asyncio.to_thread(self.store.list_endpoints)
        hosted: dict[str, list[InferenceComponent]] = {}
        for component in components:
            hosted.setdefault(component.endpoint, []).append(component)
        seen = set()
        steps = self.converger
        for ep in endpoints:
            seen.add(ep.name)
            if ep.name not in held:
                self._let_go(ep.name)
                continue
            running = self._tasks.get(ep.name)
            if running is not None:
                deleted = ep.status is EndpointStatus.DELETING and ep.name not in self._deleting
                if deleted and not running.cancelling():
                    # A step still bringing up what is now deleted (a create waiting on
                    # instances that may never answer) stops them as it unwinds; the
                    # delete step follows once it has. Cancelled once: a second cancel
                    # would land in that unwinding and leave instances running.
                    running.cancel()
                continue
            step = self._step_for(ep, hosted.get(ep.name, []))
            if step is not None:
                if ep.status is EndpointStatus.DELETING:
                    self._deleting.add(ep.name)
                self._spawn(ep.name, step)
        for name in list(self.fleets):
            if name not in seen and name not in self._tasks:
                self._spawn(name, steps.retire(name))
        await self.serverless_use.apply(self.fleets, self.leases.holds, self.serverless)

    def _step_for(
        self, ep: Endpoint, components: list[InferenceComponent]
    ) -> Coroutine[Any, Any, None] | None:
        """The converge step ``ep`` needs now, if any."""
        steps = self.converger
        fleet = self.fleets.get(ep.name)
        # Taken over from a holder that died: the fleet it recorded, to adopt.
        taken = self.leases.taken_from(ep.name) if fleet is None else None
        if ep.status is EndpointStatus.DELETING:
            return steps.delete(ep)
        if ep.status is EndpointStatus.CREATING:
            return steps.create(ep, taken=taken)
        if ep.status is EndpointStatus.UPDATING:
            return steps.update(ep, taken=taken)
        if ep.status is EndpointStatus.ROLLING_BACK:
            # Its deployment's own step records the rollback; with none running (the
            # gateway stopped meanwhile, or the lease moved), this one finishes it.
            return steps.finish_rollback(ep, taken=taken)
        if ep.status in _SERVING and fleet is None:
            # After a gateway restart, or a lease taken over.
            return steps.create(ep, taken=taken)
        if ep.status is EndpointStatus.FAILED and fleet is not None:
            return steps.retire(ep.name)
        if (
            ep.status is EndpointStatus.IN_SERVICE
            and fleet is not None
            and fleet.config.hosts_components
            and not steps.components_settled(ep, fleet, components)
        ):
            return steps.place_components(ep, components)
        return None

    def _let_go(self, name: str) -> None:
        """Another gateway holds (or may take) the endpoint's lease: stop converging it
        and retire its fleet here, if there is one."""
        self.recorder.forget(name)
        task = self._tasks.get(name)
        if task is not None:
            task.cancel()  # a step stops the instances it started as it unwinds
        elif name in self.fleets:
            log.warning("lost the fleet lease of %s; stopping its fleet here", name)
            self._spawn(name, self._stop_fleet(name))

    async def _stop_fleet(self, name: str) -> None:
        """Out of routing and stopped at once, undrained: another gateway may be starting
        the endpoint's fleet already, and two must not run side by side. Its requests
        wait meanwhile for the routes of the new holder's fleet (control/mirror.py).
        Instances that outlive their gateway are left to the new holder instead, which
        adopts or stops them."""
        fleet = self.fleets.pop(name, None)
        if fleet is not None:
            self.publisher.publish_starting(name, fleet.config, waiting=True)
            await self.provisioner.let_go(fleet.all_slots())
            self.publisher.forget_gauges(fleet)

    def _record(self, endpoint: str, fleet: Fleet | None) -> None:
        """Record a table this gateway published, if it holds the endpoint's lease."""
        if self.leases.holds(endpoint) and (fleet is None or self.fleets.get(endpoint) is fleet):
            self.recorder.note(endpoint, fleet)

    def _demand(self, fleet: Fleet, variant: str, wanted: int) -> None:
        """A serverless variant's demand starts instances in a fleet run here; for a
        fleet another gateway runs, it is written for that gateway to act on."""
        if self.fleets.get(fleet.endpoint) is fleet:
            self.serverless.demand(fleet, variant, wanted)
        elif self.mirror.fleets.get(fleet.endpoint) is fleet:
            self.serverless_use.ask(fleet.endpoint, variant, wanted)

    def _fail_waiting(self, endpoint: str, variant: str, reason: str, began_by: float) -> None:
        """The holder's cold start of a serverless variant mirrored here failed: the
        requests here that began waiting for it by ``began_by`` are told so."""
        self.publisher.router.fail_waiting(
            endpoint, variant, lambda: start_failed(variant, reason), began_by
        )

    def _component_demand(self, fleet: Fleet, name: str) -> None:
        """A request waits for a component with no copy: ask the store for one (once;
        the request waits for it in the component's queue), as the serverless endpoints
        do for an instance."""
        ours = self.fleets.get(fleet.endpoint) is fleet
        mirrored = self.mirror.fleets.get(fleet.endpoint) is fleet  # the holder starts it
        if not (ours or mirrored) or name in self._from_zero:
            return
        self._from_zero.add(name)

        async def start() -> None:
            try:
                store = self.converger.components
                if await asyncio.to_thread(store.start_from_zero, name):
                    log.info("inference component %s: a request wakes it from zero", name)
                    self.wake()
            finally:
                self._from_zero.discard(name)

        task = asyncio.get_running_loop().create_task(start(), name=f"from-zero.{name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _mirror_loop(self) -> None:
        # announce_known made the first pass, before the gateway said it was ready.
        while True:
            await asyncio.sleep(self.routes_refresh_s)
            try:
                await self.mirror.refresh(self.store.list_endpoints)
            except Exception:
                log.exception("mirroring the routes of other gateways failed; retrying")
            routes = self.publisher.router.routes
            self.serverless_use.sample(self.mirror.fleets, routes)
            # Its own fleets' use too, where other gateways route to them: MaxConcurrency
            # counts every gateway's requests.
            self.serverless_use.sample(self.fleets, routes, shared_only=True)

    def _spawn(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"reconciler.{name}")
        self._tasks[name] = task

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.pop(name, None)
            self._deleting.discard(name)
            if not t.cancelled() and t.exception() is not None:
                log.error("converging %s failed", name, exc_info=t.exception())
            self._wake.set()

        task.add_done_callback(done)

    async def _supervise_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_check_period_s)
            for fleet in list(self.fleets.values()):
                if (
                    fleet.endpoint in self._tasks
                    or self.fleets.get(fleet.endpoint) is not fleet
                    or not self.leases.holds(fleet.endpoint)
                ):
                    # A converge step owns this fleet right now, has replaced it since
                    # this pass began, or it is retiring.
                    continue
                try:
                    if idle := self.serverless.reap_idle(fleet):
                        self.publisher.publish(fleet)
                        await self.provisioner.stop_slots(idle)
                    await self.supervisor.supervise(fleet)
                except Exception:
                    log.exception("supervising %s failed", fleet.endpoint)
            self.publisher.export_gauges(self.fleets.values())
