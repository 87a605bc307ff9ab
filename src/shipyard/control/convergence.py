"""Endpoint convergence: the steps that bring one endpoint's fleet to what the store says.

Each step runs alone for its endpoint (the Reconciler starts at most one at a time per
endpoint) and ends by recording the outcome in the store:

- create: start every instance, publish, then InService (Failed, with the reason, if
  any instance cannot start);
- update to a new endpoint config: blue/green, the new fleet is started beside the old
  one, swapped in once healthy, and the old one drained; a failed update leaves the old
  fleet serving;
- rescale (new weights or instance counts): instances removed drain first, new ones
  take traffic once healthy;
- delete and retire: out of routing first, then drained and stopped;
- components (an endpoint of inference components): copies placed on the variant's
  instances (control/placement.py), started, stopped or replaced to match each
  component's copy count and specification, and each component's status recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Any

from shipyard.backends.base import Resources
from shipyard.control.deployments import Deployer, deploys, retain
from shipyard.control.placement import Demand, place
from shipyard.control.publishing import RoutePublisher
from shipyard.control.serverless import ServerlessScaler
from shipyard.errors import FleetFailed, ShipyardError
from shipyard.provisioning.fleet import AdapterOf, ComponentCopies, Fleet, Provisioner, Slot
from shipyard.records import (
    SHORT_OF_CAPACITY,
    ComponentStatus,
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    InferenceComponent,
    ServedSpec,
    VariantSpec,
    VariantState,
)
from shipyard.routing.adapters import Adapter
from shipyard.storage.components import ComponentStore
from shipyard.storage.metadata import MetadataStore

log = logging.getLogger(__name__)


class Converger:
    """Creates, updates, rescales and retires fleets; ``fleets`` is the actual state."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        provisioner: Provisioner,
        publisher: RoutePublisher,
        fleets: dict[str, Fleet],
        serverless: ServerlessScaler,
        components: ComponentStore | None = None,
    ) -> None:
        self.store = store
        self.components = components or ComponentStore.of(store)
        self._placed: dict[str, tuple[Any, ...]] = {}
        """Per endpoint of components: what its last component step was asked (the
        components' rows and the desired instance counts). Until that changes, what the
        step could not reach (copies that fit nowhere, a copy that fails to start) is
        not tried again on every pass."""
        self._failed_specs: dict[str, int] = {}
        """Per inference component, the generation of a specification whose copies
        failed to start: not tried again until the specification changes (recording the
        failure changes the component, which would otherwise ask for another step)."""
        self.provisioner = provisioner
        self.publisher = publisher
        self.fleets = fleets
        self.serverless = serverless
        self.deployer = Deployer(
            store=store,
            provisioner=provisioner,
            publisher=publisher,
            scale_out=self._scale_out,
            change=self._change,
        )

    def __repr__(self) -> str:
        return f"Converger(fleets={sorted(self.fleets)})"

    async def create(
        self, ep: Endpoint, *, taken: dict[str, Any] | None = None, record_failure: bool = True
    ) -> None:
        """``taken``: what the endpoint's previous lease holder recorded of its fleet,
        when this gateway took the lease over from it (Provisioner.launch adopts it).
        ``record_failure``: a fleet that cannot start fails the endpoint (else it is only
        logged, and the caller judges)."""
        try:
            config = await asyncio.to_thread(self.store.get_endpoint_config, ep.config_name)
            adopting = bool(taken) and self.provisioner.adopts
            if ep.status is EndpointStatus.IN_SERVICE and not adopting:
                # A gateway restart: the endpoint exists for its clients, who should hear
                # "not ready yet, retry" (429) until its instances are up, not "not found".
                self.publisher.publish_starting(ep.name, config)
            counts = {v.name: v.desired_instance_count for v in ep.variants}
            trial = ep.status is EndpointStatus.CREATING
            counts |= self._serverless_counts(config, trial=trial)
            weights = {v.name: v.desired_weight for v in ep.variants}
            fleet = await self.provisioner.launch(
                ep.name, config, counts, weights, take_over=taken or {}
            )
        except (FleetFailed, ShipyardError) as exc:
            log.warning("endpoint %s failed: %s", ep.name, exc)
            if ep.name not in self.fleets:
                self.publisher.withdraw(ep.name)
            if record_failure:
                await self._change(ep.name, status=EndpointStatus.FAILED, failure_reason=str(exc))
            return
        self.fleets[ep.name] = fleet
        self._placed.pop(ep.name, None)
        self.publisher.publish(fleet)
        if ep.status is EndpointStatus.CREATING:
            await self._change(
                ep.name, expect=[EndpointStatus.CREATING], status=EndpointStatus.IN_SERVICE
            )

    async def update(self, ep: Endpoint, *, taken: dict[str, Any] | None = None) -> None:
        if ep.pending_config_name is None:
            await self.rescale(ep, taken=taken)
            return
        if ep.deployment is not None and self._deploys(ep.deployment):
            await self._deploy(ep, taken=taken)
            return
        await self._replace(ep, taken=taken)

    async def _replace(self, ep: Endpoint, *, taken: dict[str, Any] | None, **also: Any) -> None:
        """An update without a deployment: the new config's fleet is started beside the
        old one and takes its place once it answers. ``also``: more changes recorded
        with the outcome."""
        assert ep.pending_config_name is not None
        try:
            config = await asyncio.to_thread(self.store.get_endpoint_config, ep.pending_config_name)
            config = retain(config, ep.retained)
            counts = {v.name: v.instance_count for v in config.variants}
            counts |= self._serverless_counts(config, trial=True)
            weights = {v.name: v.weight for v in config.variants}
            # Taken over mid-update: what the previous holder ran is of the old config,
            # and stopped; the new one starts afresh.
            taken = None if ep.name in self.fleets else (taken or {})
            fleet = await self.provisioner.launch(
                ep.name, config, counts, weights, adoptable=True, take_over=taken
            )
        except (FleetFailed, ShipyardError) as exc:
            log.warning("update of endpoint %s failed, keeping its fleet: %s", ep.name, exc)
            # Blue/green: the old fleet never stopped serving, so a failed update rolls
            # back by simply not swapping.
            await self._change(
                ep.name,
                status=EndpointStatus.IN_SERVICE
                if ep.name in self.fleets
                else EndpointStatus.FAILED,
                pending_config_name=None,
                retained=None,
                failure_reason=f"Update to endpoint configuration "
                f"{self.store.shown_config_name(ep.pending_config_name)} failed, the endpoint "
                f"keeps its previous configuration: {exc}",
                **also,
            )
            return
        old = self.fleets.get(ep.name)
        if old is not None:
            _hand_over_components(old, fleet)
        self._placed.pop(ep.name, None)
        self.fleets[ep.name] = fleet
        self.publisher.publish(fleet)
        await self._change(
            ep.name,
            status=EndpointStatus.IN_SERVICE,
            config_name=config.name,
            pending_config_name=None,
            retained=None,
            failure_reason=None,
            variants=tuple(
                VariantState(v.name, v.weight, v.instance_count, v.shadow) for v in config.variants
            ),
            **also,
        )
        if old is not None:
            await self.provisioner.drain_and_stop(old.all_slots())
            self.publisher.forget_model_series(old, old.all_slots())

    async def finish_rollback(self, ep: Endpoint, *, taken: dict[str, Any] | None) -> None:
        """A rollback cut short (the gateway stopped while it ran): the endpoint's config
        is the old one, started again here if need be, and the rollback is recorded as
        Deployer._rolled_back records it (Deployer.ended)."""
        if ep.name not in self.fleets:
            await self.create(ep, taken=taken)
            if ep.name not in self.fleets:
                return  # the old config cannot start: create recorded why
        pending = ep.pending_config_name
        reason = (
            f"Update to endpoint configuration {self.store.shown_config_name(pending or '')} "
            "was rolled back; the gateway stopped during the rollback, which it completed "
            "on starting again."
        )
        await self.deployer.ended(ep, pending or "", "RolledBack", reason)

    @staticmethod
    def _deploys(deployment: dict[str, Any]) -> bool:
        return deploys(deployment.get("config") or {})

    async def _deploy(self, ep: Endpoint, *, taken: dict[str, Any] | None) -> None:
        """An update with a DeploymentConfig (control/deployments.py): the old fleet
        serves throughout (started again first after a gateway restart); the new one
        takes over step by step, or is stopped again on a rollback."""
        assert ep.pending_config_name is not None
        old = self.fleets.get(ep.name)
        if old is None:
            await self.create(ep, taken=taken, record_failure=False)
            old = self.fleets.get(ep.name)
            if old is None:
                # The old config cannot start (the endpoint had failed): no fleet serves to
                # be kept safe step by step, so the new config is deployed at once.
                await self._replace(ep, taken=taken, deployment=None)
                return
        try:
            config = await asyncio.to_thread(self.store.get_endpoint_config, ep.pending_config_name)
            config = retain(config, ep.retained)
            new = await self.deployer.run(ep, config, old)
        except (FleetFailed, ShipyardError) as exc:
            log.warning("deployment of %s failed, keeping its fleet: %s", ep.name, exc)
            self.publisher.unblend(old)
            reason = (
                f"Update to endpoint configuration "
                f"{self.store.shown_config_name(ep.pending_config_name)} failed, the "
                f"endpoint keeps its previous configuration: {exc}"
            )
            await self.deployer.ended(ep, ep.pending_config_name, "Failed", reason)
            return
        if new is None:
            return  # rolled back: the old fleet serves, the endpoint says why
        self._placed.pop(ep.name, None)
        self.fleets[ep.name] = new
        also = self.deployer.recording(ep, config.name, "Completed")
        await self._change(
            ep.name,
            status=EndpointStatus.IN_SERVICE,
            config_name=config.name,
            pending_config_name=None,
            retained=None,
            deployment=None,
            failure_reason=None,
            also=also,
            variants=tuple(
                VariantState(v.name, v.weight, v.instance_count, v.shadow) for v in config.variants
            ),
        )
        if self.deployer.notify:
            self.deployer.on_event()
        await self.provisioner.drain_and_stop(old.all_slots())
        self.publisher.forget_model_series(old, old.all_slots())

    async def rescale(self, ep: Endpoint, *, taken: dict[str, Any] | None = None) -> None:
        fleet = self.fleets.get(ep.name)
        if fleet is None:
            await self.create(ep, taken=taken)
            if ep.name not in self.fleets:
                return
            fleet = self.fleets[ep.name]
        serverless = {v.name for v in fleet.config.variants if v.serverless is not None}
        hosting = {v.name for v in fleet.config.variants if v.hosts_components}
        for state in ep.variants:
            fleet.weights[state.name] = state.desired_weight
            if state.name in serverless:
                continue  # its instances follow its requests, not a count
            if state.name in hosting:
                continue  # its instances are capacity for copies: placed by the next pass
            slots = fleet.slots[state.name]
            extra = slots[state.desired_instance_count :]
            if extra:
                del slots[state.desired_instance_count :]
                self.publisher.publish(fleet)
                await self.provisioner.drain_and_stop(extra)
                self.publisher.forget_model_series(fleet, extra)
            missing = state.desired_instance_count - len(slots)
            if missing > 0:
                try:
                    await self._scale_out(ep.name, fleet, state.name, missing)
                except FleetFailed as exc:
                    await self._change(
                        ep.name,
                        status=EndpointStatus.IN_SERVICE,
                        failure_reason=f"Scaling variant {state.name} failed: {exc}",
                    )
                    return
        self.publisher.publish(fleet)
        await self._change(ep.name, status=EndpointStatus.IN_SERVICE, failure_reason=None)

    async def _scale_out(self, endpoint: str, fleet: Fleet, variant: str, count: int) -> None:
        """Start ``count`` more instances of ``variant``; each takes traffic once healthy.

        While they start, the routing table counts them as capacity coming, so requests
        that find the running instances full wait for them rather than being refused.
        All or nothing: if one fails to start, every new one is stopped again.
        """
        slots = fleet.slots[variant]
        new = [self.provisioner.new_slot(endpoint, fleet, variant) for _ in range(count)]

        async def start(slot: Slot) -> None:
            await self.provisioner.start_slot(slot)
            fleet.starting[variant] -= 1
            slots.append(slot)
            self.publisher.publish(fleet)

        fleet.starting[variant] = count
        self.publisher.publish(fleet)
        try:
            outcomes = await asyncio.gather(*(start(s) for s in new), return_exceptions=True)
        finally:
            fleet.starting.pop(variant, None)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is None:
            return
        slots[:] = [s for s in slots if s not in new]
        self.publisher.publish(fleet)
        await self.provisioner.drain_and_stop(new)
        raise failed

    def _serverless_counts(self, config: EndpointConfig, *, trial: bool) -> dict[str, int]:
        return {
            v.name: self.serverless.initial_instances(v, trial=trial)
            for v in config.variants
            if v.serverless is not None
        }

    async def delete(self, ep: Endpoint) -> None:
        await self.retire(ep.name)
        for component in await asyncio.to_thread(self.components.list, ep.name):
            await asyncio.to_thread(self.components.delete, component.name)
        with contextlib.suppress(ShipyardError):
            await asyncio.to_thread(self.store.delete_endpoint, ep.name)

    # -- inference components -----------------------------------------------------------

    def components_settled(
        self, ep: Endpoint, fleet: Fleet, components: list[InferenceComponent]
    ) -> bool:
        """Whether ``fleet`` runs what ``components`` ask for, or a step was already
        asked exactly this, so no step is needed."""
        if self._placed.get(ep.name) == _asked(ep, components):
            return True
        for c in components:
            if c.status in (ComponentStatus.CREATING, ComponentStatus.UPDATING):
                return False
            if c.status is ComponentStatus.DELETING:
                return False
            if c.status is ComponentStatus.FAILED:
                continue
            if c.spec.base is not None:
                adapter = fleet.adapters.get(c.name)
                if adapter is None or adapter.generation != c.generation:
                    return False
                continue
            running = fleet.components.get(c.name)
            if running is None:
                return False
            respecify = running.generation != c.generation and not self._given_up(c)
            if respecify or len(fleet.slots[c.name]) != c.copies:
                return False
        return True

    def _given_up(self, c: InferenceComponent) -> bool:
        """Whether ``c``'s specification is one whose copies failed to start."""
        return self._failed_specs.get(c.name) == c.generation

    async def place_components(self, ep: Endpoint, components: list[InferenceComponent]) -> None:
        """Bring the copies of ``ep``'s components to what the store asks, placing them
        on its variants' instances, and record each component's status."""
        fleet = self.fleets.get(ep.name)
        if fleet is None:
            return
        self._placed[ep.name] = _asked(ep, components)
        for c in components:
            if c.status is ComponentStatus.DELETING:
                await self._remove_component(fleet, c)
        live = [
            c
            for c in components
            if c.status not in (ComponentStatus.DELETING, ComponentStatus.FAILED)
        ]
        counts = {v.name: v.desired_instance_count for v in ep.variants}
        for variant in fleet.config.variants:
            if not variant.hosts_components:
                continue
            hosted = [c for c in live if c.variant == variant.name and c.spec.base is None]
            least, most = variant.managed_scaling or (counts.get(variant.name, 0),) * 2
            plan = place(
                variant.instance_type,
                [
                    Demand(c.name, c.copies, r.cpus, r.min_memory_mb)
                    for c in hosted
                    if (r := c.spec.requirements) is not None
                ],
                least=least,
                most=most,
                keep_all=variant.managed_scaling is None,
            )
            fleet.hosts[variant.name] = plan.hosts
            fleet.placement.update(plan.placed)
            for c in hosted:
                await self._converge_component(
                    fleet, variant, c, plan.copies(c.name), plan.short.get(c.name, 0)
                )
        by_name = {c.name: c for c in components}
        for c in live:
            if c.spec.base is not None:
                await self._converge_adapter(fleet, c, by_name.get(c.spec.base))
        self.publisher.publish(fleet)

    async def _converge_adapter(
        self, fleet: Fleet, c: InferenceComponent, base: InferenceComponent | None
    ) -> None:
        """An adapter serves once its base has copies (or is at zero copies, which a
        request for the adapter brings back); each copy loads it before its first
        request for it (routing/adapters.py)."""
        assert c.spec.base is not None
        if base is None or base.status in (ComponentStatus.DELETING, ComponentStatus.FAILED):
            fleet.adapters.pop(c.name, None)
            state = "gone" if base is None else base.status.value
            await self._component_status(
                c,
                ComponentStatus.FAILED,
                f"Its base inference component {c.spec.base} is {state}.",
            )
            return
        if c.spec.base not in fleet.components or base.status is ComponentStatus.CREATING:
            await self._component_status(
                c,
                c.status,
                f"Waiting for its base inference component {c.spec.base} to be placed.",
            )
            return
        adapter = AdapterOf(c.spec.base, c.spec.artifact_url or "", c.generation)
        # InService once loaded in the copies its base runs now, and routed; copies
        # started later load it before their first request for it.
        copies = [s.instance for s in fleet.slots.get(c.spec.base, []) if s.instance]
        loaded = Adapter(c.name, adapter.src, c.generation, fleet.components[c.spec.base].token)
        failure = await self.publisher.adapters.load_all(copies, loaded)
        if failure is not None:
            log.warning("adapter %s failed to load: %s", c.name, failure)
            previous = fleet.adapters.get(c.name)
            if previous is not None:  # an update: the previous artifact serves on
                reason = (
                    f"Updating inference component {c.name} failed, it keeps its previous "
                    f"adapter: {failure}"
                )
                generation = await self._roll_back(c, previous.generation, reason)
                if generation is not None:
                    # Copies that loaded the failed artifact load the previous one again.
                    fleet.adapters[c.name] = AdapterOf(previous.base, previous.src, generation)
                    self.publisher.publish(fleet)
            else:
                await self._component_status(c, ComponentStatus.FAILED, failure)
            return
        fleet.adapters[c.name] = adapter
        self.publisher.publish(fleet)
        await self._component_status(c, ComponentStatus.IN_SERVICE, served=True)

    async def _converge_component(
        self,
        fleet: Fleet,
        variant: VariantSpec,
        c: InferenceComponent,
        fit: int,
        short: int,
    ) -> None:
        running = fleet.components.get(c.name)
        try:
            if running is None or running.generation != c.generation:
                if self._given_up(c):
                    if running is not None:  # the previous copies serve on, as many as asked
                        await self._scale_copies(fleet, c, fit)
                    return
                await self._respecify(fleet, variant, c, fit)
            else:
                await self._scale_copies(fleet, c, fit)
        except (FleetFailed, ShipyardError) as exc:
            log.warning("inference component %s failed: %s", c.name, exc)
            if c.status is ComponentStatus.CREATING:
                await self._component_status(c, ComponentStatus.FAILED, str(exc))
                return
            reason = (
                f"Updating inference component {c.name} failed, it keeps its previous copies: {exc}"
            )
            previous = fleet.components.get(c.name)
            if previous is None:
                await self._component_status(c, ComponentStatus.IN_SERVICE, reason)
                return
            generation = await self._roll_back(c, previous.generation, reason)
            if generation is not None:
                fleet.components[c.name] = replace(previous, generation=generation)
                self._failed_specs.pop(c.name, None)
            return
        if short:
            size = variant.instance_type
            limit = (
                f"up to its MaxInstanceCount ({variant.managed_scaling[1]})"
                if variant.managed_scaling
                else f"its {fleet.hosts[variant.name]}"
            )
            await self._component_status(
                c,
                c.status,
                f"{SHORT_OF_CAPACITY}: {short} of the {c.copies} copies of inference "
                f"component {c.name} fit on none of variant {variant.name}'s instances "
                f"({limit} {size}); free room or raise the instance count.",
            )
            return
        await self._component_status(c, ComponentStatus.IN_SERVICE, served=True)

    async def _respecify(
        self, fleet: Fleet, variant: VariantSpec, c: InferenceComponent, fit: int
    ) -> None:
        """Start ``fit`` copies of the component's current specification; once all
        answer, they replace the copies of the previous one, which drain first."""
        template = await self.provisioner.component_template(c)
        needs = c.spec.requirements
        resources = (
            None if needs is None else Resources(needs.cpus or 0.0, needs.min_memory_mb << 20)
        )
        old = fleet.slots.get(c.name, [])
        old_template, old_copies = fleet.templates.get(c.name), fleet.components.get(c.name)
        fleet.templates[c.name] = template
        fleet.components[c.name] = ComponentCopies(
            variant.name,
            c.generation,
            resources,
            token=template.adapters_token or "",
        )
        new = [self.provisioner.new_slot(fleet.endpoint, fleet, c.name) for _ in range(fit)]
        fleet.slots[c.name] = list(old)
        # Requests for the component wait for these copies meanwhile, rather than failing.
        fleet.starting[c.name] = len(new)
        self.publisher.publish(fleet)
        try:
            outcomes = await asyncio.gather(
                *(self.provisioner.start_slot(s) for s in new), return_exceptions=True
            )
        finally:
            fleet.starting.pop(c.name, None)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            self._failed_specs[c.name] = c.generation
            await self.provisioner.stop_slots(new)
            # The previous copies, if any, go on serving; the failure is recorded and the
            # specification not tried again until it changes.
            if not old:
                fleet.slots.pop(c.name, None)
                fleet.components.pop(c.name, None)
                fleet.templates.pop(c.name, None)
            elif old_template is not None and old_copies is not None:
                # The previous copies restart, should they fail, as what they are.
                fleet.templates[c.name], fleet.components[c.name] = old_template, old_copies
            raise failed
        self._failed_specs.pop(c.name, None)
        fleet.slots[c.name] = new
        self.publisher.publish(fleet)
        if old:
            await self.provisioner.drain_and_stop(old)

    async def _scale_copies(self, fleet: Fleet, c: InferenceComponent, fit: int) -> None:
        slots = fleet.slots[c.name]
        extra = slots[fit:]
        if extra:
            del slots[fit:]
            self.publisher.publish(fleet)
            await self.provisioner.drain_and_stop(extra)
        missing = fit - len(slots)
        if missing > 0:
            await self._scale_out(fleet.endpoint, fleet, c.name, missing)

    async def _remove_component(self, fleet: Fleet, c: InferenceComponent) -> None:
        self._failed_specs.pop(c.name, None)
        slots = fleet.slots.pop(c.name, [])
        fleet.placement.pop(c.name, None)
        fleet.components.pop(c.name, None)
        fleet.templates.pop(c.name, None)
        adapter = fleet.adapters.pop(c.name, None)
        self.publisher.publish(fleet)
        await self.provisioner.drain_and_stop(slots)
        if c.spec.base is not None:
            # One that failed to load is forgotten too: a component made again under
            # the name is loaded afresh.
            for slot in fleet.slots.get(c.spec.base, []):
                if slot.instance is not None:
                    slot.instance.adapter_refusals.pop(c.name, None)
        base = fleet.components.get(adapter.base) if adapter is not None else None
        if adapter is not None and base is not None:
            copies = [s.instance for s in fleet.slots.get(adapter.base, []) if s.instance]
            dropped = Adapter(c.name, adapter.src, adapter.generation, base.token)
            await self.publisher.adapters.unregister(copies, dropped)
        await asyncio.to_thread(self.components.delete, c.name)

    async def _component_status(
        self,
        c: InferenceComponent,
        status: ComponentStatus,
        reason: str | None = None,
        *,
        served: bool = False,
    ) -> None:
        """Record what the step reached, unless the component changed meanwhile (a new
        copy count or specification: the next step judges that). ``served``: its copies
        run its current specification, which is recorded as the one to roll back to."""
        changes: dict[str, Any] = {}
        if served and (c.served is None or c.served.generation != c.generation):
            changes["served"] = ServedSpec(c.spec, c.raw, c.generation)
        if status is c.status and reason == c.failure_reason and not changes:
            return
        await asyncio.to_thread(
            self.components.change,
            c.name,
            unchanged_since=c.modified,
            status=status,
            failure_reason=reason,
            **changes,
        )

    async def _roll_back(self, c: InferenceComponent, running: int, reason: str) -> int | None:
        """An update whose copies failed to start: ``c`` back to the specification its
        running copies (of generation ``running``) serve, InService with ``reason``, so
        that Describe shows what serves. Under a generation of its own, as specifications
        only move forward (the failed one sent again is tried again). The new generation,
        or None where nothing is rolled back: the copies failed at ``c``'s own
        generation (scaled, not respecified), the specification they run is not known (a
        store from before it was kept), or ``c`` changed meanwhile; then only the status
        and reason are recorded."""
        served = c.served
        if running == c.generation or served is None or served.generation != running:
            await self._component_status(c, ComponentStatus.IN_SERVICE, reason)
            return None
        generation = c.generation + 1
        back = await asyncio.to_thread(
            self.components.change,
            c.name,
            unchanged_since=c.modified,
            spec=served.spec,
            raw=served.raw,
            generation=generation,
            served=replace(served, generation=generation),
            status=ComponentStatus.IN_SERVICE,
            failure_reason=reason,
        )
        return generation if back else None

    async def retire(self, name: str) -> None:
        """Out of routing, then drained and stopped: the endpoint's fleet is gone."""
        self.publisher.withdraw(name)
        fleet = self.fleets.pop(name, None)
        if fleet is not None:
            await self.provisioner.drain_and_stop(fleet.all_slots())
            self.publisher.forget_gauges(fleet)
        await self.provisioner.sweep(name)

    async def _change(self, name: str, **changes: Any) -> None:
        try:
            await asyncio.to_thread(self.store.change_endpoint, name, **changes)
        except ShipyardError as exc:
            # The user moved the endpoint meanwhile (deleted it, say); the next pass sees it.
            log.info("endpoint %s changed underneath a converge step: %s", name, exc)


def _hand_over_components(old: Fleet, new: Fleet) -> None:
    """An endpoint of components moves to a new config: the copies running go with it
    (they are processes of their own, not of the old config's instances), so they serve
    on without a gap; the next converge pass places them on the new config's instances,
    stopping those that no longer fit."""
    for name, copies in list(old.components.items()):
        if copies.variant not in new.slots:
            continue  # its variant is gone: its copies stop with the old fleet
        new.components[name] = old.components.pop(name)
        new.slots[name] = old.slots.pop(name, [])
        new.templates[name] = old.templates.pop(name)
        new.placement[name] = old.placement.pop(name, [])
    for name, adapter in list(old.adapters.items()):
        if adapter.base in new.components:
            new.adapters[name] = old.adapters.pop(name)


def _asked(ep: Endpoint, components: list[InferenceComponent]) -> tuple[Any, ...]:
    return (
        tuple((c.name, c.modified) for c in components),
        tuple((v.name, v.desired_instance_count) for v in ep.variants),
    )
