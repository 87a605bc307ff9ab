"""Leases: what this gateway runs, however many gateways share the store.

Each endpoint's fleet, each training job and each transform job is run by the one
gateway holding its lease in the store (storage/leases.py). The loop that runs them
claims on every pass, at most ``renew_s`` apart: that renews the leases it holds and
takes those nobody holds, or whose holder stopped renewing them ``lease_s`` ago (it
died).

The store's word is not waited for to let go. A lease counts as held here only until
``lease_s - renew_s`` after the claim that renewed it began: past that another gateway
may take it at any moment, so the loop must already have stopped acting on what it
covers. A gateway cut off from the store thus retires its fleets before anyone else
starts theirs, and an endpoint never has two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from shipyard.storage.leases import LeaseStore

log = logging.getLogger(__name__)


class Leases:
    """The resources of one ``kind`` whose lease this gateway holds, as of its last claim."""

    def __init__(
        self,
        *,
        store: LeaseStore,
        kind: str,
        lease_s: float,
        renew_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if renew_s >= lease_s:
            raise ValueError(
                f"lease_renew_s ({renew_s:g}) must be shorter than lease_s "
                f"({lease_s:g}), or leases expire between renewals."
            )
        self.store = store
        self.kind = kind
        self.lease_s = lease_s
        self.renew_s = renew_s
        self._clock = clock
        self._until: dict[str, float] = {}
        """Per name held: when (our clock) to stop counting on the lease."""
        self._taken: dict[str, dict[str, Any]] = {}
        """Per lease taken over from a holder that died: the routes it had recorded."""
        self._none_held = False
        """The last claim asked for nothing and succeeded: the store holds no lease of
        this kind for us, and only a claim naming something would add one."""

    def __repr__(self) -> str:
        return f"Leases({self.kind!r}, holder={self.store.holder!r}, held={sorted(self.held())})"

    def holds(self, name: str) -> bool:
        until = self._until.get(name)
        return until is not None and self._clock() < until

    def taken_from(self, name: str) -> dict[str, Any] | None:
        """What the previous holder of ``name``'s lease recorded before it died, once,
        if this gateway took the lease over from it (the fleet it may adopt)."""
        return self._taken.pop(name, None)

    def held(self) -> set[str]:
        now = self._clock()
        return {name for name, until in self._until.items() if now < until}

    async def claim(self, names: Collection[str]) -> set[str]:
        """Renew and take the leases of ``names``; those held now. Leases held on
        anything else (deleted, finished) are dropped.

        A claim that fails (the store is unreachable) changes nothing here: the leases
        held run out on our clock as they would in the store.
        """
        if not names and self._none_held:
            # Nothing to renew, take or drop: an idle gateway's loops claim every pass,
            # and a write transaction each time was most of its CPU when idle.
            return set()
        if names:
            # Set again only by an empty claim that succeeds: one naming something may
            # commit and still fail here, leaving a lease in the store to drop.
            self._none_held = False
        started = self._clock()
        recorded: dict[str, dict[str, Any]] = {}
        try:
            terms = await asyncio.to_thread(
                self.store.claim, self.kind, names, lease_s=self.lease_s, taken=recorded
            )
        except Exception:
            log.exception(
                "could not renew the %s leases; %d still held", self.kind, len(self.held())
            )
            return self.held()
        until = started + self.lease_s - self.renew_s
        taken = set(terms) - self.held()
        if taken:
            log.info("took the %s leases of %s", self.kind, ", ".join(sorted(taken)))
        self._until = dict.fromkeys(terms, until)
        self._none_held = not names
        self._taken = {n: r for n, r in (self._taken | recorded).items() if n in terms}
        return set(terms)

    async def release(self, names: Collection[str]) -> None:
        """Hand back leases on what is stopped here, so another gateway takes them now."""
        for name in names:
            self._until.pop(name, None)
        try:
            await asyncio.to_thread(self.store.release, self.kind, names)
        except Exception:
            log.exception("could not release the %s leases; they expire instead", self.kind)
