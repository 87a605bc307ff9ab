"""Router: the one way a request reaches an instance.

Real-time, multi-model, asynchronous and streamed requests all come through here, so
this is the only place that chooses an instance and counts the work in flight on it:
the policies, the reconciler's "busy" exemption, draining and the async consumer's
capacity all read that one count. Per request, the same steps for every variant: admit
it, choose an instance (after waiting in a queue if none can take it now), send, learn
from the answer, give the instance back. What differs between kinds of variant (one
model or many, a standing fleet or a serverless one) is the variant's Dispatch and
Admission strategies (routing/strategies.py), not a branch here. What surrounds a call
(the variant a client named, shadow copies, metrics, capture, errors) is
routing/invocation.py's.

Those steps are written once, as one engine (``_Flight``: one request's way, run from
the loop's callbacks, its deadline on the router's sweep), with three thin drivers:

- ``start`` tells the outcome to a callback, with no task: the gateway's fast path;
- ``invoke`` awaits the same outcome (a future the engine completes);
- ``stream`` holds the instance the engine took until the caller's block is left, and
  hands over the answer as it arrives (asynchronous invocations, response streaming).

Where a step must await (connecting, a streamed body, a dispatch that loads a model
first), the dispatch runs it in a task of its own; the engine goes on from its outcome.
The router reads only the route tables the reconciler publishes (routing/table.py),
never the store. A request that fails before it could reach an instance is sent to
another; once it may have reached one it is not, since invocations need not be
idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial

from shipyard.errors import (
    AdmissionRefused,
    ClientGone,
    InstanceFailed,
    ModelError,
    ModelNotReady,
    ResponseTooLarge,
    RuntimeValidationError,
    ServiceUnavailable,
    UpstreamError,
)
from shipyard.http.client import Response
from shipyard.routing import sessions
from shipyard.routing.call import Call, Done, Exchange
from shipyard.routing.deadlines import Deadlines
from shipyard.routing.instance import Instance
from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)


class Router:
    """Sends each invocation to one instance of one variant and returns its answer."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_response_bytes: int | None = None,
        copies_pending: Callable[[str, str], int] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.routes: dict[str, EndpointRoute] = {}
        self.copies_pending = copies_pending
        """Per (endpoint, shadow variant), the copies sent to it and not yet answered
        (routing/shadow.py), which may wait in the copier rather than in a queue here."""
        self.withdrawn: Callable[[str], None] = _forgotten
        """Told the name of each endpoint taken out of routing (``withdraw``): what is
        kept per endpoint beside the table goes with it (routing/invocation.py sets it)."""
        self._rng = rng or random.Random()
        self._deadlines = Deadlines()
        self._next_table: dict[str, list[asyncio.Future[None]]] = {}
        """Per endpoint, who waits for its next table (``next_table``)."""

    def __repr__(self) -> str:
        return f"Router(endpoints={sorted(self.routes)})"

    # -- route tables -----------------------------------------------------------------

    def publish(self, route: EndpointRoute) -> EndpointRoute | None:
        """Swap in a new table for one endpoint; returns the one it replaced.

        Requests waiting in the old table's queues move to the new one and get a turn
        now: the new table may have more, or other, instances.
        """
        old = self.routes.get(route.name)
        self.routes[route.name] = route
        if old is not None:
            for variant in (*old.variants, *old.components.values()):
                successor = route.successor(variant)
                if successor is not None and successor is not variant:
                    successor.waiters.extend(variant.waiters.drain())
                variant.wake_all()
                _wake_pinned(variant)
            for variant in (*route.variants, *route.components.values()):
                variant.wake_all()
        self._table_changed(route.name)
        return old

    def withdraw(self, name: str) -> EndpointRoute | None:
        """Take endpoint ``name``'s table out: its waiting requests look again (and find
        none), and ``withdrawn`` forgets what was kept for it."""
        old = self.routes.pop(name, None)
        self.withdrawn(name)
        if old is not None:
            for variant in (*old.variants, *old.components.values()):
                variant.wake_all()
                _wake_pinned(variant)
        self._table_changed(name)
        return old

    async def next_table(self, name: str, timeout_s: float) -> None:
        """Return once endpoint ``name`` has a new table (or none), or ``timeout_s`` on."""
        waiter = asyncio.get_running_loop().create_future()
        self._next_table.setdefault(name, []).append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            waiting = self._next_table.get(name)
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del self._next_table[name]

    def _table_changed(self, name: str) -> None:
        for waiter in self._next_table.pop(name, ()):
            if not waiter.done():
                waiter.set_result(None)

    def in_flight(self) -> Iterator[tuple[str, str, int]]:
        """(endpoint, variant, requests in flight or waiting for an instance) for every
        published variant: the concurrency its clients ask of it. A shadow's are its
        copies pending: sent together, many ride one exchange (routing/shadow.py)."""
        pending = self.copies_pending
        for route in list(self.routes.values()):
            for variant in route.variants:
                if variant.shadow and pending is not None:
                    yield route.name, variant.name, pending(route.name, variant.name)
                    continue
                busy = sum(i.in_flight for i in variant.instances) + len(variant.waiters)
                yield route.name, variant.name, busy
            for name, copies in route.components.items():
                busy = sum(i.in_flight for i in copies.instances) + len(copies.waiters)
                yield route.name, name, busy

    def queued(self) -> Iterator[tuple[str, str, int, int]]:
        """(endpoint, variant or component, priority level, requests waiting) for every
        published variant: each level of one with a priority queue, level 1 of others."""
        for route in list(self.routes.values()):
            named = [(v.name, v) for v in route.variants if not v.shadow]
            named += list(route.components.items())
            for name, variant in named:
                counts = [0] * variant.rules.levels
                for waiter in variant.waiters:
                    counts[min(waiter.rank >> 1, len(counts) - 1)] += 1
                for level, count in enumerate(counts, start=1):
                    yield route.name, name, level, count

    def variant_for(self, route: EndpointRoute, target: str | None) -> VariantRoute:
        """The variant the client named, or one by weight."""
        if target is None:
            return route.pick_variant(self._rng)
        variant = route.by_name.get(target)
        if variant is None:
            raise RuntimeValidationError(
                f"Endpoint {route.name} does not have a production variant named {target}."
            )
        if variant.shadow:
            raise RuntimeValidationError(
                f"Variant {target} of endpoint {route.name} is a shadow variant: it takes "
                "copies of the production variant's requests and cannot be invoked directly."
            )
        return variant

    # -- the drivers -----------------------------------------------------------------

    def start(self, route: EndpointRoute, variant: VariantRoute, call: Call, done: Done) -> None:
        """Route one invocation with no task: its outcome goes to ``done`` from the
        loop's callbacks, the answer and the model's seconds or the error ``invoke``
        raises. What refuses it before anything was done (its admission, no instance
        ready, a full queue) is raised here, and nothing is left counted or queued."""
        _Flight(self, route, variant, call, done).begin(self.timeout_s)

    async def invoke(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        timeout_s: float | None = None,
    ) -> tuple[Response, float]:
        """Send one invocation; return the instance's answer and the model latency (s):
        ``start``, awaited. ``timeout_s`` stands in for the router's for this call (a
        shadow's copies sent together have each one's). Cancelled, the request leaves
        wherever it is (its queue, or its instance, whose connection is closed).

        Raises:
            ModelNotReady: no instance of the variant is healthy.
            ServiceUnavailable: every instance is at capacity and none queues, or the
                endpoint is being deleted; InstanceFailed once the request was sent.
            ModelError: no answer within ``timeout_s``, or an answer too large.
        """
        answer: asyncio.Future[tuple[Response, float]] = asyncio.get_running_loop().create_future()
        flight = _Flight(self, route, variant, call, partial(_settle, answer))
        flight.begin(timeout_s or self.timeout_s)
        try:
            return await answer
        except asyncio.CancelledError:
            flight.close()
            raise

    @contextlib.asynccontextmanager
    async def stream(
        self, route: EndpointRoute, variant: VariantRoute, call: Call
    ) -> AsyncIterator[Exchange]:
        """Send one invocation and yield its answer once the head is in.

        ``async with router.stream(...) as exchange:`` then read
        ``exchange.response.chunks()``. The engine chooses the instance as for ``start``;
        it stays held (counted busy) until the block is left. No deadline is set here:
        the caller's (an asynchronous request's InvocationTimeoutSeconds) covers the
        whole exchange.

        Raises:
            As ``invoke``, except the deadline; errors while the answer is read
            (UpstreamError) reach the caller unchanged.
        """
        held = _Held()
        flight = _Flight(self, route, variant, call, held.told, held.placed)
        flight.begin(None)
        try:
            while True:
                await held.wait()
                variant, instance = flight.variant, flight.instance
                assert instance is not None
                instance.streams += 1
                try:
                    async with contextlib.AsyncExitStack() as stack:
                        started = time.perf_counter()
                        try:
                            response = await stack.enter_async_context(
                                variant.dispatch.open(instance, call)
                            )
                        except UpstreamError as exc:
                            flight.unsent(exc)  # on to another instance, or raised
                            continue
                        yield Exchange(variant, instance, response, time.perf_counter() - started)
                        return
                finally:
                    instance.streams -= 1
        finally:
            flight.close()

    async def acquire(self, route: EndpointRoute, variant: VariantRoute, call: Call) -> _Flight:
        """Take an instance for ``call`` and hold it (counted busy) until the returned
        flight's ``close()``: its ``instance`` and ``variant``. The engine's steps up to
        the send, for a caller that sends by itself (``stream``, and tests).

        Raises:
            As ``invoke``, except the deadline (the caller's covers the wait).
        """
        held = _Held()
        flight = _Flight(self, route, variant, call, held.told, held.placed)
        flight.begin(None)
        try:
            await held.wait()
        except BaseException:
            flight.close()
            raise
        return flight

    def watched(self) -> int:
        """Requests whose deadline the router's sweep watches: routed and not yet done."""
        return self._deadlines.watched()

    def late(
        self, variant: VariantRoute, *, reached: bool
    ) -> ModelNotReady | ServiceUnavailable | ModelError:
        """The error for a call with no answer within ``timeout_s``. One that ``reached``
        no instance was never the model's: a serverless variant (or a component at zero)
        is still starting, and any other had no instance free all that time, which is
        the gateway's overload (both retried by boto3, so backpressure is 429/503, never a
        hang). A call an instance had timed out there: the model's ModelError."""
        if not reached:
            if not variant.admission.starts_instances:
                return ServiceUnavailable(
                    f"No instance of variant {variant.name} was free to take the request "
                    f"within the invocation timeout of {self.timeout_s:g} s; retry later."
                )
            what = (
                f"copy of inference component {variant.component}"
                if variant.component is not None
                else f"instance of serverless variant {variant.name}"
            )
            return ModelNotReady(
                f"No {what} started within the invocation timeout of {self.timeout_s:g} s; "
                "retry later."
            )
        return ModelError(
            f"Your invocation timed out while waiting for a response from "
            f"{variant.name} after {self.timeout_s:g} s.",
            original_status_code=504,
            original_message="timed out",
        )

    @contextlib.asynccontextmanager
    async def hold(
        self, route: EndpointRoute, variant: VariantRoute, call: Call
    ) -> AsyncIterator[tuple[VariantRoute, Instance]]:
        """Hold one instance of ``variant`` for a stream the caller carries itself (a
        WebSocket per bidirectional stream), counted in flight (and in
        ``Instance.bidi_streams``) until the block is left: draining waits for it, a
        serverless instance is not idle, least outstanding requests counts it.

        The instance is the one the variant's policy chooses, as for an invocation; when
        every one is at its request concurrency, the healthy one with the fewest in
        flight: a stream runs on a thread or connection of its own in the instance, so it
        never waits in the variant's queue (an instance refuses more streams than it
        takes, and the door says so), and takes no place of the instance's concurrency
        (policies.py).

        Raises:
            ModelNotReady when no instance of the variant is healthy.
        """
        admission = variant.admission
        admission.admit()
        try:
            variant = self.current(route, variant)
            healthy = [i for i in variant.instances if i.healthy]
            if not healthy:
                raise ModelNotReady(f"No instance of variant {variant.name} is ready yet.")
            instance = variant.dispatch.choose(healthy, call)
            if instance is None:
                instance = min(healthy, key=lambda i: i.in_flight)
            call.instance = instance
            instance.in_flight += 1
            instance.bidi_streams += 1
            try:
                yield variant, instance
            finally:
                instance.bidi_streams -= 1
                self._give_back(route, variant, instance)
        finally:
            admission.leave()

    # -- choosing and counting --------------------------------------------------------

    def _give_back(self, route: EndpointRoute, variant: VariantRoute, instance: Instance) -> None:
        instance.in_flight -= 1
        instance.last_used = time.monotonic()  # a serverless variant's idle clock
        # The turn goes to the queue of the table published now: a swap since the request
        # was chosen moved the waiting requests there, and a turn given to the old table's
        # (empty) queue would be lost, leaving them asleep beside an idle instance.
        current = self.routes.get(route.name)
        if current is not None and current is not route:
            variant = current.successor(variant) or variant
        self._pass_on(variant, instance)

    @staticmethod
    def _pass_on(variant: VariantRoute, instance: Instance) -> None:
        """``instance`` has room for one more request: the turn goes to a request of one
        of its sessions waiting for it, else to the variant's queue."""
        pinned = instance.pinned
        if pinned and pinned.turn():
            return
        waiters = variant.waiters
        if waiters:
            waiters.turn()

    @staticmethod
    def _unsent(
        route: EndpointRoute,
        variant: VariantRoute,
        instance: Instance,
        call: Call,
        exc: UpstreamError,
    ) -> None:
        """A failed send: raise if it may have reached the instance; else it is marked
        unreachable, and the request may go to another."""
        if isinstance(exc, ResponseTooLarge):
            raise ModelError(
                f"The answer of the model serving {route.name} is larger than {exc.limit} "
                "bytes, the most the gateway returns.",
                original_status_code=500,
                original_message=str(exc),
            ) from exc
        if instance.stop_reason is not None:
            # Stopped by the gateway for what the request made it do (its memory): say
            # so, whether or not the failure shows the request reached it, since a
            # stale keep-alive connection retried on a fresh one hides that.
            raise ModelError(
                instance.stop_reason,
                original_status_code=500,
                original_message=instance.stop_reason,
            ) from exc
        if exc.sent:
            raise InstanceFailed(
                f"The instance serving {route.name} failed during the request: {exc}"
            ) from exc
        variant.dispatch.unreachable(instance, call)
        instance.healthy = False  # the reconciler re-checks and restores it
        if not isinstance(call.body, bytes):
            # Nothing of it was read, but an iterator cannot be offered to another
            # instance: the caller may send the request again from its source.
            raise ServiceUnavailable(
                f"No instance serving {route.name} could be reached: {exc}"
            ) from exc

    def current(self, route: EndpointRoute, variant: VariantRoute) -> VariantRoute:
        """The variant to use now: after a wait the routing table may have been swapped."""
        current = self.routes.get(route.name)
        if current is None:
            raise ServiceUnavailable(f"Endpoint {route.name} is being deleted.")
        if current is route:
            return variant
        successor = current.successor(variant)
        if successor is not None:
            return successor
        if variant.component is not None:
            raise ServiceUnavailable(
                f"Inference component {variant.component} of {route.name} is gone."
            )
        if variant.shadow:
            # A copy must never reach a production variant in its shadow's place.
            raise ServiceUnavailable(f"Shadow variant {variant.name} of {route.name} is gone.")
        return current.pick_variant(self._rng)

    def _choose(
        self, variant: VariantRoute, call: Call, tried: list[Instance], *, turn: bool
    ) -> Instance | None:
        """An instance for the request, or None to wait in the variant's queue."""
        candidates = variant.instances
        if call.pinned is not None:
            # A session's requests go to its instance, or nowhere (sessions.py).
            candidates = [i for i in candidates if i is call.pinned]
            if not candidates or tried:
                raise sessions.gone(call.session or "")
        if tried:
            candidates = [i for i in candidates if i not in tried]
        if turn:
            instance = variant.dispatch.choose(candidates, call)
            if instance is not None:
                return instance
            if (
                not variant.admission.starts_instances
                and not variant.coming
                and not any(i.healthy for i in candidates)
            ):
                raise ModelNotReady(f"No instance of variant {variant.name} is ready yet.")
        variant.admission.waiting(variant)
        queue = variant.waiters if call.pinned is None else call.pinned.pinned
        if len(queue) >= variant.queue_limit:
            if variant.rules.configured:
                variant.metrics.refused(call.level, "queue_full")
                raise AdmissionRefused(
                    f"The queue of variant {variant.name} holds its most waiting requests "
                    f"({variant.queue_limit}); nothing was run, retry later.",
                    reason="queue_full",
                )
            raise ServiceUnavailable(
                f"Every instance of variant {variant.name} is at capacity; retry later."
            )
        return None

    def fail_waiting(
        self,
        endpoint: str,
        variant: str,
        error: Callable[[], Exception],
        began_by: float | None = None,
    ) -> None:
        """Fail every request waiting for an instance of ``variant`` with ``error()``:
        a serverless cold start failed, and they would otherwise wait for their timeout.

        With ``began_by`` (``time.monotonic()``), only the requests that began waiting by
        then: another gateway's cold start, made for the asks this one wrote at that
        time (control/serverless_use.py). The later ones wait on, and ask again."""
        route = self.routes.get(endpoint)
        waiting = route.by_name.get(variant) if route is not None else None
        if waiting is None:
            return
        for waiter in waiting.waiters.drain():
            if isinstance(waiter, _Flight):
                waiter.fail(error, began_by)

    def close(self) -> None:
        for route in self.routes.values():
            for instance in route.instances():
                instance.pool.close()


_NEW, _WAITING, _FLYING, _HELD, _OVER = range(5)
_NEVER = float("inf")


class _Flight:
    """One request's way through the router, from its admission to its instance given
    back: the engine every driver runs (``start`` passes its callback, ``invoke`` a
    future's, ``stream`` also ``hold``, told when an instance is held for it).

    Its steps, each run from the loop's callbacks:

    - ``begin``: admitted, its deadline on the router's sweep, then ``_look``;
    - ``_look``: the variant now (a table may have been swapped), an instance its
      dispatch chooses, or else a place in a queue (the variant's, or its session's
      instance's), where ``turn`` looks again;
    - ``_place``: counted in flight on the instance and sent by the dispatch, or held
      (``hold``); ``answered``: the instance given back, taught by the answer, and the
      outcome told; a request that never reached its instance looks again without it;
    - ``expire`` (its deadline), ``gone`` (its client, while it waits or runs), ``fail``
      (a cold start), ``close`` (its driver): it leaves wherever it is, and is told once.

    Its client is watched from the moment it first waits or is sent (one watch per
    request, whichever comes first) until it ends; a request held for its driver
    (``stream``) is not: the driver reads the answer, and sees the client leave itself;
    nor one sent to an instance that works on one request at a time, whose handler
    cannot be told (it holds the instance's loop).
    """

    __slots__ = (
        "router", "route", "variant", "call", "outcome", "hold", "admission", "when", "tried",
        "instance", "ahead", "sent", "abandon", "state", "unwatch", "since", "waited",
        "timer", "rank", "start_by", "queued_at", "start_timer",
    )  # fmt: skip

    def __init__(
        self,
        router: Router,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        done: Done,
        hold: Callable[[], None] | None = None,
    ) -> None:
        self.router = router
        self.route = route
        self.variant = variant
        self.call = call
        self.outcome = done
        self.hold = hold
        self.admission = variant.admission
        """What admitted it, left when it is done whatever variant serves it (a swap of
        tables may move it to another's queue)."""
        self.when = _NEVER
        """Its deadline (the loop's time)."""
        self.tried: list[Instance] = []
        self.instance: Instance | None = None
        """The instance chosen for it last (None: none yet, and a timeout is then the
        gateway's, not the model's). ``ahead`` and ``sent`` are set when it is sent."""
        self.ahead: int
        self.sent: float
        self.abandon: Callable[[], None] = _nothing
        self.state = _NEW
        self.unwatch: Callable[[], None] = _nothing
        self.since = 0.0
        """When it began waiting (monotonic) in the queue of the variant named ``waited``."""
        self.waited: str | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.rank = 2 * (call.level - 1)
        """Its place among waiters (Queue): its priority level's, one more once late."""
        self.start_by = _NEVER
        """The loop's time by which it must have started on an instance (its admission
        deadline, routing/priorities.py); _NEVER without one."""
        self.queued_at = 0.0
        """When it first waited in a queue (perf_counter), for its queue time; 0 never."""
        self.start_timer: asyncio.TimerHandle | None = None

    # -- the way ----------------------------------------------------------------------

    def begin(self, timeout_s: float | None) -> None:
        """Admit it, watch its deadline ``timeout_s`` from now (None: no deadline, the
        caller's covers it) and send it or queue it. What refuses it is raised, and
        nothing is left counted, queued or watched."""
        self.admission.admit()
        try:
            if self.call.deadline_s is not None:
                self.start_by = asyncio.get_running_loop().time() + self.call.deadline_s
            if timeout_s is not None:
                loop = asyncio.get_running_loop()
                self.when = loop.time() + timeout_s
                if not self.router._deadlines.watch(self):  # on a loop not the sweep's
                    self.timer = loop.call_at(self.when, self.expire, self.when)
            call, variant = self.call, self.variant
            pinned = call.pinned
            if pinned is None and not variant.waiters:
                # The common case, first: an instance free now, and no one before it.
                instance = variant.dispatch.choose(variant.instances, call)
                if instance is not None:
                    self._place(instance)
                    return
            # First come, first served: at the front only with no one waiting before it.
            self._look(not variant.waiters or (pinned is not None and not pinned.pinned))
        except BaseException:
            self.state = _OVER
            self._unwatched()
            self.admission.leave()
            raise

    def _look(self, turn: bool) -> None:
        """Take an instance, or wait in a queue (at its front with ``turn``)."""
        router, call = self.router, self.call
        variant = self.variant = router.current(self.route, self.variant)
        instance = router._choose(variant, call, self.tried, turn=turn)
        if instance is None:
            self._join(variant, front=turn)
        else:
            self._place(instance)

    def _join(self, variant: VariantRoute, *, front: bool) -> None:
        pinned = self.call.pinned
        if pinned is None:
            if self.waited != variant.name:  # its ask for this variant was made just now
                self.since, self.waited = time.monotonic(), variant.name
            variant.waiters.join(self, front=front)
        else:
            pinned.pinned.join(self, front=front)
        self.state = _WAITING
        if not self.queued_at:
            self.queued_at = time.perf_counter()
        if self.start_by != _NEVER and self.start_timer is None and not self.rank & 1:
            # Answered at its deadline, not at the next sweep: a timer of its own, made
            # only for a request that asked for a deadline and has to wait.
            self.start_timer = asyncio.get_running_loop().call_at(
                self.start_by, self._start_by_passed
            )
        self._watch()

    def _place(self, instance: Instance) -> None:
        """``instance`` takes it: counted in flight, then sent, or held for its driver."""
        call = self.call
        instance.in_flight += 1
        call.instance = self.instance = instance
        if self.queued_at or self.variant.rules.configured:
            self._started_waiting()
        if self.unwatch is not _nothing and (self.hold is not None or instance.concurrency == 1):
            # Held, its driver sees its client leave. On an instance that works on one
            # request at a time (a built-in runtime's one worker, its handler called on
            # the loop) the handler cannot be told, and a slot given back early would
            # only send the next request behind it: it runs to its end, as it was.
            self._unwatch()
        if self.hold is not None:
            self.state = _HELD
            self.hold()
            return
        self.state = _FLYING
        self.ahead = instance.in_flight - 1
        self.sent = time.perf_counter()
        try:
            self.abandon = self.variant.dispatch.send(
                instance, call, self.router.max_response_bytes, self.answered
            )
        except BaseException:  # nothing was sent: nothing is left counted
            instance.in_flight -= 1
            call.instance = self.instance = None
            self.state = _NEW
            raise
        # Watched while it runs where that can cancel it (not answered already, from
        # within ``send``).
        if self.state == _FLYING and instance.concurrency != 1:
            self._watch()

    def _watch(self) -> None:
        """Watch its client, once: by a callback of its connection's (no task), kept
        until it ends, so that a request nobody waits for leaves its queue or its
        instance (``gone``)."""
        watch_gone = self.call.watch_gone
        if watch_gone is not None and self.unwatch is _nothing:
            self.unwatch = watch_gone(self.gone)

    def _unwatch(self) -> None:
        if self.unwatch is not _nothing:
            unwatch, self.unwatch = self.unwatch, _nothing
            unwatch()

    def _started_waiting(self) -> None:
        """Its queue time, now that an instance took it (a variant with priorities
        counts every request's, waited or not)."""
        if self.start_timer is not None:
            self.start_timer.cancel()
            self.start_timer = None
        waited_s = time.perf_counter() - self.queued_at if self.queued_at else 0.0
        self.variant.metrics.queued(self.call.level, waited_s)

    def _start_by_passed(self) -> None:
        """Its admission deadline passed while it waited: refused now (REJECT), or on
        behind every request of its level whose deadline has not passed (DELAY)."""
        self.start_timer = None
        if self.state != _WAITING:
            return
        variant, level = self.variant, self.call.level
        if variant.rules.run_late:
            self._leave_queue()
            self.rank |= 1
            self._join(self.router.current(self.route, variant), front=False)
            variant.metrics.late(level)
            return
        variant.metrics.refused(level, "deadline")
        self._finish(
            None,
            0.0,
            AdmissionRefused(
                f"The request waited for an instance of variant {variant.name} past its "
                f"deadline of {(self.call.deadline_s or 0.0) * 1000:.0f} ms and was not run; retry "
                "later.",
                reason="deadline",
            ),
        )

    def answered(self, response: Response | None, error: BaseException | None) -> None:
        """The instance's answer, or why there is none (the dispatch's callback)."""
        if self.state != _FLYING:
            return
        self.state = _NEW
        self.abandon = _nothing  # the pool's exchange, which holds this: no cycle left
        router, variant, call = self.router, self.variant, self.call
        instance: Instance = self.instance  # type: ignore[assignment]  # sent: _place set it
        try:
            if response is not None:
                router._give_back(self.route, variant, instance)
                model_s = time.perf_counter() - self.sent
                instance.observe(model_s, self.ahead)
                if variant.dispatch.learn(instance, call, response) and any(
                    i.healthy and i is not instance and i not in self.tried
                    for i in variant.instances
                ):
                    self.tried.append(instance)
                    self._look(True)
                    return
                # ``_finish``, written out for the common case (it never waited).
                self.state = _OVER
                router._deadlines.drop(self)
                if self.timer is not None:
                    self.timer.cancel()
                if self.unwatch is not _nothing:
                    self._unwatch()
                self.admission.leave()
                self._tell(response, model_s, None)
                return
            assert error is not None
            self._unsent(instance, error)
        except Exception as exc:
            self._finish(None, 0.0, exc)

    def _unsent(self, instance: Instance, error: BaseException) -> None:
        """``instance`` failed it: raise when it may have reached it, else on to another
        (the instance marked unreachable before it is given back, so that the turn it
        gives does not go to it)."""
        router = self.router
        try:
            if not isinstance(error, UpstreamError):
                raise error
            router._unsent(self.route, self.variant, instance, self.call, error)
        finally:
            router._give_back(self.route, self.variant, instance)
        self.tried.append(instance)
        self._look(True)

    def unsent(self, error: UpstreamError) -> None:
        """The held instance could not be reached (``stream``'s open failed): on to
        another, told by ``hold`` again, or raised as ``invoke`` would."""
        assert self.state == _HELD and self.instance is not None
        self.state = _NEW
        self._unsent(self.instance, error)

    # -- leaving ----------------------------------------------------------------------

    def done(self) -> bool:
        """It no longer waits: its queue passes it over."""
        return self.state != _WAITING

    def turn(self) -> None:
        """Its turn in its queue: it looks again, from the callback that gave it (the
        answer that freed an instance), so no task wakes between the two."""
        if self.state != _WAITING:
            return
        self.state = _NEW
        try:
            if asyncio.get_running_loop().time() >= self.when:  # its sweep has yet to come
                raise self.router.late(self.variant, reached=self.instance is not None)
            self._look(True)
        except Exception as exc:
            self._finish(None, 0.0, exc)
            # The turn it was given goes on (on the loop's next turn: never a loop here).
            asyncio.get_running_loop().call_soon(self._pass_turn)

    def _pass_turn(self) -> None:
        pinned = self.call.pinned
        if pinned is not None:
            self.router._pass_on(self.variant, pinned)
        else:
            self.variant.release()

    def expire(self, now: float) -> None:
        """No answer by its deadline: ``late``, reached or not."""
        state = self.state
        if state == _WAITING:
            self._finish(
                None, 0.0, self.router.late(self.variant, reached=self.instance is not None)
            )
        elif state == _FLYING:
            abandon, self.abandon = self.abandon, _nothing
            abandon()
            self._finish(None, 0.0, self.router.late(self.variant, reached=True))

    def gone(self) -> None:
        """Its client disconnected: nobody waits for its answer. Waiting, it leaves its
        queue; sent, its exchange is abandoned (the connection to its instance closed,
        which tells the instance: runtime/server.py) and its instance given back. Told
        ClientGone either way, and counted as cancelled at that stage."""
        state = self.state
        if state == _WAITING:
            stage = "queued"
        elif state == _FLYING and self.ahead < (self.instance.concurrency or 1):  # type: ignore[union-attr]
            # Running: sent with fewer ahead of it than the instance works on at once.
            # One sent behind others is left to its end, as before (its answer goes
            # to nobody): the instance reads it whatever happens to the connection, and
            # a slot given back early would send it the next request, whose client may
            # be leaving too, one after another.
            stage = "running"
            abandon, self.abandon = self.abandon, _nothing
            abandon()
        else:
            return
        self.variant.metrics.cancelled(self.call.level, stage)
        self._finish(None, 0.0, ClientGone())

    def fail(self, error: Callable[[], Exception], began_by: float | None) -> None:
        """Taken off its queue by Router.fail_waiting: it fails with ``error()``, unless
        it began waiting after ``began_by``; then it waits again behind those spared
        before it, and its ask is written anew."""
        if self.state != _WAITING:
            return
        self.state = _NEW
        try:
            if began_by is not None and self.since > began_by:
                self._look(False)
                return
            raise error()
        except Exception as exc:
            self._finish(None, 0.0, exc)

    def close(self) -> None:
        """Its driver is done with it (the stream's block left, the awaiting task
        cancelled): out of its queue, its instance given back, its admission left."""
        if self.state == _FLYING:
            abandon, self.abandon = self.abandon, _nothing
            abandon()
        if self.state != _OVER:
            self._finish(None, 0.0, None)

    def _finish(
        self, response: Response | None, model_s: float, error: BaseException | None
    ) -> None:
        state, self.state = self.state, _OVER
        router = self.router
        if state == _WAITING:
            self._leave_queue()
        elif state in (_FLYING, _HELD) and self.instance is not None:
            router._give_back(self.route, self.variant, self.instance)
        self._unwatched()
        self.admission.leave()
        self._tell(response, model_s, error)

    def _unwatched(self) -> None:
        """Nothing left to call it back: its timers, its deadline's watch, its client's."""
        self._unwatch()
        if self.start_timer is not None:
            self.start_timer.cancel()
            self.start_timer = None
        self.router._deadlines.drop(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _leave_queue(self) -> None:
        pinned = self.call.pinned
        if pinned is not None:
            pinned.pinned.leave(self)
            return
        if self.variant.waiters.leave(self):
            return
        current = self.router.routes.get(self.route.name)  # moved there by a swap
        successor = current.successor(self.variant) if current is not None else None
        if successor is not None:
            successor.waiters.leave(self)

    def _tell(self, response: Response | None, model_s: float, error: BaseException | None) -> None:
        """``outcome``, once. It may run inside another request's callback (the answer that
        gave the turn, the deadlines' sweep): a fault of its own is logged, not raised
        there."""
        outcome, self.outcome = self.outcome, _told
        try:
            outcome(response, model_s, error)
        except Exception:
            log.exception("telling the outcome of a routed request failed")


class _Held:
    """``stream``'s side of its flight: a future per instance held for it."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def placed(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def told(self, response: Response | None, model_s: float, error: BaseException | None) -> None:
        if error is not None and not self.future.done():
            self.future.set_exception(error)

    async def wait(self) -> None:
        """Until an instance is held for it (then ready for the next one), or the error."""
        try:
            await self.future
        finally:
            self.future = asyncio.get_running_loop().create_future()


def _settle(
    answer: asyncio.Future[tuple[Response, float]],
    response: Response | None,
    model_s: float,
    error: BaseException | None,
) -> None:
    """A flight's outcome into the future ``invoke`` awaits."""
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    elif response is not None:
        answer.set_result((response, model_s))


def _forgotten(endpoint: str) -> None:
    pass


def _nothing() -> None:
    pass


def _told(response: Response | None, model_s: float, error: BaseException | None) -> None:
    """Stands for a flight's ``done`` once it has been called."""


def _wake_pinned(variant: VariantRoute) -> None:
    """The table changed: requests waiting for their session's instance look again (it
    may be gone, and they fail, or still there, and they wait on)."""
    for instance in variant.instances:
        instance.pinned.wake_all()
