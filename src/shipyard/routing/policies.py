"""Policies pick one instance of a variant for a request.

Single-model policies are named after the ``RoutingStrategy`` value they implement;
model policies (ModelAffinity) pick for requests that name a TargetModel.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from shipyard.records import RoutingStrategy
from shipyard.routing.instance import Instance


class Policy(Protocol):
    """Chooses an instance for the next request, or None when none can take it.

    ``queues`` says what None means: True, wait in the variant's queue for an instance to
    answer; False, the variant is full and the caller answers 503.
    """

    queues: bool
    max_in_flight: int

    def choose(self, instances: Sequence[Instance]) -> Instance | None: ...


class Random:
    """Picks uniformly among healthy instances that are under ``max_in_flight``.

    Guarantee: every eligible instance is equally likely, whatever its load. Fails by
    returning None when every instance is unhealthy or full; the caller answers 503.
    """

    queues = False

    def __init__(self, *, max_in_flight: int, rng: random.Random | None = None) -> None:
        self.max_in_flight = max_in_flight
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"Random(max_in_flight={self.max_in_flight})"

    def choose(self, instances: Sequence[Instance]) -> Instance | None:
        n = len(instances)
        if n == 1:  # no draw to make
            only = instances[0]
            busy = only.in_flight - only.bidi_streams
            return only if only.healthy and busy < self.max_in_flight else None
        if n == 0:
            return None
        # Try a random start first: the common case (all healthy, none full) costs one draw.
        start = self._rng.randrange(n)
        for i in range(n):
            candidate = instances[(start + i) % n]
            # Bidirectional streams take no place of the instance's requests.
            busy = candidate.in_flight - candidate.bidi_streams
            if candidate.healthy and busy < self.max_in_flight:
                return candidate
        return None


class LeastOutstandingRequests:
    """Picks the healthy instance with the fewest requests in flight, among those that can
    start work on the request now.

    An instance that declares its ``concurrency`` (the built-in runtime works on one
    request at a time) is only eligible while it has fewer requests than that in flight;
    others are eligible up to ``max_in_flight``. When none is eligible the router holds
    the request in the variant's FIFO queue and retries on the next answer (``queues`` is
    True), so a request never waits behind a slow one on a busy instance while another
    would have been free sooner. One exception: an instance that works on a request for
    under ``pipeline_below_s`` on average (``Instance.service_s``: its answers' latency
    shared among the requests it had in flight, so a queue at the instance does not count)
    may take one request more than its concurrency, since
    for such fast models the round trip to fetch the next request from the gateway would
    leave it idle a large share of the time (25-40 % less throughput, measured), while a
    request queued behind a fast one waits little. The time is measured at the gateway,
    so it holds the gateway's own delays too: under load on a busy gateway a model of
    about a millisecond reads 1-3 ms, and a bound of 1 ms turned pipelining off when the
    gateway was busiest (two sklearn instances at c=32: 0.8x of the throughput with 5 ms,
    bench/results/routing_policies.md). A request pipelined waits behind one of a few
    milliseconds on average; never behind a streamed answer (``Instance.streams``), which
    may last long and whose time the average does not hold. Ties are broken at random.
    Fails by returning None.
    """

    queues = True

    def __init__(
        self,
        *,
        max_in_flight: int,
        pipeline_below_s: float = 0.005,
        rng: random.Random | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.pipeline_below_s = pipeline_below_s
        self.unknown_concurrency = max_in_flight
        """What an instance that does not say its concurrency may take at once."""
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_in_flight={self.max_in_flight})"

    def choose(self, instances: Sequence[Instance]) -> Instance | None:
        best: list[Instance] = []
        least = 1 << 62
        for candidate in instances:
            if not candidate.healthy or candidate.in_flight > least:
                continue
            limit = candidate.concurrency or self.unknown_concurrency
            if (
                candidate.concurrency
                and candidate.service_s < self.pipeline_below_s
                and not candidate.streams
            ):
                limit += 1
            # Bidirectional streams count as outstanding, but take no handler slot.
            if candidate.in_flight - candidate.bidi_streams >= min(limit, self.max_in_flight):
                continue
            if candidate.in_flight < least:
                least = candidate.in_flight
                best = [candidate]
            else:
                best.append(candidate)
        if not best:
            return None
        return best[0] if len(best) == 1 else self._rng.choice(best)


class WithinConcurrency(LeastOutstandingRequests):
    """For a variant with a priority queue (routing/priorities.py), whatever its
    RoutingStrategy: an instance gets no more than it works on at once (its handler
    threads; one for a server that does not say), never one pipelined, so every request
    beyond waits at the gateway, where its priority and deadline are kept. The least busy
    eligible instance takes the next; ``max_in_flight`` per instance bounds the queue."""

    def __init__(self, *, max_in_flight: int, rng: random.Random | None = None) -> None:
        super().__init__(max_in_flight=max_in_flight, pipeline_below_s=0.0, rng=rng)
        self.unknown_concurrency = 1


def policy_for(strategy: RoutingStrategy, *, max_in_flight: int) -> Policy:
    if strategy is RoutingStrategy.LEAST_OUTSTANDING_REQUESTS:
        return LeastOutstandingRequests(max_in_flight=max_in_flight)
    return Random(max_in_flight=max_in_flight)


# -- multi-model routes -------------------------------------------------------------------


class ModelPolicy(Protocol):
    """Chooses an instance for a request that names a TargetModel, or None when all are full.

    None means the variant is full (the caller answers 503): multi-model routes hold no
    requests at the gateway.
    """

    def choose(self, instances: Sequence[Instance], model: str) -> Instance | None: ...


class ModelAffinity:
    """Sends each request to an instance that already holds its TargetModel, when one can
    take it; otherwise to the least loaded instance, which then loads the model.

    Procedure, for a request naming model X:

    1. Holders are the healthy instances whose ``models`` include X: loaded there, or being
       loaded because a request for X was sent there. A holder is eligible while it has
       fewer than ``spill_at`` requests in flight (default: half of ``max_in_flight``).
       The eligible holder with the fewest requests in flight wins, ties broken at random.
    2. With no eligible holder, fall back to the healthy instance under ``max_in_flight``
       with the fewest requests in flight, ties going to the one holding the fewest models
       (the most memory free), then at random. It loads X and becomes a holder.

    Ray Serve's multiplexed routing does the same, with a timeout where this has a queue
    bound. Guarantees: while a model's holders keep up, its requests stay on them, so each
    model is loaded on as few instances as its traffic needs and the instances' memory
    budgets add up instead of each holding the same hot models. Concurrent first requests
    for X go to one instance, which loads it once. A model spreads to another instance
    only once all its holders are ``spill_at`` requests behind. The bound is high on
    purpose: a miss costs a download and a load, a hit a prediction, and requests queued
    on an instance mostly wait for its loads, so spilling them early turns cheap hits
    into more loads. bench/multimodel.py measured it: spilling past 5 in flight instead
    of 32 cut the hit rate from 0.93 to 0.87 and throughput by a third to a half.

    Failure modes: a model hot enough to keep its holder busy is served by that one
    instance until ``spill_at`` requests wait there, so one very hot model can leave
    other instances idle below that point. The view of who holds what comes from the
    instances' answers and can lag: a model an instance unloaded without saying so (a
    report lost with a request that gave up) is a miss there, not an error, and the
    reconciler's health checks resync the view from ``GET /models``. Returns None when
    every healthy instance is at ``max_in_flight``; the caller answers 503.
    """

    def __init__(
        self,
        *,
        max_in_flight: int,
        spill_at: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.spill_at = min(spill_at or max(max_in_flight // 2, 1), max_in_flight)
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"ModelAffinity(max_in_flight={self.max_in_flight}, spill_at={self.spill_at})"

    def choose(self, instances: Sequence[Instance], model: str) -> Instance | None:
        spill_at = self.spill_at
        holders = [
            i for i in instances if i.healthy and model in i.models and i.in_flight < spill_at
        ]
        if holders:
            least = min(i.in_flight for i in holders)
            return self._pick([i for i in holders if i.in_flight == least])
        open_ = [i for i in instances if i.healthy and i.in_flight < self.max_in_flight]
        if not open_:
            return None
        least_key = min((i.in_flight, len(i.models)) for i in open_)
        return self._pick([i for i in open_ if (i.in_flight, len(i.models)) == least_key])

    def _pick(self, tied: list[Instance]) -> Instance:
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)


class IgnoreModel:
    """A single-model policy on a multi-model route, blind to TargetModel.

    The baseline that ModelAffinity is measured against (``SHIPYARD_MULTI_MODEL_ROUTING=
    random`` with RoutingStrategy RANDOM): every instance ends up loading the same hot
    models. Fails as the wrapped policy does; a None from a queueing policy still means
    503 here.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __repr__(self) -> str:
        return f"IgnoreModel({self.policy!r})"

    def choose(self, instances: Sequence[Instance], model: str) -> Instance | None:
        return self.policy.choose(instances)


MODEL_POLICIES = ("affinity", "random")


def model_policy_for(name: str, *, max_in_flight: int) -> ModelPolicy:
    """The multi-model policy ``name`` (one of MODEL_POLICIES)."""
    if name == "random":
        return IgnoreModel(Random(max_in_flight=max_in_flight))
    if name == "affinity":
        return ModelAffinity(max_in_flight=max_in_flight)
    raise ValueError(f"unknown multi-model routing {name!r} (known: {', '.join(MODEL_POLICIES)})")
