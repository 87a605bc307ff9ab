"""Serverless variants: instances started by demand, stopped when idle or
over their memory.

The router says how many instances a serverless variant's work needs
(routing/serverless.py); ``demand`` starts the difference at once, beside the fleet's
other instances, and publishes each one as it passes ``/ping``, which gives the waiting
requests their turn (a cold start). The reconciler's supervise pass calls ``reap_idle``
(instances idle for the variant's idle time go, down to those ProvisionedConcurrency
keeps warm), and ``watch_memory`` stops an instance over MemorySizeInMB, failing the
request it serves with a ModelError that says so.

Starts for demand do not wait for the endpoint's converge step, since a cold start must
not queue behind a blue/green update. They check the fleet is still the endpoint's once
the instance is up, and stop it otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from shipyard.errors import ModelError
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, Provisioner, Slot
from shipyard.records import VariantSpec
from shipyard.routing.router import Router

log = logging.getLogger(__name__)

_MIB = 1024 * 1024

IDLE_ENV = "SHIPYARD_SERVERLESS_IDLE_S"
"""A model's Environment may set its own idle time with this."""


def warm_instances(spec: VariantSpec, slots: int) -> int:
    """Instances ProvisionedConcurrency keeps running, idle or not."""
    assert spec.serverless is not None
    provisioned = spec.serverless.provisioned_concurrency or 0
    return math.ceil(provisioned / slots)


class ServerlessScaler:
    """Starts serverless instances for demand; stops idle ones and those over memory."""

    def __init__(
        self,
        *,
        provisioner: Provisioner,
        router: Router,
        metrics: Metrics,
        fleets: dict[str, Fleet],
        publish: Callable[[Fleet], None],
        idle_s: float,
        slots: int,
        memory_period_s: float = 0.1,
    ) -> None:
        self.provisioner = provisioner
        self.router = router
        self.metrics = metrics
        self.fleets = fleets
        self.publish = publish
        self.idle_s = idle_s
        self.slots = slots
        self.memory_period_s = memory_period_s
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_failed: Callable[[str, str, str], None] = _nothing
        """Told (endpoint, variant, reason) when a cold start fails with none of the
        variant's instances left: requests through other gateways wait for it too
        (control/serverless_use.py)."""

    def __repr__(self) -> str:
        return f"ServerlessScaler(idle_s={self.idle_s:g}, slots={self.slots})"

    def initial_instances(self, spec: VariantSpec, *, trial: bool) -> int:
        """Instances a new fleet starts with: the warm ones, and with ``trial`` at least
        one, so that a model that cannot start fails CreateEndpoint rather than every
        request. The trial instance then goes once idle, like any other."""
        warm = warm_instances(spec, self.slots)
        return max(warm, 1) if trial else warm

    # -- demand -----------------------------------------------------------------------

    def demand(self, fleet: Fleet, variant: str, wanted: int) -> None:
        """Have ``wanted`` instances of ``variant`` running or starting. Runs on the
        event loop, called by the router."""
        if self.fleets.get(fleet.endpoint) is not fleet:
            return  # replaced or retired: the request moves to the new table
        have = len(fleet.slots[variant]) + fleet.starting.get(variant, 0)
        if wanted <= have:
            return
        count = wanted - have
        fleet.starting[variant] = fleet.starting.get(variant, 0) + count
        for _ in range(count):
            task = asyncio.create_task(
                self._cold_start(fleet, variant), name=f"serverless.{fleet.endpoint}.{variant}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _cold_start(self, fleet: Fleet, variant: str) -> None:
        slot = self.provisioner.new_slot(fleet.endpoint, fleet, variant)
        started = time.perf_counter()
        try:
            await self.provisioner.start_slot(slot)
        except Exception as exc:
            fleet.starting[variant] -= 1
            log.warning("cold start of %s failed: %s", slot.spec.instance_id, exc)
            if (
                self.fleets.get(fleet.endpoint) is fleet  # else its requests moved on
                and not fleet.slots[variant]
                and not fleet.starting[variant]
            ):
                reason = str(exc)
                self.router.fail_waiting(
                    fleet.endpoint, variant, lambda: start_failed(variant, reason)
                )
                self.on_failed(fleet.endpoint, variant, reason)
            return
        except BaseException:
            fleet.starting[variant] -= 1
            raise
        fleet.starting[variant] -= 1
        if self.fleets.get(fleet.endpoint) is not fleet:
            await self.provisioner.stop_slots([slot])
            return
        elapsed = time.perf_counter() - started
        self.metrics.cold_starts.labels(fleet.endpoint, variant).inc()
        self.metrics.model_setup_time.labels(fleet.endpoint, variant).observe(elapsed)
        log.info("cold start of %s took %.3f s", slot.spec.instance_id, elapsed)
        fleet.slots[variant].append(slot)
        self.publish(fleet)

    async def stop(self) -> None:
        """Cancel cold starts under way (each stops its own instance)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- scale-in ---------------------------------------------------------------------

    def reap_idle(self, fleet: Fleet) -> list[Slot]:
        """Take out of ``fleet`` the serverless instances idle for their idle time,
        keeping the warm ones; the caller publishes the fleet and stops them.

        Synchronous on purpose: no request can be routed to an instance between the
        check that it is idle and its removal from the fleet.
        """
        now = time.monotonic()
        reaped: list[Slot] = []
        for spec in fleet.config.variants:
            if spec.serverless is None:
                continue
            idle_s = self._idle_s(fleet, spec.name)
            slots = fleet.slots[spec.name]
            keep = warm_instances(spec, self.slots)
            for slot in sorted(slots, key=_last_used):
                if len(slots) <= keep:
                    break
                instance = slot.instance
                if instance is not None and (
                    instance.in_flight or now - instance.last_used < idle_s
                ):
                    continue
                slots.remove(slot)
                slot.retired = True
                reaped.append(slot)
        return reaped

    def _idle_s(self, fleet: Fleet, variant: str) -> float:
        value = fleet.templates[variant].environment.get(IDLE_ENV)
        if value is not None:
            with contextlib.suppress(ValueError):
                return max(float(value), 0.0)
        return self.idle_s

    # -- memory -----------------------------------------------------------------------

    async def watch_memory(self) -> None:
        """Stop serverless instances over their MemorySizeInMB, until cancelled."""
        while True:
            await asyncio.sleep(self.memory_period_s)
            for fleet in list(self.fleets.values()):
                for spec in fleet.config.variants:
                    if spec.serverless is not None:
                        await self._check_memory(fleet, spec)

    async def _check_memory(self, fleet: Fleet, spec: VariantSpec) -> None:
        assert spec.serverless is not None
        limit_mb = spec.serverless.memory_mb
        backend = self.provisioner.backend
        for slot in list(fleet.slots[spec.name]):
            handle, instance = slot.handle, slot.instance
            if handle is None or instance is None:
                continue
            used = await asyncio.to_thread(backend.memory_bytes, handle)
            if used is None or used <= limit_mb * _MIB or slot.retired:
                continue
            reason = (
                f"The serverless instance of production variant {spec.name} used "
                f"{used / _MIB:.0f} MB, more than its MemorySizeInMB of {limit_mb}, and was "
                "stopped."
            )
            log.warning("%s (%s)", reason, slot.spec.instance_id)
            self.metrics.serverless_memory_kills.labels(fleet.endpoint, spec.name).inc()
            instance.stop_reason = reason
            instance.healthy = False
            if slot in fleet.slots[spec.name]:
                fleet.slots[spec.name].remove(slot)
            slot.retired = True
            self.publish(fleet)
            await backend.stop(handle, timeout_s=0.0)  # at once: it is taking the host's memory
            await self.provisioner.stop_slots([slot])


def _last_used(slot: Slot) -> float:
    return slot.instance.last_used if slot.instance is not None else 0.0


def start_failed(variant: str, reason: str) -> ModelError:
    """What a request waiting for a serverless instance that failed to start is told."""
    return ModelError(
        f"The serverless instance of production variant {variant} failed to start: {reason}",
        original_status_code=500,
        original_message=reason,
    )


def _nothing(endpoint: str, variant: str, reason: str) -> None:
    pass
