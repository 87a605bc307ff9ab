"""The last minutes of every endpoint's counters, so a chart opened now starts full.

A page polls the counters itself while it is open; without this it would start empty.
Every ``period_s`` one pass over the registry's invocation, error and latency series
(``ConsoleState.counters``) is kept, ``keep`` deep per endpoint: a few microseconds per
series, on the event loop, none of it on the data path, which only increments the
counters it reads.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

Counters = dict[str, dict[str, float]]
"""Per variant, counter name -> cumulative value."""


class MetricsHistory:
    """Readings ``(time, counters)`` per endpoint, newest last."""

    def __init__(
        self,
        read: Callable[[], dict[str, Counters]],
        *,
        period_s: float = 5.0,
        keep: int = 36,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._read = read
        self.period_s = period_s
        self.keep = keep
        self._clock = clock
        self._readings: dict[str, deque[tuple[float, Counters]]] = {}

    def __repr__(self) -> str:
        return f"MetricsHistory(endpoints={len(self._readings)}, period_s={self.period_s})"

    def sample(self) -> None:
        now = self._clock()
        current = self._read()
        for endpoint in list(self._readings):
            if endpoint not in current:  # deleted: forget it
                del self._readings[endpoint]
        for endpoint, counters in current.items():
            kept = self._readings.get(endpoint)
            if kept is None:
                kept = self._readings[endpoint] = deque(maxlen=self.keep)
            kept.append((now, counters))

    def readings(self, endpoint: str) -> list[dict[str, object]]:
        return [{"t": t, "variants": c} for t, c in self._readings.get(endpoint, ())]

    async def run(self) -> None:
        """Sample until cancelled (by the app's lifespan)."""
        while True:
            self.sample()
            await asyncio.sleep(self.period_s)
