"""Deadlines for many concurrent calls on one periodic sweep, instead of one timer each.

A timer on the loop's heap for every call, cancelled when the call ends, cost 4.7 µs a
call with uvloop, measured, about 5% of the gateway's CPU per invocation. The router's
deadline (the invocation timeout, tens of seconds) needs no finer resolution than a
fraction of a second, so each call is put in a set, with no timer; one sweep every
``resolution_s``, scheduled only while calls are in the set, expires the overdue ones
(``Expiring.expire``): the router's requests (routing/router.py), which then leave
wherever they are.

A deadline fires up to ``resolution_s`` late, never early. On a loop other than the one
its sweep runs on, ``watch`` declines, and the caller sets a timer of its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Deadlines:
    """Watches the deadlines of many entries (``watch``), expiring them on one sweep."""

    def __init__(self, resolution_s: float = 0.1) -> None:
        self.resolution_s = resolution_s
        self._live: set[Expiring] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"Deadlines(resolution_s={self.resolution_s}, live={len(self._live)})"

    def watch(self, entry: Expiring) -> bool:
        """Call ``entry.expire(now)`` once ``entry.when`` (the loop's time) has passed,
        unless ``drop(entry)`` came first. False, and nothing watched, on a loop other
        than the sweep's."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            return False
        self._add(entry)
        return True

    def watched(self) -> int:
        """Entries whose deadline is watched now."""
        return len(self._live)

    def drop(self, entry: Expiring) -> None:
        self._live.discard(entry)

    def _add(self, deadline: Expiring) -> None:
        self._live.add(deadline)
        if self._sweep_handle is None:
            assert self._loop is not None
            self._sweep_handle = self._loop.call_later(self.resolution_s, self._sweep)

    def _sweep(self) -> None:
        self._sweep_handle = None
        assert self._loop is not None
        now = self._loop.time()
        overdue = [d for d in self._live if d.when <= now]
        for deadline in overdue:
            self._live.discard(deadline)
            try:
                deadline.expire(now)
            except Exception:  # one fault must not keep the others from expiring
                log.exception("expiring a deadline failed")
        # An expiry may have added a deadline (a call whose turn it gave), and with it
        # the next sweep already: one sweep at a time.
        if self._live and self._sweep_handle is None:
            self._sweep_handle = self._loop.call_later(self.resolution_s, self._sweep)


class Expiring(Protocol):
    """What the sweep expires: an entry given to ``Deadlines.watch``."""

    when: float

    def expire(self, now: float) -> None: ...
