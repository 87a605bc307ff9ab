"""Shared routes: every gateway routes to the same instances, whoever runs the fleet.

The gateway holding an endpoint's lease (leases.py) runs its fleet; the others
send their requests to those instances and never start their own. So:

- the holder records a fleet's routes in the store each time it publishes them
  (``RouteRecorder``): per variant its weight, the instances up (id, address, health,
  concurrency) and how many are starting; nothing once it withdraws them;
- every other gateway reads them every ``refresh_s`` (``FleetMirror``), rebuilds the
  fleet's shape (slots without processes) and publishes it through the same
  RoutePublisher the holder uses, so both build their tables alike.

Both run in background loops: the data path never waits on the store. A mirror learns
a change up to ``refresh_s`` after the holder records it.

A gateway that mirrors a fleet cannot restart its instances. When none it knows can
take a request (they died with their holder, or are being replaced), the request waits
for the next table, from the holder or from the gateway that takes the lease over,
rather than being refused: a mirrored variant always counts an instance as coming.
Unreachable instances, marked down by the router, are pinged on every refresh and
taken back once they answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from shipyard.backends.base import InstanceSpec
from shipyard.background import Wakeup
from shipyard.control.publishing import RoutePublisher
from shipyard.errors import ShipyardError
from shipyard.provisioning.fleet import AdapterOf, ComponentCopies, Fleet, Slot, VariantTemplate
from shipyard.records import Endpoint, EndpointConfig, EndpointStatus
from shipyard.routing.instance import Instance
from shipyard.routing.table import EndpointRoute
from shipyard.storage.leases import ENDPOINT, Lease, LeaseStore
from shipyard.storage.metadata import MetadataStore

log = logging.getLogger(__name__)

_ROUTED = (EndpointStatus.CREATING, EndpointStatus.IN_SERVICE, EndpointStatus.UPDATING)
"""Statuses whose endpoints a mirror routes to, their fleet up or not yet. Creating too,
unlike the holder: a client that saw the endpoint InService through the holder may
invoke it here before this gateway has read its routes, and should wait, not be told
the endpoint does not exist."""


def routes_of(fleet: Fleet) -> dict[str, Any]:
    """What the holder records of ``fleet``: enough for another gateway to route to it."""
    return {
        "config": fleet.config.name,
        "host": socket.gethostname(),
        "variants": [
            {
                "name": name,
                "weight": fleet.weights.get(name),
                "starting": fleet.starting.get(name, 0),
                "prefix": fleet.templates[name].prefix if name in fleet.templates else None,
                "instances": [
                    {
                        "id": s.instance.instance_id,
                        "url": s.instance.url,
                        "healthy": s.instance.healthy,
                        "concurrency": s.instance.concurrency,
                        # Where the backend finds it again (an instance that outlives
                        # its gateway), for the gateway that takes the lease over.
                        "ref": getattr(s.handle, "ref", None),
                        # A component's copy: the instance it is placed on.
                        "host": _host(fleet, name, i),
                    }
                    for i, s in enumerate(slots)
                    if s.instance is not None
                ],
            }
            for name, slots in fleet.slots.items()
        ],
        # Per variant of components, its instances: with each copy's host, what
        # Fleet.healthy counts the variant's healthy instances from, here and there.
        "hosts": dict(fleet.hosts),
        # An endpoint of inference components: each component's copies are the slots
        # under its name, on the variant that hosts it; adapters run in their base's.
        "components": {
            name: {"variant": c.variant, "token": c.token} for name, c in fleet.components.items()
        },
        "adapters": {
            name: {"base": a.base, "src": a.src, "generation": a.generation}
            for name, a in fleet.adapters.items()
        },
    }


def _host(fleet: Fleet, name: str, index: int) -> int | None:
    placed = fleet.placement.get(name, [])
    return placed[index] if index < len(placed) else None


class RouteRecorder:
    """Writes the routes of the fleets this gateway holds to the store, latest first.

    ``note`` is called on the event loop each time a table is published; the writes
    happen in ``run``'s loop, one per endpoint whatever the number of notes since.
    """

    def __init__(self, *, leases: LeaseStore, period_s: float) -> None:
        self.leases = leases
        self.period_s = period_s
        self._pending: dict[str, dict[str, Any] | None] = {}
        self._written: dict[str, dict[str, Any] | None] = {}
        self._wake = Wakeup()

    def __repr__(self) -> str:
        return f"RouteRecorder(pending={sorted(self._pending)})"

    def note(self, endpoint: str, fleet: Fleet | None) -> None:
        """Record ``fleet``'s routes soon; None: the endpoint's table was withdrawn, or
        is waiting for a fleet."""
        self._pending[endpoint] = None if fleet is None else routes_of(fleet)
        self._wake.set()

    def forget(self, endpoint: str) -> None:
        """The lease is gone: what was written under it is no longer ours to repeat."""
        self._pending.pop(endpoint, None)
        self._written.pop(endpoint, None)

    async def run(self) -> None:
        self._wake.bind()
        while True:
            await self._wake.wait(self.period_s)
            await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        for endpoint, routes in pending.items():
            if endpoint in self._written and self._written[endpoint] == routes:
                continue
            try:
                await asyncio.to_thread(self.leases.record_routes, endpoint, routes)
            except Exception:
                log.exception("could not record the routes of %s; retrying", endpoint)
                self._pending.setdefault(endpoint, routes)
                continue
            self._written[endpoint] = routes


class FleetMirror:
    """Publishes the fleets other gateways hold, as they recorded them."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        leases: LeaseStore,
        publisher: RoutePublisher,
        holds: Callable[[str], bool],
        ping_timeout_s: float = 1.0,
    ) -> None:
        self.store = store
        self.leases = leases
        self.publisher = publisher
        self.holds = holds
        self.ping_timeout_s = ping_timeout_s
        self.fleets: dict[str, Fleet] = {}
        """The fleets mirrored now, by endpoint."""
        self._recorded: dict[str, dict[str, Any] | None] = {}
        self._tables: dict[str, EndpointRoute | None] = {}
        """Per endpoint, the table this mirror published last: another published since
        (its reconciler's, as it let the lease go) is replaced on the next pass."""
        self._configs: dict[str, EndpointConfig] = {}

    def __repr__(self) -> str:
        return f"FleetMirror(fleets={sorted(self.fleets)})"

    async def refresh(self, list_endpoints: Callable[[], list[Endpoint]]) -> None:
        """One pass: publish what changed in the routes recorded by other gateways.

        The endpoints are listed only when another gateway holds a lease, or did: a
        gateway alone on its store reads one row set per pass, and usually none.
        """
        leases = await asyncio.to_thread(self.leases.held_elsewhere, ENDPOINT)
        if not leases and not self._recorded:
            return
        endpoints = await asyncio.to_thread(list_endpoints)
        seen = set()
        for ep in endpoints:
            seen.add(ep.name)
            if self.holds(ep.name):
                self._let_go(ep.name)  # the reconciler publishes it now
                continue
            try:
                await self._follow(ep, leases.get(ep.name))
            except ShipyardError as exc:  # its config went meanwhile; the next pass sees
                log.info("cannot mirror %s yet: %s", ep.name, exc)
            except Exception:
                # Not published, so tried again next pass; the others go on meanwhile
                # (a store gone for a moment, routes recorded by another version).
                log.exception("cannot mirror %s; retrying", ep.name)
        for name in list(self._recorded):
            if name not in seen:
                self._let_go(name)
                self.publisher.withdraw(name)
        await self._recheck()

    async def _follow(self, ep: Endpoint, lease: Lease | None) -> None:
        if lease is None and ep.name in self.fleets:
            # The store has its lease as this gateway's, taken over from a holder that
            # died: the reconciler takes the fleet over (adopting its instances, where
            # they outlive their gateway), and its table serves until then.
            return
        routes = None if lease is None else lease.routes
        if routes is None and ep.status not in _ROUTED:
            if ep.name in self._recorded:
                self._let_go(ep.name)
                self.publisher.withdraw(ep.name)
            return
        ours = self.publisher.router.routes.get(ep.name) is self._tables.get(ep.name)
        if ours and ep.name in self._recorded and self._recorded[ep.name] == routes:
            return
        if routes is None:
            # Its holder is starting the fleet or has not recorded it yet: its requests
            # wait for the routes. Nobody holds it (given up for another to take, maybe
            # this gateway): they wait only if this gateway was routing it already.
            config = await self._config(ep.config_name)
            if self.holds(ep.name):
                return  # taken here meanwhile: the reconciler publishes it now
            self._drop(ep.name)
            held = lease is not None and lease.holder is not None
            self.publisher.publish_starting(ep.name, config, waiting=held)
        else:
            config = await self._config(routes["config"])
            if self.holds(ep.name):
                return
            fleet = self._rebuild(ep.name, config, routes)
            self.fleets[ep.name] = fleet
            self.publisher.publish(fleet)
        # Recorded once published: a pass that failed before (its config unread) leaves
        # the next pass to publish them.
        self._recorded[ep.name] = routes
        self._tables[ep.name] = self.publisher.router.routes.get(ep.name)

    def _rebuild(self, endpoint: str, config: EndpointConfig, routes: dict[str, Any]) -> Fleet:
        """The fleet as recorded, keeping the Instance of every instance already known:
        its connections, its count of requests in flight and what this gateway learned
        of its health."""
        old = self.fleets.get(endpoint)
        known = (
            {}
            if old is None
            else {
                (s.instance.instance_id, s.instance.url): s.instance
                for s in old.all_slots()
                if s.instance is not None
            }
        )
        fleet = Fleet(endpoint=endpoint, config=config, slots={}, weights={})
        hosted = routes.get("components") or {}
        variants = {v.name: v for v in config.variants}
        for name, hosting in hosted.items():
            if hosting["variant"] in variants:
                fleet.components[name] = ComponentCopies(
                    hosting["variant"], generation=0, token=hosting["token"]
                )
        for name, adapter in (routes.get("adapters") or {}).items():
            fleet.adapters[name] = AdapterOf(
                adapter["base"], adapter["src"], int(adapter["generation"])
            )
        fleet.hosts = {v: int(n) for v, n in (routes.get("hosts") or {}).items() if v in variants}
        for variant in routes["variants"]:
            name = variant["name"]
            spec = variants.get(name)
            if spec is None and name not in fleet.components:
                continue
            if spec is not None:
                fleet.weights[name] = (
                    spec.weight if variant["weight"] is None else float(variant["weight"])
                )
            fleet.templates[name] = VariantTemplate("", {}, None, prefix=variant["prefix"])
            # A component's copies are not always coming: at zero, its requests ask the
            # holder (through the store) for one, as they would on the holder.
            coming = int(variant["starting"])
            fleet.starting[name] = coming if name in fleet.components else max(coming, 1)
            fleet.slots[name] = []
            for recorded in variant["instances"]:
                if not _reachable(recorded["url"], routes.get("host")):
                    log.warning(
                        "instance %s of %s listens on %s, on host %s: not reachable from "
                        "here (gateways on several hosts need a backend whose instances "
                        "listen on their node's address, such as ray)",
                        recorded["id"],
                        endpoint,
                        recorded["url"],
                        routes.get("host"),
                    )
                    continue
                key = (recorded["id"], recorded["url"])
                instance = known.pop(key, None)
                if instance is None:
                    instance = Instance(
                        recorded["id"], name, recorded["url"], concurrency=recorded["concurrency"]
                    )
                if not recorded["healthy"]:
                    instance.healthy = False
                slot = Slot(spec=InstanceSpec(recorded["id"], ""), variant=name, instance=instance)
                fleet.slots[name].append(slot)
        fleet.placement = _placement(fleet, routes)
        for gone in known.values():
            gone.pool.close()
        return fleet

    async def _recheck(self) -> None:
        """Ping the instances the router found unreachable; republish those back up."""
        for endpoint, fleet in list(self.fleets.items()):
            down = [
                s.instance
                for s in fleet.all_slots()
                if s.instance is not None and not s.instance.healthy and self._up(endpoint, s)
            ]
            if not down:
                continue
            answers = await asyncio.gather(*(self._ping(i) for i in down))
            back = [i for i, ok in zip(down, answers, strict=True) if ok]
            for instance in back:
                instance.healthy = True
            if back and self.fleets.get(endpoint) is fleet and not self.holds(endpoint):
                self.publisher.publish(fleet)
                self._tables[endpoint] = self.publisher.router.routes.get(endpoint)

    def _up(self, endpoint: str, slot: Slot) -> bool:
        """Whether the holder last recorded the slot's instance healthy."""
        routes = self._recorded.get(endpoint) or {}
        for variant in routes.get("variants", ()):
            for recorded in variant["instances"]:
                if recorded["id"] == slot.spec.instance_id:
                    return bool(recorded["healthy"])
        return False

    async def _ping(self, instance: Instance) -> bool:
        try:
            async with asyncio.timeout(self.ping_timeout_s):
                response = await instance.pool.ping()
        except Exception:
            return False
        return response.status == 200

    async def _config(self, name: str) -> EndpointConfig:
        config = self._configs.get(name)
        if config is None:  # endpoint configs never change once created
            config = await asyncio.to_thread(self.store.get_endpoint_config, name)
            self._configs[name] = config
        return config

    def _drop(self, endpoint: str) -> None:
        fleet = self.fleets.pop(endpoint, None)
        if fleet is not None:
            for slot in fleet.all_slots():
                if slot.instance is not None:
                    slot.instance.pool.close()

    def _let_go(self, endpoint: str) -> None:
        """Stop mirroring ``endpoint``; its table stays until someone publishes another."""
        self._recorded.pop(endpoint, None)
        self._tables.pop(endpoint, None)
        self._drop(endpoint)

    def close(self) -> None:
        for endpoint in list(self.fleets):
            self._let_go(endpoint)


def _placement(fleet: Fleet, routes: dict[str, Any]) -> dict[str, list[int]]:
    """Per component of ``fleet``, the host of each of its slots as the holder recorded
    it (Fleet.healthy zips them), where every one is known: a holder of an earlier
    version records none."""
    recorded = {
        (variant["name"], instance["id"]): instance.get("host")
        for variant in routes["variants"]
        for instance in variant["instances"]
    }
    out: dict[str, list[int]] = {}
    for name in fleet.components:
        placed = [recorded.get((name, s.spec.instance_id)) for s in fleet.slots.get(name, [])]
        if all(host is not None for host in placed):
            out[name] = [int(host) for host in placed if host is not None]
    return out


def _reachable(url: str, host: str | None) -> bool:
    """Whether an instance's address can be reached from this host: a loopback address
    is only reachable on the host that recorded it."""
    address = urlsplit(url).hostname or ""
    try:
        loopback = address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = False
    return not loopback or host in (None, socket.gethostname())
