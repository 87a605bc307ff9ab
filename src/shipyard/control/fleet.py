"""Fleets and their instances: start one, wait for its first ``/ping``, drain and stop.

The Provisioner is the reconciler's hands: it knows how an instance comes up and goes
down (through the Backend) but not when; deciding that is the Reconciler's job.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shipyard.backends.base import (
    Backend,
    BackendError,
    InstanceHandle,
    InstanceSpec,
    runtime_for,
)
from shipyard.errors import ShipyardError
from shipyard.records import EndpointConfig
from shipyard.routing.instance import Instance
from shipyard.storage.artifacts import ArtifactError, ArtifactStore
from shipyard.storage.metadata import MetadataStore


class FleetFailed(Exception):
    """A fleet could not be brought up; the message becomes the FailureReason."""


# The built-in runtime runs handlers inline, one request at a time; LEAST_OUTSTANDING_
# REQUESTS holds the rest at the gateway (and pipelines one more to fast instances).
_BUILTIN_CONCURRENCY = 1


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


class Provisioner:
    """Starts and stops the instances of fleets."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        backend: Backend,
        artifacts: ArtifactStore,
        home: Path,
        start_timeout_s: float,
        drain_timeout_s: float,
    ) -> None:
        self.store = store
        self.backend = backend
        self.artifacts = artifacts
        self.home = home
        self.start_timeout_s = start_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"Provisioner(backend={self.backend!r})"

    async def launch(
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
                self.new_slot(endpoint, fleet, variant.name, model_dir, model.environment)
                for _ in range(counts.get(variant.name, variant.instance_count))
            ]
        slots = fleet.all_slots()
        try:
            results = await asyncio.gather(
                *(self.start_slot(s) for s in slots), return_exceptions=True
            )
        except BaseException:
            # Cancelled (the gateway is stopping): instances that did come up must not outlive it.
            await self.stop_slots(slots)
            raise
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop_slots(slots)
            first = failures[0]
            if not isinstance(first, FleetFailed | ShipyardError):
                raise first
            raise FleetFailed(str(first))
        return fleet

    def _model_dir(self, url: str | None, variant: str) -> Path:
        if not url:
            empty = self.home / "models" / "_empty"
            empty.mkdir(parents=True, exist_ok=True)
            return empty
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        dest = self.home / "models" / digest
        try:
            return self.artifacts.fetch_model(url, dest)
        except ArtifactError as exc:
            raise FleetFailed(f"Production variant {variant}: {exc}") from exc

    def new_slot(
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
        log_dir = self.home / "logs" / endpoint
        log_dir.mkdir(parents=True, exist_ok=True)
        spec = InstanceSpec(
            instance_id=instance_id,
            image=fleet.images[variant],
            model_dir=model_dir,
            environment=dict(environment or {}),
            log_path=log_dir / f"{instance_id}.log",
        )
        return Slot(spec=spec, variant=variant)

    async def start_slot(self, slot: Slot) -> None:
        """Start the slot's process and wait for its first good ``/ping``."""
        try:
            handle = await self.backend.start(slot.spec)
        except BackendError as exc:
            raise FleetFailed(str(exc)) from exc
        # A user's own server may take any number of requests at once, so its concurrency
        # is left unknown; see _BUILTIN_CONCURRENCY for the built-in runtime.
        builtin = runtime_for(slot.spec.image) == "python"
        concurrency = _BUILTIN_CONCURRENCY if builtin else None
        instance = Instance(
            slot.spec.instance_id, slot.variant, handle.url, concurrency=concurrency
        )
        try:
            await self._wait_ready(slot, handle, instance)
        except BaseException:
            # Failed, timed out or cancelled (gateway stopping): never leave it running.
            instance.pool.close()
            await self.backend.stop(handle, timeout_s=5.0)
            raise
        slot.handle, slot.instance = handle, instance

    async def _wait_ready(self, slot: Slot, handle: InstanceHandle, instance: Instance) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.02
        while True:
            reason = self.backend.exit_reason(handle)
            if reason is not None:
                raise FleetFailed(
                    f"Instance {slot.spec.instance_id} of production variant {slot.variant} "
                    f"failed to start: {reason}"
                )
            if await self.ping(instance, timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                raise FleetFailed(
                    f"Instance {slot.spec.instance_id} of production variant {slot.variant} "
                    f"did not pass the /ping health check within "
                    f"{self.start_timeout_s:g} s."
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    async def ping(self, instance: Instance, *, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                response = await instance.pool.request(b"GET", b"/ping", [])
        except (TimeoutError, OSError, Exception):
            return False
        return response.status == 200

    async def drain_and_stop(self, slots: Sequence[Slot]) -> None:
        """Wait for in-flight requests on ``slots`` to finish (bounded), then stop them."""
        deadline = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < deadline and any(
            s.instance is not None and s.instance.in_flight > 0 for s in slots
        ):
            await asyncio.sleep(0.05)
        await self.stop_slots(slots)

    async def stop_slots(self, slots: Sequence[Slot]) -> None:
        async def stop(slot: Slot) -> None:
            if slot.instance is not None:
                slot.instance.pool.close()
            if slot.handle is not None:
                await self.backend.stop(slot.handle)
            slot.handle, slot.instance = None, None

        await asyncio.gather(*(stop(s) for s in slots))
