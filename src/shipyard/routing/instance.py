"""Instance: the router's view of one instance."""

from __future__ import annotations

import hashlib
import time
from collections import deque
from typing import Protocol
from urllib.parse import urlsplit

from shipyard.http.client import ConnectionPool, Response


class Waiter(Protocol):
    """A request waiting for an instance (the router's flight, routing/router.py): told
    its turn when one may take it."""

    def done(self) -> bool:
        """It no longer waits (answered, failed, or its client gone): skipped."""
        ...

    def turn(self) -> None:
        """An instance may take it now (it may still be beaten to it, and join again)."""
        ...

    @property
    def rank(self) -> int:
        """Where it stands among the waiters: 0 first. Its priority level's, once its
        variant's rules applied (routing/priorities.py): ``2 × (level - 1)``, plus one
        once its deadline passed and it waits on late. 0 for every request of a variant
        without priorities."""
        ...


class Queue(deque[Waiter]):
    """Requests waiting for an instance: the one queue of the router, for a variant's
    requests, a session's (``Instance.pinned``), a serverless variant's cold start and an
    inference component's copies.

    Strict priority by rank (``Waiter.rank``), first come first served within one: the
    queue is kept in that order, so the next turn is always the front's. Where a waiter
    joins (``join``) and which gets the next turn (``turn``) are decided here and nowhere
    else. Without priorities every rank is 0 and a join is an append. (A deque, so that
    its length and truth cost no call on the data path; the router uses only the
    methods below.)
    """

    __slots__ = ("_waking",)

    def __init__(self) -> None:
        super().__init__()
        self._waking = False

    def __repr__(self) -> str:
        return f"Queue(waiting={len(self)})"

    def join(self, waiter: Waiter, *, front: bool = False) -> None:
        """Wait for a turn: at the back of its rank, or (``front``: it had the turn and
        was beaten to the instance) at the front of it. While every waiter is being woken
        at once they rejoin in the order they had."""
        rank = waiter.rank
        if front and not self._waking:
            if not self or self[0].rank >= rank:
                self.appendleft(waiter)
                return
            # Before the first waiter of its rank or a later one.
            for at, other in enumerate(self):
                if other.rank >= rank:
                    self.insert(at, waiter)
                    return
            self.append(waiter)
            return
        if not self or self[-1].rank <= rank:
            self.append(waiter)
            return
        # Behind the last waiter of its rank or an earlier one: priority, by hand (a
        # bounded queue, its order one comparison of ranks).
        for at in range(len(self) - 1, -1, -1):
            if self[at].rank <= rank:
                self.insert(at + 1, waiter)
                return
        self.appendleft(waiter)

    def leave(self, waiter: Waiter) -> bool:
        """Out of the queue without a turn; False when it was not in it."""
        try:
            self.remove(waiter)
        except ValueError:
            return False
        return True

    def turn(self) -> bool:
        """Give the next waiter still waiting its turn; False when none waits."""
        while self:
            waiter = self.popleft()
            if not waiter.done():
                waiter.turn()
                return True
        return False

    def wake_all(self) -> None:
        """A turn for every waiter (the table changed: they look again)."""
        waking = self.drain()
        self._waking = True
        try:
            for waiter in waking:
                if not waiter.done():
                    waiter.turn()
        finally:
            self._waking = False

    def drain(self) -> list[Waiter]:
        """Every waiter, out of the queue (they fail, or move to another queue)."""
        waiting = list(self)
        self.clear()
        return waiting


class Instance:
    """One instance as the router sees it: where it is and how busy.

    ``in_flight`` counts requests sent and not yet answered; policies read it, and only
    the router changes it, on the event loop, so it needs no lock. ``concurrency`` is how
    many requests the instance works on at once when known (the built-in runtime runs one
    at a time), else None. ``latency_s`` is a moving average of its answers' latency.

    ``models`` is, on a multi-model route, the TargetModels the gateway believes the
    instance holds in memory (or is loading), least recently used first; learned from its
    answers (routing/multimodel.py), so it may be briefly out of date. Empty otherwise.

    ``socket_path``: a Unix socket on this host where the instance also serves, which
    its requests then take (http/client.py); its ``url`` stays what others see.

    ``takes_copies``: it runs the built-in runtime, which takes a shadow's copies many
    at a time (contract.COPIES_PATH); cleared should it answer that route 404.
    """

    __slots__ = (
        "instance_id",
        "variant",
        "url",
        "pool",
        "in_flight",
        "healthy",
        "concurrency",
        "latency_s",
        "service_s",
        "models",
        "adapters",
        "adapter_refusals",
        "pinned",
        "last_used",
        "stop_reason",
        "takes_copies",
        "streams",
        "bidi_streams",
        "streams_both_ways",
        "digest",
    )

    def __init__(
        self,
        instance_id: str,
        variant: str,
        url: str,
        *,
        concurrency: int | None = None,
        socket_path: str | None = None,
        takes_copies: bool = False,
        streams_both_ways: bool | None = None,
    ) -> None:
        parts = urlsplit(url)
        self.streams_both_ways = streams_both_ways
        """Whether it serves bidirectional streams, when its backend knows (a container
        image's label); None: the instance says so itself when asked."""
        self.takes_copies = takes_copies
        self.instance_id = instance_id
        self.digest = hashlib.blake2b(f"{instance_id}\0{url}".encode(), digest_size=8).digest()
        """What a session id names it by (routing/sessions.py): the same on every gateway
        that routes to it, as the mirror knows an instance by id and address too
        (control/mirror.py), and another for a process restarted in place, which takes
        a new address."""
        self.variant = variant
        self.url = url
        self.concurrency = concurrency
        self.latency_s = 0.0
        self.service_s = 0.0
        """A moving average of the time it takes per request it works on: an answer's
        latency shared among the requests it had in flight when that one was sent, which
        on an instance that works on one at a time were served one after the other."""
        self.pool = ConnectionPool(
            parts.hostname or "127.0.0.1", parts.port or 80, socket_path=socket_path
        )
        self.in_flight = 0
        self.streams = 0
        """Of ``in_flight``, the exchanges whose answer is streamed (response streaming,
        asynchronous invocations): they may last long, and their time is not in
        ``service_s``."""
        self.bidi_streams = 0
        """Of ``in_flight``, the bidirectional streams open on it (Router.hold): each runs
        beside the instance's requests, on a thread or connection of its own, so takes
        no place of its ``concurrency``."""
        self.healthy = True
        self.models: dict[str, None] = {}
        self.pinned = Queue()
        """Requests of its sessions waiting for it (routing/router.py): they can take no
        other instance, so they wait here, not in the variant's queue, where they would
        take turns other requests could use."""
        self.adapter_refusals: dict[str, tuple[int, float, Response]] = {}
        """Adapters this process refused to load: name → (generation, when, its answer),
        given again to their requests for a while rather than loaded again each time."""
        self.adapters: dict[str, int] = {}
        """On the copies of a base inference component: the adapters registered in this
        process (routing/adapters.py), by name → the generation of its specification."""
        self.last_used = time.monotonic()
        """When it last finished a request (monotonic): serverless instances idle long
        enough are stopped."""
        self.stop_reason: str | None = None
        """Why the gateway stopped it on purpose (over its memory), for the request it
        was serving."""

    def observe(self, latency_s: float, ahead: int = 0) -> None:
        """Fold one answer's latency into the moving averages (weight 1/8); ``ahead``
        requests were in flight on the instance when it was sent."""
        self.latency_s += (latency_s - self.latency_s) * 0.125
        self.service_s += (latency_s / (ahead + 1) - self.service_s) * 0.125

    def __repr__(self) -> str:
        return (
            f"Instance(id={self.instance_id!r}, variant={self.variant!r}, "
            f"in_flight={self.in_flight}, healthy={self.healthy})"
        )
