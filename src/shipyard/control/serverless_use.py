"""Serverless variants used through gateways that do not run their fleet.

Only the gateway holding an endpoint's lease starts and stops its instances; the others
route to them (control/mirror.py). Without a word from them, a request through another
gateway to a serverless variant at rest would wait out its timeout for a cold start
nobody makes, and an instance busy with their requests would look idle to the holder and
be stopped. So each gateway, for the fleets it mirrors, writes to the store
(storage/serverless_use.py):

- at once, when one of its requests waits with no instance to take it: the instances its
  requests need (``ask``, called by the router through the publisher's demand);
- at most every ``period_s``, while its requests use a variant: that they did, and how
  many instances they need (``sample``, on each of the mirror's passes).

The holder reads what the others wrote on each converge pass (``apply``): a row whose
``uses`` moved counts as a request on every instance of the variant (their idle clocks
start again) and asks for the instances it names, as a local request would. A holder's
first read of an endpoint only learns where each row stands: rows written before it held
the lease are not taken for new use.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping

from shipyard.background import Wakeup
from shipyard.control.serverless import ServerlessScaler
from shipyard.provisioning.fleet import Fleet
from shipyard.storage.serverless_use import ServerlessUseStore

log = logging.getLogger(__name__)


class ServerlessUse:
    """Tells the holders what this gateway's requests need of their serverless variants,
    and tells this gateway's serverless variants what the others' requests need."""

    def __init__(self, store: ServerlessUseStore, *, period_s: float) -> None:
        self.store = store
        self.period_s = period_s
        self._pending: dict[tuple[str, str], int] = {}
        self._admitted: dict[tuple[str, str], int] = {}
        """Per mirrored variant, its requests admitted when its use was last written."""
        self._written: dict[tuple[str, str], float] = {}
        """Per mirrored variant, when its use was last written (this process's clock)."""
        self._wake = Wakeup()
        self._seen: dict[tuple[str, str, str], int] = {}
        """Per row of another gateway, the ``uses`` this holder last read."""
        self._known: set[str] = set()
        """Endpoints held here whose rows have been read once."""

    def __repr__(self) -> str:
        return f"ServerlessUse(pending={sorted(self._pending)})"

    # -- a gateway mirroring the fleet --------------------------------------------------

    def ask(self, endpoint: str, variant: str, wanted: int) -> None:
        """A request waits for an instance of a mirrored serverless variant: ``wanted``
        instances, asked for at once."""
        key = (endpoint, variant)
        self._pending[key] = max(self._pending.get(key, 0), wanted)
        self._wake.set()

    def sample(self, fleets: Mapping[str, Fleet]) -> None:
        """Note the use of the mirrored ``fleets``' serverless variants since the last
        write, each at most every ``period_s``."""
        now = time.monotonic()
        for fleet in fleets.values():
            for variant, route in fleet.serverless.items():
                key = (fleet.endpoint, variant)
                if route.admitted == self._admitted.get(key) and not route.active:
                    continue  # unused since it was last written
                if now - self._written.get(key, -math.inf) < self.period_s:
                    continue
                self._admitted[key] = route.admitted
                wanted = min(math.ceil(route.active / route.slots), route.max_instances)
                self._pending[key] = max(self._pending.get(key, 0), wanted)
                self._wake.set()

    async def run(self) -> None:
        """Write what was noted, as it is noted, until cancelled."""
        self._wake.bind()
        while True:
            await self._wake.wait(self.period_s)
            pending, self._pending = self._pending, {}
            if not pending:
                continue
            try:
                await asyncio.to_thread(self.store.note, pending)
            except Exception:
                log.exception("could not record the use of serverless variants; retrying")
                for key, wanted in pending.items():
                    self._pending[key] = max(self._pending.get(key, 0), wanted)
                continue
            now = time.monotonic()
            for key in pending:
                self._written[key] = now

    # -- the holder -------------------------------------------------------------------

    async def apply(self, fleets: Mapping[str, Fleet], scaler: ServerlessScaler) -> None:
        """Act on what the other gateways wrote of the serverless variants of ``fleets``
        (those run here) since the last read."""
        serving = [
            f.endpoint for f in fleets.values() if any(v.serverless for v in f.config.variants)
        ]
        if not serving:
            return
        uses = await asyncio.to_thread(self.store.read, serving)
        now = time.monotonic()
        for use in uses:
            fleet = fleets.get(use.endpoint)
            key = (use.endpoint, use.variant, use.gateway)
            before = self._seen.get(key)
            self._seen[key] = use.uses
            if fleet is None or use.variant not in fleet.serverless:
                continue
            if before == use.uses or (before is None and use.endpoint not in self._known):
                continue
            for slot in fleet.slots.get(use.variant, []):
                if slot.instance is not None:
                    slot.instance.last_used = max(slot.instance.last_used, now)
            if use.wanted:
                scaler.demand(fleet, use.variant, use.wanted)
        self._known.update(serving)
