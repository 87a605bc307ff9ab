"""Policies pick one instance of a variant for a request.

Each is named after the ``RoutingStrategy`` value it implements.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from shipyard.records import RoutingStrategy
from shipyard.routing.instance import Instance


class Policy(Protocol):
    """Chooses an instance for the next request, or None when none can take it."""

    def choose(self, instances: Sequence[Instance]) -> Instance | None: ...


class Random:
    """Picks uniformly among healthy instances that are under ``max_in_flight``.

    Guarantee: every eligible instance is equally likely, whatever its load. Fails by
    returning None when every instance is unhealthy or full; the caller answers 503.
    """

    def __init__(self, *, max_in_flight: int, rng: random.Random | None = None) -> None:
        self.max_in_flight = max_in_flight
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"Random(max_in_flight={self.max_in_flight})"

    def choose(self, instances: Sequence[Instance]) -> Instance | None:
        n = len(instances)
        if n == 0:
            return None
        # Try a random start first: the common case (all healthy, none full) costs one draw.
        start = self._rng.randrange(n)
        for i in range(n):
            candidate = instances[(start + i) % n]
            if candidate.healthy and candidate.in_flight < self.max_in_flight:
                return candidate
        return None


class LeastOutstandingRequests:
    """Picks the healthy instance with the fewest requests in flight.

    Ties are broken at random so equal instances share load. Guarantee: a request never
    queues behind a slow one while an idle instance exists. Fails by returning None when
    every instance is unhealthy or at ``max_in_flight``.
    """

    def __init__(self, *, max_in_flight: int, rng: random.Random | None = None) -> None:
        self.max_in_flight = max_in_flight
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"LeastOutstandingRequests(max_in_flight={self.max_in_flight})"

    def choose(self, instances: Sequence[Instance]) -> Instance | None:
        best: list[Instance] = []
        least = self.max_in_flight
        for candidate in instances:
            if not candidate.healthy or candidate.in_flight > least:
                continue
            if candidate.in_flight < least:
                least = candidate.in_flight
                best = [candidate]
            elif candidate.in_flight < self.max_in_flight:
                best.append(candidate)
        if not best:
            return None
        return best[0] if len(best) == 1 else self._rng.choice(best)


def policy_for(strategy: RoutingStrategy, *, max_in_flight: int) -> Policy:
    if strategy is RoutingStrategy.LEAST_OUTSTANDING_REQUESTS:
        return LeastOutstandingRequests(max_in_flight=max_in_flight)
    return Random(max_in_flight=max_in_flight)
