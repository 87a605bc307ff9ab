"""Serverless variants used through gateways that do not run their fleet.

Only the gateway holding an endpoint's lease starts and stops its instances; the others
route to them (control/mirror.py). Without a word from them, a request through another
gateway to a serverless variant at rest would wait out its timeout for a cold start
nobody makes, and an instance busy with their requests would look idle to the holder and
be stopped. So each gateway, for the fleets it mirrors, writes to the store
(storage/serverless_use.py):

- at once, when one of its requests waits with no instance to take it: the instances its
  requests need (``ask``, called by the router through the publisher's demand);
- at most every ``period_s``, while its requests use a variant: that they did, on which
  instances, and how many they need (``sample``, on each of the mirror's passes).

The holder reads what the others wrote on each converge pass (``apply``): a row whose
``uses`` moved counts as a request on each instance it says its requests were on (their
idle clocks start again; so the others' light traffic keeps only the instances it
reaches) and asks for the instances it wants, as a local request would. A holder's
first read of an endpoint (and its first since it held it last) only learns where each
row stands: rows written before it held the lease are not taken for new use. A request
still waiting is written again a period on, so an ask a new holder took for where a row
stands is acted on at the next.

A cold start the holder made that fails with no instance of the variant left fails the
requests waiting on the holder (ServerlessScaler) and is written on the rows whose use it
had read, with the ``uses`` it had read (``failed``). Each write of another gateway reads
its row back, and a failure for the ``uses`` of one of its writes fails the requests
there that began waiting by the time of that write (``fail``): those its asks were for.
A request that came later waits on, and its ask, written at once, has the holder try
again. A write that raised may have been stored all the same (the connection lost after
the commit): the next write's ``uses``, two past the last one known, says so, and the
write it skipped is kept with the time its asks were taken. The times of writes past
keeping are dropped, written to again or not.

MaxConcurrency is the variant's in all, not each gateway's. So every write
carries the requests the writer has admitted (``active``), and reads back the other
gateways' rows; the holder writes its own too while another gateway routes to the
variant, and learns the others' on each converge pass. Each gateway's admission then
counts the others' requests (``ServerlessAdmission.others``) from the rows that moved in the
last ``3 * period_s`` (by this gateway's clock: a row left by a gateway that died stops
counting). The count is a period old at most, so the limit holds in all up to what the
gateways admit within one period of each other.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from shipyard.background import Wakeup
from shipyard.control.serverless import ServerlessScaler
from shipyard.provisioning.fleet import Fleet
from shipyard.routing.serverless import ServerlessAdmission
from shipyard.routing.table import EndpointRoute
from shipyard.storage.serverless_use import WRAP, ServerlessUseStore, Use

log = logging.getLogger(__name__)

_GAP_S = 0.05
"""The least time between two writes of this gateway's use."""

_FAILURE_TRIES = 20
"""Writes of a failed cold start tried (one a period) before it is given up."""


class ServerlessUse:
    """Tells the holders what this gateway's requests need of their serverless variants,
    and tells this gateway's serverless variants what the others' requests need."""

    def __init__(
        self,
        store: ServerlessUseStore,
        *,
        period_s: float,
        keep_s: float,
        fail: Callable[[str, str, str, float], None],
    ) -> None:
        self.store = store
        self.period_s = period_s
        self.keep_s = keep_s
        """How long the time of a write is kept: the longest a request waits here."""
        self.fail = fail
        """Fails the requests waiting here for (endpoint, variant), for a reason, that
        began waiting by a time (``time.monotonic()``)."""
        self._pending: dict[tuple[str, str], int] = {}
        self._used: dict[tuple[str, str], set[str]] = {}
        """Per mirrored variant to write, the instances its requests were on, by id."""
        self._written: dict[tuple[str, str], float] = {}
        """Per mirrored variant, when its use was last written (this process's clock)."""
        self._wake = Wakeup()
        self._seen: dict[tuple[str, str, str], int] = {}
        """Per row of another gateway, the ``uses`` this holder last read."""
        self._known: set[str] = set()
        """Endpoints held here whose rows have been read once."""
        self._sent: dict[tuple[str, str], dict[int, float]] = {}
        """Per mirrored variant, its writes of the last ``keep_s``: the ``uses`` each
        wrote, and when what it wrote was taken (``time.monotonic()``), oldest first."""
        self._last: dict[tuple[str, str], int] = {}
        """Per mirrored variant with writes kept, the ``uses`` of its last write known."""
        self._unsure: dict[tuple[str, str], float] = {}
        """Per mirrored variant, when the asks of a write that raised were taken: it may
        have been stored all the same, as the next write's ``uses`` will tell."""
        self._admissions: dict[tuple[str, str], tuple[ServerlessAdmission, float]] = {}
        """Per serverless variant routed here, its admission, and when it was last seen."""
        self._heard: dict[tuple[str, str, str], tuple[int, float, int]] = {}
        """Per row of another gateway: its ``uses``, when it last moved (this process's
        clock) and the requests it said it had admitted."""
        self._failures: dict[tuple[str, str, str], tuple[int, str, int]] = {}
        """Held here: per row of another gateway, the newest failed cold start to write
        on it: the ``uses`` it was made for, why it failed, and the tries left."""

    def __repr__(self) -> str:
        return f"ServerlessUse(pending={sorted(self._pending)})"

    # -- a gateway mirroring the fleet --------------------------------------------------

    def ask(self, endpoint: str, variant: str, wanted: int) -> None:
        """A request waits for an instance of a mirrored serverless variant: ``wanted``
        instances, asked for at once."""
        key = (endpoint, variant)
        self._pending[key] = max(self._pending.get(key, 0), wanted)
        self._wake.set()

    def sample(
        self,
        fleets: Mapping[str, Fleet],
        routes: Mapping[str, EndpointRoute],
        *,
        shared_only: bool = False,
    ) -> None:
        """Note the use of ``fleets``' serverless variants (mirrored ones; with
        ``shared_only``, those run here, only where another gateway routes to them too),
        as the tables published for them (``routes``) show it, each at most every
        ``period_s``: used while requests are on its instances or wait for one, or if
        one finished since the last write; with the instances they were on and the
        requests admitted. Instances and waiting requests carry over from table to
        table, so a request admitted on an earlier table still counts. Each variant's
        admission is told the other gateways' requests as last heard."""
        now = time.monotonic()
        for fleet in fleets.values():
            table = routes.get(fleet.endpoint)
            if table is None:
                continue
            for variant in fleet.serverless:
                route = table.by_name.get(variant)
                if route is None or not isinstance(route.admission, ServerlessAdmission):
                    continue
                admission = route.admission
                key = (fleet.endpoint, variant)
                self._admissions[key] = (admission, now)
                admission.others = self._others(key, now)
                written = self._written.get(key, -math.inf)
                if now - written < self.period_s:
                    continue
                if shared_only and not any(k[:2] == key for k in self._heard):
                    continue  # no other gateway routes to it: nobody to tell
                busy = sum(i.in_flight for i in route.instances) + len(route.waiters)
                if not busy and not any(i.last_used > written for i in route.instances):
                    continue  # unused since it was last written
                wanted = min(math.ceil(busy / admission.slots), admission.max_instances)
                self._pending[key] = max(self._pending.get(key, 0), wanted)
                self._used.setdefault(key, set()).update(
                    i.instance_id for i in route.instances if i.in_flight or i.last_used > written
                )
                self._wake.set()

    async def run(self) -> None:
        """Write what was noted, as it is noted (at most every ``_GAP_S``), and the
        failures of cold starts made here, until cancelled."""
        self._wake.bind()
        while True:
            await self._wake.wait(self.period_s)
            self._forget_past(time.monotonic())
            await self._write_failures()
            pending, self._pending = self._pending, {}
            used, self._used = self._used, {}
            if not pending:
                continue
            taken = time.monotonic()  # requests waiting by now asked in this write
            active = {k: a.active for k, (a, _) in self._admissions.items() if k in pending}
            try:
                written, heard = await asyncio.to_thread(self._write, pending, used, active)
            except Exception:
                log.exception("could not record the use of serverless variants; retrying")
                for key, wanted in pending.items():
                    self._pending[key] = max(self._pending.get(key, 0), wanted)
                    self._unsure.setdefault(key, taken)
                for key, ids in used.items():
                    self._used.setdefault(key, set()).update(ids)
            else:
                now = time.monotonic()
                for key in pending:
                    self._written[key] = now
                self._hear(heard, now)
                self._read_back(written, taken)
            # Requests waiting under load each ask: their asks are written together.
            await asyncio.sleep(_GAP_S)

    async def _write_failures(self) -> None:
        """Write the failed cold starts held here, each row's newest."""
        failures, self._failures = self._failures, {}
        by_reason: dict[str, dict[tuple[str, str, str], int]] = {}
        for row, (uses, reason, _) in failures.items():
            by_reason.setdefault(reason, {})[row] = uses
        for reason, rows in by_reason.items():
            try:
                await asyncio.to_thread(self.store.fail, rows, reason)
            except Exception:
                log.exception("could not record a failed serverless cold start")
                for row in rows:
                    uses, _, tries = failures[row]
                    # Tried again unless a newer failure came for the row meanwhile;
                    # past its tries, those requests wait out their timeout.
                    if tries > 1 and row not in self._failures:
                        self._failures[row] = (uses, reason, tries - 1)

    def _read_back(self, written: Mapping[tuple[str, str], Use], taken: float) -> None:
        """Note when each write's asks were taken, and fail the requests here that a cold
        start the holder made for one of those writes failed for."""
        for key, use in written.items():
            sent = self._sent.setdefault(key, {})
            unsure = self._unsure.pop(key, None)
            before = WRAP if use.uses == 1 else use.uses - 1
            if unsure is not None and self._last.get(key) not in (None, before):
                # A write that raised was stored all the same (the row moved by two):
                # its asks were taken by then. (Not known when no write was kept before.)
                sent[before] = unsure
            self._last[key] = use.uses
            began_by = sent.get(use.failed_uses)
            # Oldest first: those past keeping go, and with a failure, the write it was
            # for and those before it (a failure is told once).
            for uses, at in list(sent.items()):
                if began_by is None and taken - at <= self.keep_s:
                    break
                del sent[uses]
                if uses == use.failed_uses:
                    break
            sent[use.uses] = taken
            if began_by is None:
                continue  # no failure, one told already, or not for a write kept here
            try:
                self.fail(use.endpoint, use.variant, use.failure or "no reason was given", began_by)
            except Exception:  # the writer goes on whatever the requests' end
                log.exception("could not fail the requests waiting for %s", key)

    def _write(
        self,
        wanted: Mapping[tuple[str, str], int],
        used: Mapping[tuple[str, str], set[str]],
        active: Mapping[tuple[str, str], int],
    ) -> tuple[dict[tuple[str, str], Use], list[Use]]:
        """This gateway's rows written, and the other gateways' rows of those endpoints."""
        written = self.store.note(wanted, used, active)
        return written, self.store.read(sorted({endpoint for endpoint, _ in wanted}))

    def _hear(self, rows: Iterable[Use], now: float) -> None:
        """Note the other gateways' rows as read, and when each last moved."""
        for use in rows:
            key = (use.endpoint, use.variant, use.gateway)
            before = self._heard.get(key)
            moved = now if before is None or before[0] != use.uses else before[1]
            self._heard[key] = (use.uses, moved, use.active)

    def _others(self, key: tuple[str, str], now: float) -> int:
        """The requests the other gateways said they had admitted to a variant, in rows
        that moved within three periods (a busy gateway writes every period)."""
        fresh = 3 * self.period_s
        return sum(
            active
            for row, (_, moved, active) in self._heard.items()
            if row[:2] == key and now - moved <= fresh
        )

    def _forget_past(self, now: float) -> None:
        """Drop the writes past keeping of variants no longer written (a failure for one
        of them could fail nothing still waiting here)."""
        for key, sent in list(self._sent.items()):
            for uses, at in list(sent.items()):
                if now - at <= self.keep_s:
                    break
                del sent[uses]
            if not sent:
                del self._sent[key]
                self._last.pop(key, None)
        for key, at in list(self._unsure.items()):
            if now - at > self.keep_s:
                del self._unsure[key]
        for key, (_, seen) in list(self._admissions.items()):
            if now - seen > self.keep_s:  # its endpoint is gone, or no longer routed here
                del self._admissions[key]
        for row, (_, moved, _) in list(self._heard.items()):
            if now - moved > self.keep_s:
                del self._heard[row]

    # -- the holder -------------------------------------------------------------------

    def failures_pending(self) -> int:
        """The failed cold starts held here and not yet written: a refused write's stay
        for another try, unless a newer failure came for its row."""
        return len(self._failures)

    def failed(self, endpoint: str, variant: str, reason: str) -> None:
        """A cold start of ``variant``, run here, failed with none of its instances
        left: written for the gateways whose use had been read (their requests waiting
        for it fail, as the ones here did)."""
        rows = {k: uses for k, uses in self._seen.items() if k[:2] == (endpoint, variant)}
        for row, uses in rows.items():
            self._failures[row] = (uses, reason, _FAILURE_TRIES)
        if rows:
            self._wake.set()

    async def apply(
        self, fleets: Mapping[str, Fleet], holds: Callable[[str], bool], scaler: ServerlessScaler
    ) -> None:
        """Act on what the other gateways wrote of the serverless variants of ``fleets``
        (those run here, under a lease ``holds`` says is held) since the last read."""
        serving = [
            f.endpoint
            for f in fleets.values()
            if holds(f.endpoint) and any(v.serverless for v in f.config.variants)
        ]
        # An endpoint no longer run here is read afresh if it comes back: what was
        # written meanwhile was for another holder.
        for endpoint in self._known.difference(serving):
            self._known.discard(endpoint)
            for key in [k for k in self._seen if k[0] == endpoint]:
                del self._seen[key]
        if not serving:
            return
        uses = await asyncio.to_thread(self.store.read, serving)
        now = time.monotonic()
        self._hear(uses, now)
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
                instance = slot.instance
                if instance is not None and (use.used is None or instance.instance_id in use.used):
                    instance.last_used = max(instance.last_used, now)
            if use.wanted:
                scaler.demand(fleet, use.variant, use.wanted)
        self._known.update(serving)
