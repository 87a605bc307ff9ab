"""Route publishing: turns a fleet into the routing table the data path reads.

The only way instances reach the router: whenever a fleet changes (an instance comes up,
fails, restarts, is added or drained), its table is rebuilt whole and swapped in
(routing/router.py ``publish``). Instance gauges are exported from here too, since they
change exactly when the table does.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from shipyard.capture.config import capture_of
from shipyard.capture.writer import CaptureWriter
from shipyard.errors import InvalidParameter
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, Slot
from shipyard.records import EndpointConfig, VariantSpec
from shipyard.routing import priorities
from shipyard.routing.adapters import Adapter, AdapterDispatch, AdapterLoader
from shipyard.routing.instance import Instance
from shipyard.routing.multimodel import MultiModelDispatch
from shipyard.routing.policies import (
    LeastOutstandingRequests,
    Policy,
    WithinConcurrency,
    model_policy_for,
    policy_for,
)
from shipyard.routing.priorities import UNCONFIGURED, QueueRules
from shipyard.routing.router import Router
from shipyard.routing.serverless import ServerlessAdmission
from shipyard.routing.strategies import FromZero
from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)


class RoutePublisher:
    """Publishes fleets to the router and their instance counts to /metrics."""

    def __init__(
        self,
        *,
        router: Router,
        metrics: Metrics,
        max_in_flight: int,
        model_routing: str,
        serverless_slots: int = 1,
        capture: CaptureWriter | None = None,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.max_in_flight = max_in_flight
        self.model_routing = model_routing
        """The policy of multi-model variants: a name from routing.policies.MODEL_POLICIES."""
        self.serverless_slots = serverless_slots
        self.on_demand: Callable[[Fleet, str, int], None] = lambda fleet, variant, wanted: None
        """Where a serverless variant's demand for instances goes (the reconciler's
        ServerlessScaler)."""
        self.capture = capture
        """Where variants of configs with a DataCaptureConfig hand their records."""
        self.adapters = AdapterLoader()
        """The adapters registered in component copies (routing/adapters.py)."""
        self.on_component_demand: Callable[[Fleet, str], None] = lambda fleet, name: None
        """Where a request for a component with no copy goes (the reconciler starts one)."""
        self.on_change: Callable[[str, Fleet | None], None] = lambda endpoint, fleet: None
        """Told of every table published: the fleet, or None for a table withdrawn or
        waiting for its fleet (the reconciler records them for other gateways)."""
        self._blends: dict[str, tuple[Fleet, Fleet, float]] = {}
        """Per endpoint whose deployment runs: (old fleet, new fleet, new's share)."""

    def __repr__(self) -> str:
        return f"RoutePublisher(model_routing={self.model_routing!r})"

    def publish(self, fleet: Fleet) -> None:
        """Swap in the routing table of ``fleet``'s instances that are up (with the other
        fleet of its endpoint's deployment, while one runs: ``blend``)."""
        blend = self._blends.get(fleet.endpoint)
        if blend is not None and (fleet is blend[0] or fleet is blend[1]):
            old, new, share = blend
            self._publish([(old, 1.0 - share), (new, share)])
        else:
            self._publish([(fleet, 1.0)])
        self.export_gauges([fleet])
        self.on_change(fleet.endpoint, fleet)

    def blend(self, old: Fleet, new: Fleet, share: float) -> None:
        """Route ``share`` of the endpoint's traffic to ``new`` and the rest to ``old``
        (a deployment's step, control/deployments.py), until ``unblend``. Both fleets'
        variants keep their names, so their invocations count under the same
        EndpointName and VariantName."""
        self._blends[old.endpoint] = (old, new, share)
        self.publish(new)

    def unblend(self, fleet: Fleet) -> None:
        """End the endpoint's deployment with all its traffic on ``fleet``."""
        self._blends.pop(fleet.endpoint, None)
        self.publish(fleet)

    def _publish(self, shares: list[tuple[Fleet, float]]) -> None:
        variants = []
        for fleet, share in shares:
            variants.extend(self._variant_routes(fleet, share))
        fleet = shares[-1][0]
        self.router.publish(
            EndpointRoute(
                fleet.endpoint,
                variants,
                async_config=fleet.config.async_config,
                components=self._component_routes(fleet) if fleet.config.hosts_components else None,
            )
        )

    def _variant_routes(self, fleet: Fleet, share: float) -> list[VariantRoute]:
        variants = []
        captured = capture_of(fleet.config) if self.capture is not None else None
        for variant in fleet.config.variants:
            instances = [s.instance for s in fleet.slots[variant.name] if s.instance is not None]
            serverless = self._serverless_route(fleet, variant)
            rules = _rules(fleet, variant.name)
            policy = (
                LeastOutstandingRequests(max_in_flight=self.serverless_slots)
                if serverless is not None
                else self._policy(variant, rules)
            )
            variants.append(
                VariantRoute(
                    variant.name,
                    weight=fleet.weights.get(variant.name, variant.weight) * share,
                    policy=policy,
                    instances=instances,
                    metrics=self.metrics.for_variant(fleet.endpoint, variant.name),
                    capture=None
                    if self.capture is None
                    else self.capture.for_variant(fleet.endpoint, variant.name, captured),
                    dispatch=self._model_route(fleet, variant.name, instances),
                    admission=serverless,
                    coming=fleet.starting.get(variant.name, 0),
                    shadow=variant.shadow,
                    rules=rules,
                )
            )
        return variants

    def _policy(self, variant: VariantSpec, rules: QueueRules) -> Policy:
        """The variant's routing policy; with a priority queue, requests wait at the
        gateway whatever its RoutingStrategy (WithinConcurrency)."""
        if rules.configured:
            return WithinConcurrency(max_in_flight=self.max_in_flight)
        return policy_for(variant.routing_strategy, max_in_flight=self.max_in_flight)

    def _component_routes(self, fleet: Fleet) -> list[VariantRoute]:
        """One route per inference component: its copies, under its variant's policy."""
        variants = {v.name: v for v in fleet.config.variants}
        routes = {
            name: self._component_route(fleet, variants[copies.variant], name, name)
            for name, copies in fleet.components.items()
        }
        for name, adapter in fleet.adapters.items():
            base = fleet.components.get(adapter.base)
            if base is None:
                continue
            route = self._component_route(fleet, variants[base.variant], name, adapter.base)
            route.dispatch = AdapterDispatch(
                route.policy,
                adapter=Adapter(name, adapter.src, adapter.generation, base.token),
                loader=self.adapters,
            )
            # One queue for the base and its adapters: they share the copies, so a copy
            # freed by a request of either serves the next waiting request of any.
            route.waiters = routes[adapter.base].waiters
            routes[name] = route
        return list(routes.values())

    def _component_route(
        self, fleet: Fleet, variant: VariantSpec, name: str, copies_of: str
    ) -> VariantRoute:
        """The route of component ``name``, to the copies of ``copies_of`` (itself, or
        for an adapter its base)."""
        rules = _rules(fleet, copies_of)
        return VariantRoute(
            variant.name,
            weight=0.0,
            policy=self._policy(variant, rules),
            rules=rules,
            instances=[s.instance for s in fleet.slots[copies_of] if s.instance is not None],
            metrics=self.metrics.for_variant(fleet.endpoint, name),
            capture=None
            if self.capture is None
            else self.capture.for_variant(fleet.endpoint, variant.name, capture_of(fleet.config)),
            coming=fleet.starting.get(copies_of, 0),
            component=name,
            admission=FromZero(partial(self.on_component_demand, fleet, copies_of)),
        )

    def publish_starting(
        self, endpoint: str, config: EndpointConfig, *, waiting: bool = False
    ) -> None:
        """A table with every variant of ``config`` and no instance yet: requests get
        ModelNotReady (429, which clients retry) until the fleet is published.

        Unless ``waiting``, or this gateway was routing the endpoint to instances
        already (a fleet taken over from a gateway that died, or given up by it): then
        the instances are counted as coming and requests wait for the fleet, as they
        would for a scale-out, instead of being refused for the seconds it takes.
        """
        current = self.router.routes.get(endpoint)
        serving = waiting or (
            current is not None and any(v.instances or v.coming for v in current.variants)
        )
        variants = [
            VariantRoute(
                v.name,
                weight=v.weight,
                policy=policy_for(v.routing_strategy, max_in_flight=self.max_in_flight),
                instances=[],
                metrics=self.metrics.for_variant(endpoint, v.name),
                coming=max(v.instance_count, 1) if serving else 0,
                shadow=v.shadow,
            )
            for v in config.variants
        ]
        self.router.publish(
            EndpointRoute(
                endpoint,
                variants,
                async_config=config.async_config,
                components=[] if config.hosts_components else None,
            )
        )
        self.on_change(endpoint, None)

    def _serverless_route(self, fleet: Fleet, variant: VariantSpec) -> ServerlessAdmission | None:
        """The variant's admission and demand, made once per fleet and kept across its
        tables, so the count of requests admitted survives every republish."""
        if variant.serverless is None:
            return None
        route = fleet.serverless.get(variant.name)
        if route is None:
            name = variant.name
            route = ServerlessAdmission(
                name,
                variant.serverless,
                slots=self.serverless_slots,
                demand=lambda wanted: self.on_demand(fleet, name, wanted),
            )
            fleet.serverless[name] = route
        return route

    def withdraw(self, endpoint: str) -> None:
        """Take the endpoint out of routing: requests to it fail from now on."""
        self._blends.pop(endpoint, None)
        self.router.withdraw(endpoint)
        self.on_change(endpoint, None)

    def _model_route(
        self, fleet: Fleet, variant: str, instances: list[Instance]
    ) -> MultiModelDispatch | None:
        """Set for a variant serving a MultiModel model: its requests then need a TargetModel."""
        template = fleet.templates.get(variant)
        if template is None or template.prefix is None:
            return None
        return MultiModelDispatch(
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

    def export_gauges(self, fleets: Iterable[Fleet]) -> None:
        gauge = self.metrics.instances
        for fleet in fleets:
            healthy = fleet.healthy()
            for variant, slots in fleet.slots.items():
                # A variant of inference components counts its instances, not processes.
                total = fleet.hosts.get(variant, len(slots))
                up = healthy.get(variant, 0)
                gauge.labels(fleet.endpoint, variant, "healthy").set(up)
                gauge.labels(fleet.endpoint, variant, "unhealthy").set(total - up)

    def forget_gauges(self, fleet: Fleet) -> None:
        """Drop every series of a fleet that is gone."""
        for variant in fleet.slots:
            for state in ("healthy", "unhealthy"):
                with contextlib.suppress(KeyError):
                    self.metrics.instances.remove(fleet.endpoint, variant, state)
        self.forget_model_series(fleet, fleet.all_slots())

    def forget_model_series(self, fleet: Fleet, slots: Sequence[Slot]) -> None:
        """Drop the multi-model series of instances that are gone."""
        for slot in slots:
            template = fleet.templates.get(slot.variant)
            if template is not None and template.prefix is not None:
                self.metrics.forget_instance_models(
                    fleet.endpoint, slot.variant, slot.spec.instance_id
                )


def _rules(fleet: Fleet, name: str) -> QueueRules:
    """The priority-queue rules the model of variant (or component) ``name`` sets; one
    line as before where it sets none, or where its rules cannot be read (checked when
    the model was created: only a container's own Environment can hold such a value)."""
    template = fleet.templates.get(name)
    if template is None:
        return UNCONFIGURED
    try:
        return priorities.queue_rules(template.environment)
    except InvalidParameter as exc:
        log.warning("variant %s of endpoint %s: %s", name, fleet.endpoint, exc.message)
        return UNCONFIGURED
