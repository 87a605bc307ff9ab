"""Instance supervision: health checks, restarts with backoff, hung instances replaced.

Each pass pings every instance of a fleet that no converge step owns at the moment:

- an instance whose process ended is started again at once, and after a failed start
  with a backoff that doubles up to a minute;
- an instance that fails ``/ping`` leaves routing at once (it comes back when a ping
  succeeds); an idle one is replaced after a few failed pings in a row, a busy one only
  once it has been silent for ``unhealthy_restart_after_s``: a user's server may not
  answer ``/ping`` while it works (the built-in runtime always does), but one silent
  that long is hung, and its requests will never be answered;
- an idle multi-model instance is asked which models it holds, to correct the router's
  view learned from answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from shipyard.errors import FleetFailed
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, Provisioner, Slot
from shipyard.routing.model_agent import loaded_models
from shipyard.routing.multimodel import resync

log = logging.getLogger(__name__)

PING_FAILURES_BEFORE_RESTART = 3


class InstanceSupervisor:
    """Keeps a fleet's instances alive and its routing table honest about their health."""

    def __init__(
        self,
        *,
        provisioner: Provisioner,
        publish: Callable[[Fleet], None],
        metrics: Metrics,
        unhealthy_restart_after_s: float = 20.0,
    ) -> None:
        self.provisioner = provisioner
        self.publish = publish
        self.metrics = metrics
        self.unhealthy_restart_after_s = unhealthy_restart_after_s

    def __repr__(self) -> str:
        return f"InstanceSupervisor(restart_after_s={self.unhealthy_restart_after_s:g})"

    async def supervise(self, fleet: Fleet) -> None:
        """One pass over ``fleet``; republishes its table if anything changed."""
        changed = False
        for slot in fleet.all_slots():
            if slot.retired:
                continue  # taken out while this pass was under way
            if slot.handle is None:
                if time.monotonic() >= slot.restart_at:
                    changed |= await self.restart(fleet, slot)
                continue
            reason = self.provisioner.backend.exit_reason(slot.handle)
            if reason is not None:
                log.warning("instance %s exited: %s", slot.spec.instance_id, reason)
                changed |= await self.restart(fleet, slot)
                continue
            changed |= await self._check(fleet, slot)
        if changed:
            self.publish(fleet)

    async def _check(self, fleet: Fleet, slot: Slot) -> bool:
        """Ping the slot's running instance and act on the answer; whether the fleet's
        table changed."""
        instance = slot.instance
        assert instance is not None
        busy = instance.in_flight > 0
        answered = await self.provisioner.ping(instance, timeout_s=5.0)
        if slot.retired or slot.instance is not instance:
            return False  # stopped or replaced while it was pinged: not ours to judge
        if answered:
            slot.ping_failures, slot.failing_since = 0, None
            back = not instance.healthy  # republish: requests queued meanwhile get a turn
            instance.healthy = True
            await self._resync_models(fleet, slot)
            return back
        instance.healthy = False
        now = time.monotonic()
        if slot.failing_since is None:
            slot.failing_since = now
        if not busy:
            slot.ping_failures += 1
        if (
            slot.ping_failures < PING_FAILURES_BEFORE_RESTART
            and now - slot.failing_since < self.unhealthy_restart_after_s
        ):
            return False
        log.warning(
            "instance %s failed its health checks for %.0f s; replacing it",
            slot.spec.instance_id,
            now - slot.failing_since,
        )
        return await self.restart(fleet, slot)

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

    async def restart(self, fleet: Fleet, slot: Slot) -> bool:
        """Stop the slot's instance (out of routing first) and start a new one."""
        old = slot.handle
        slot.handle, slot.instance, slot.ping_failures = None, None, 0
        slot.failing_since = None
        self.publish(fleet)
        if old is not None:
            await self.provisioner.backend.stop(old, timeout_s=5.0)
        slot.restarts += 1
        if slot.retired:
            return True
        try:
            await self.provisioner.start_slot(slot)
        except FleetFailed as exc:
            backoff = min(2.0**slot.restarts, 60.0)
            slot.restart_at = time.monotonic() + backoff
            log.warning("restart of %s failed (%s); next try in %gs", slot, exc, backoff)
            return True
        if slot.retired:  # taken out of the fleet while it started
            await self.provisioner.stop_slots([slot])
            return True
        log.info("restarted instance %s", slot.spec.instance_id)
        return True
