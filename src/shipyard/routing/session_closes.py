"""Closes of sessions shared among the gateways of one store (and the workers of one
``shipyard serve --workers``).

A session id is checked by any gateway on its own (routing/sessions.py), so a close must
reach them all: each gateway records in the store the closes its models answered and
reads the others' (storage/sessions.py), every ``period_s``, in a background loop.
The gateway that passes a close on refuses the session at once; another learns of it
within a period or so. A gateway reads every close not yet expired when it starts, so a
restart forgets none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from shipyard.routing.sessions import Sessions
from shipyard.storage.sessions import ClosedSessions

Close = tuple[str, float]
"""A session closed: its id, and the Unix time it would have expired."""
log = logging.getLogger(__name__)
_PURGE_EVERY_S = 60.0


class SessionCloses:
    def __init__(
        self,
        sessions: Sessions,
        store: ClosedSessions,
        *,
        period_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.period_s = period_s
        self._clock = clock
        self._seq = 0
        self._purged = 0.0

    def __repr__(self) -> str:
        return f"SessionCloses(seq={self._seq}, period_s={self.period_s:g})"

    async def run(self) -> None:
        """The background loop (Loops): exchange, then wait a period; a store that fails
        is retried at the next one, with nothing lost."""
        while True:
            try:
                await self.exchange()
            except Exception:
                log.exception("sharing the closes of sessions failed; trying again")
            await asyncio.sleep(self.period_s)

    async def exchange(self) -> None:
        """Record the closes answered here since the last exchange; learn the others'."""
        closing, self.sessions.closing = self.sessions.closing, []
        try:
            learned, self._seq = await asyncio.to_thread(self._io, closing, self._seq)
        except BaseException:
            self.sessions.closing[:0] = closing  # recorded at the next exchange
            raise
        self.sessions.learn(learned)

    def _io(self, closing: list[Close], seq: int) -> tuple[list[Close], int]:
        now = self._clock()
        self.store.record(closing)
        learned = self.store.since(seq, now)
        if now - self._purged >= _PURGE_EVERY_S:
            self._purged = now
            self.store.purge(now)
        return learned
