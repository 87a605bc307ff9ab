"""Router: the one way a request reaches an instance.

Real-time, multi-model, asynchronous and streamed requests all come through here, so
this is the only place that chooses an instance and counts the work in flight on it:
the policies, the reconciler's "busy" exemption, draining and the async consumer's
capacity all read that one count. Per request, the same steps for every variant: admit
it, take an instance (after waiting in the variant's queue if none can take it now),
send, learn from the answer, give the instance back. What differs between kinds of
variant (one model or many, a standing fleet or a serverless one) is the variant's
Dispatch and Admission strategies (routing/strategies.py), not a branch here. What
surrounds a call (the variant a client named, shadow copies, metrics, capture, errors)
is routing/invocation.py's.

The router reads only the route tables the reconciler publishes (routing/table.py),
never the store. Two ways to send, sharing the choosing and the counting:

- ``invoke`` returns the whole answer (real-time and multi-model invocations);
- ``stream`` hands over the answer as it arrives and keeps the instance counted busy
  until the caller is done with it (asynchronous invocations, response streaming).

A request that fails before it could reach an instance is sent to another; once it may
have reached one it is not, since invocations need not be idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from functools import partial

from shipyard.contract import INVOCATIONS_PATH, TARGET_CONTAINER_HOSTNAME, TARGET_MODEL
from shipyard.errors import (
    ClientGone,
    InstanceFailed,
    ModelError,
    ModelNotReady,
    ResponseTooLarge,
    RuntimeValidationError,
    ServiceUnavailable,
    UpstreamError,
)
from shipyard.routing import sessions
from shipyard.routing.client import Response, StreamedResponse
from shipyard.routing.deadlines import Deadlines
from shipyard.routing.instance import Instance, Waiter
from shipyard.routing.strategies import Admission
from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]


ASK_MODEL = 1
ASK_CONTAINER = 2
ASKED_BY: dict[bytes, int] = {TARGET_MODEL: ASK_MODEL, TARGET_CONTAINER_HOSTNAME: ASK_CONTAINER}
"""The forwarded request headers (as contract.FORWARDED names them) that ask the routing
for something: a TargetModel, a TargetContainerHostname."""


@dataclass(slots=True)
class Call:
    """One request for the router: what to send, and for which model.

    ``body`` is bytes, or an iterator of chunks (then ``content_length`` should say how
    many, and the request is never sent twice). ``model`` is the TargetModel, required by
    a multi-model variant and ignored by others. ``watch_gone``, when given, arranges for
    a callback once the client has disconnected and returns what cancels that: a request
    still waiting for an instance then leaves the queue with ClientGone instead of being
    served to nobody (a client that timed out and retried would otherwise have its
    request served twice, and the queue would hold work nobody waits for).

    ``target`` is the variant the client named (TargetVariant), ``component`` the
    inference component (InferenceComponentName); ``variant`` the route the
    call was routed to, once chosen (routing/invocation.py); ``started`` when the door
    took the request (``time.perf_counter``), for the gateway's share of its latency.
    """

    headers: Headers
    body: bytes | AsyncIterator[bytes]
    content_length: int | None = None
    model: str | None = None
    watch_gone: Callable[[Callable[[], None]], Callable[[], None]] | None = None
    target: str | None = None
    variant: VariantRoute | None = None
    started: float = field(default_factory=time.perf_counter)
    component: str | None = None
    """The InferenceComponentName the client named, if any."""
    session: str | None = None
    """The SessionId the client sent (routing/sessions.py), if any."""
    pinned: Instance | None = None
    """The instance the call must go to (its session's), if any."""
    instance: Instance | None = None
    """The instance the call was sent to, once chosen."""
    opened: bytes | None = None
    """Set when the call opened a session: the New-Session-Id header's value."""
    path: bytes = INVOCATIONS_PATH
    """Where on the instance it goes: ``/invocations``, or for a shadow's copies sent
    together (routing/shadow.py) contract.COPIES_PATH."""
    opening: bool = False
    """Set when the call asks for a new session (NEW_SESSION, routing/invocation.py)."""
    asks: int = 0
    """Which routing headers the client sent (ASK_MODEL, ASK_CONTAINER, as the door saw
    them forwarded): each is refused where the variant cannot honour it, as SageMaker
    refuses it (Invocations.pick)."""

    def copy_to(self, variant: VariantRoute) -> Call:
        """This call for ``variant`` (a shadow's copy): the same request, no instance
        chosen or pinned. Field by field rather than ``dataclasses.replace``, which
        costs 5 µs against 0.7 on every copied request (a test keeps the fields listed)."""
        return Call(
            self.headers,
            self.body,
            self.content_length,
            self.model,
            self.watch_gone,
            self.target,
            variant,
            self.started,
            self.component,
            self.session,
            None,
            None,
            self.opened,
            self.path,
            False,
            self.asks,
        )


@dataclass(slots=True)
class Exchange:
    """A streamed answer, and who gives it: see Router.stream."""

    variant: VariantRoute
    instance: Instance
    response: StreamedResponse
    head_s: float
    """Seconds from sending to the answer's head."""


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
        self._resumed: set[asyncio.Task[None]] = set()
        """Started calls going on in a task (_go_on), held until done."""
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
                    successor.waiters.extend(variant.waiters)
                    variant.waiters.clear()
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

    # -- sending ----------------------------------------------------------------------

    async def invoke(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        timeout_s: float | None = None,
        tried: list[Instance] | None = None,
        resumed: bool = False,
        admission: Admission | None = None,
    ) -> tuple[Response, float]:
        """Send one invocation; return the instance's answer and the model latency (s).
        ``timeout_s`` stands in for the router's for this call (a shadow's copies sent
        together have each one's); ``tried``, instances it must not go to. ``resumed``:
        a call ``start`` sent whose instance it never reached, going on here as this loop
        would have gone on (admitted already, at the front of the queue); ``admission``,
        the one it was admitted by (after a swap of tables, not ``variant``'s).

        Raises:
            ModelNotReady: no instance of the variant is healthy.
            ServiceUnavailable: every instance is at capacity and none queues, or the
                endpoint is being deleted; InstanceFailed once the request was sent.
            ModelError: no answer within ``timeout_s``, or an answer too large.
        """
        if tried is None:
            tried = []
        turn = resumed or not variant.waiters  # first come, first served
        if admission is None:
            admission = variant.admission
        if not resumed:
            admission.admit()
        taken = resumed
        try:
            async with self._deadlines.after(timeout_s or self.timeout_s):
                while True:
                    variant, instance = await self._take(route, variant, call, tried, turn)
                    turn = taken = True
                    ahead = instance.in_flight - 1
                    dispatch = variant.dispatch
                    started = time.perf_counter()
                    try:
                        response = await dispatch.send(instance, call, self.max_response_bytes)
                    except UpstreamError as exc:
                        self._unsent(route, variant, instance, call, exc, tried)
                        continue
                    finally:
                        self._give_back(route, variant, instance)
                    model_s = time.perf_counter() - started
                    instance.observe(model_s, ahead)
                    if dispatch.learn(instance, call, response) and any(
                        i.healthy and i is not instance and i not in tried
                        for i in variant.instances
                    ):
                        tried.append(instance)
                        continue
                    return response, model_s
        except TimeoutError:
            raise self.late(variant, reached=taken) from None
        finally:
            admission.leave()

    def start(self, route: EndpointRoute, variant: VariantRoute, call: Call, done: Done) -> bool:
        """``invoke`` with no task: its outcome given to ``done`` from the loop's
        callbacks, as ``invoke`` would return or raise it. False when the call cannot go
        on callbacks (a session's instance, a variant that starts instances for the
        requests it holds, a refusal, a dispatch that awaits, no idle connection):
        nothing was done, and ``invoke`` serves it.

        The same steps as ``invoke``'s: admitted, an instance taken and counted, the
        router's deadline, the instance given back and taught by the answer; a failed
        send goes on as ``invoke`` would, in a task. A call that finds no instance free
        waits in the variant's queue as ``invoke``'s would, where its turn sends it from
        the callback that gave the instance back (_Queued).
        """
        if call.pinned is not None:
            return False
        admission = variant.admission
        try:
            admission.admit()
        except Exception:
            return False  # refused: ``invoke`` raises it
        taken = False
        try:
            if not variant.waiters:
                instance = variant.dispatch.choose(variant.instances, call)
                if instance is not None:
                    taken = self._send(route, variant, instance, call, done)
                    return taken
            taken = self._queue(route, variant, call, done)
            return taken
        finally:
            if not taken:
                admission.leave()

    def _send(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        instance: Instance,
        call: Call,
        done: Done,
        when: float | None = None,
        admission: Admission | None = None,
    ) -> bool:
        """Send ``call``, admitted already (by ``admission``, the variant's by default),
        to ``instance`` on callbacks: counted in flight and watched until ``when`` (the
        loop's time; the router's timeout from now by default). False when it could not
        be sent at once: nothing is left counted or watched, and the admission is the
        caller's, as it is when this raises."""
        flight = _Flight(self, route, variant, instance, call, done, when, admission)
        abandon = None
        try:
            if self._deadlines.watch(flight):
                instance.in_flight += 1
                flight.ahead = instance.in_flight - 1
                call.instance = instance
                abandon = variant.dispatch.start(
                    instance, call, self.max_response_bytes, flight.answered
                )
        finally:
            if abandon is None:  # not sent (or a fault on the way): everything undone
                self._deadlines.drop(flight)
                flight.over = True
                if call.instance is not None:
                    instance.in_flight -= 1
                    call.instance = None
        if abandon is None:
            return False
        flight.abandon = abandon
        return True

    def _queue(self, route: EndpointRoute, variant: VariantRoute, call: Call, done: Done) -> bool:
        """Hold ``call``, admitted already, in the variant's queue as ``invoke`` would
        (_Queued). False where ``invoke`` would refuse it or its wait starts
        instances: nothing was done."""
        if variant.admission.starts_instances or not isinstance(call.body, bytes):
            return False
        try:
            if self._choose(variant, call, [], turn=not variant.waiters) is not None:
                return False  # free after all: ``invoke`` takes it
        except Exception:
            return False  # refused (no instance ready, a full queue): ``invoke`` raises it
        queued = _Queued(self, route, variant, call, done)
        if call.watch_gone is not None:
            queued.unwatch = call.watch_gone(queued.gone)
        if not self._deadlines.watch(queued):
            queued.unwatch()
            return False
        variant.waiters.append(queued)
        return True

    def _resume(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._resumed.add(task)
        task.add_done_callback(self._resumed.discard)

    async def _go_on(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        when: float,
        admission: Admission,
        tell: Done,
        tried: list[Instance] | None = None,
    ) -> None:
        """A call started on callbacks going on in a task as ``invoke`` goes on (admitted
        already by ``admission``, first in line), until its deadline ``when`` (the
        loop's time); its outcome to ``tell``."""
        left_s = when - asyncio.get_running_loop().time()
        try:
            response, model_s = await self.invoke(
                route,
                variant,
                call,
                timeout_s=max(left_s, 0.001),
                tried=tried,
                resumed=True,
                admission=admission,
            )
        except Exception as exc:
            tell(None, 0.0, exc)
            return
        tell(response, model_s, None)

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
    async def stream(
        self, route: EndpointRoute, variant: VariantRoute, call: Call
    ) -> AsyncIterator[Exchange]:
        """Send one invocation and yield its answer once the head is in.

        ``async with router.stream(...) as exchange:`` then read
        ``exchange.response.chunks()``. The instance counts as busy until the block is
        left. No deadline is set here: the caller's (an asynchronous request's
        InvocationTimeoutSeconds) covers the whole exchange.

        Raises:
            As ``invoke``, except the deadline; errors while the answer is read
            (UpstreamError) reach the caller unchanged.
        """
        tried: list[Instance] = []
        turn = not variant.waiters
        admission = variant.admission
        admission.admit()
        try:
            async with self._exchange(route, variant, call, tried, turn) as exchange:
                yield exchange
        finally:
            admission.leave()

    @contextlib.asynccontextmanager
    async def _exchange(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        tried: list[Instance],
        turn: bool,
    ) -> AsyncIterator[Exchange]:
        while True:
            variant, instance = await self._take(route, variant, call, tried, turn)
            turn = True
            instance.streams += 1
            try:
                async with contextlib.AsyncExitStack() as stack:
                    started = time.perf_counter()
                    try:
                        response = await stack.enter_async_context(
                            variant.dispatch.open(instance, call)
                        )
                    except UpstreamError as exc:
                        self._unsent(route, variant, instance, call, exc, tried)
                        continue
                    yield Exchange(variant, instance, response, time.perf_counter() - started)
                    return
            finally:
                instance.streams -= 1
                self._give_back(route, variant, instance)

    # -- choosing and counting --------------------------------------------------------

    async def _take(
        self,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        tried: list[Instance],
        turn: bool,
    ) -> tuple[VariantRoute, Instance]:
        """An instance for the request, counted in flight until ``_give_back``.

        Waits in the variant's queue when its policy queues and no instance can take the
        request now; ``turn`` says whether the request is at the front already. A
        request of a session waits for its instance alone (``Instance.pinned``), and is
        at the front when no other request of that instance's sessions waits.
        """
        if call.pinned is not None and not call.pinned.pinned:
            turn = True
        since = 0.0  # when it began waiting in the queue of the variant named ``waited``
        waited: str | None = None
        while True:
            variant = self.current(route, variant)
            instance = self._choose(variant, call, tried, turn=turn)
            if instance is not None:
                instance.in_flight += 1
                call.instance = instance
                return variant, instance
            # Woken but beaten to the instance: keep our place at the front.
            if call.pinned is not None:
                await self._wait(
                    call.pinned.pinned,
                    partial(self._pass_on, variant, call.pinned),
                    front=turn,
                    watch_gone=call.watch_gone,
                )
            else:
                if waited != variant.name:  # its ask for this variant was made just now
                    since, waited = time.monotonic(), variant.name
                try:
                    await self._wait(
                        variant.waiters, variant.release, front=turn, watch_gone=call.watch_gone
                    )
                except _FailedFor as failed:
                    if since <= failed.began_by:
                        raise failed.error() from None
                    # Came after the asks the failed cold start was made for: it waits
                    # again behind those spared before it, and its ask is written anew.
                    turn = False
                    continue
            turn = True

    def _give_back(self, route: EndpointRoute, variant: VariantRoute, instance: Instance) -> None:
        instance.in_flight -= 1
        instance.last_used = time.monotonic()  # a serverless variant's idle clock
        # The turn goes to the queue of the table published now: a swap since the request
        # was taken moved the waiting requests there, and a turn given to the old table's
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
        while pinned:
            waiter = pinned.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        variant.release()

    @staticmethod
    def _unsent(
        route: EndpointRoute,
        variant: VariantRoute,
        instance: Instance,
        call: Call,
        exc: UpstreamError,
        tried: list[Instance],
    ) -> None:
        """A failed send: raise if it may have reached the instance, else try another."""
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
        tried.append(instance)

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
            raise ServiceUnavailable(
                f"Every instance of variant {variant.name} is at capacity; retry later."
            )
        return None

    async def _wait(
        self,
        queue: deque[Waiter],
        pass_on: Callable[[], None],
        *,
        front: bool = False,
        watch_gone: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    ) -> None:
        """Wait in ``queue`` for a turn; a turn that comes as the request gives up goes
        on by ``pass_on``."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if front:
            queue.appendleft(waiter)
        else:
            queue.append(waiter)

        def gone() -> None:
            if not waiter.done():
                waiter.set_exception(ClientGone())

        # Only a request that waits watches its client, by a callback (no task).
        unwatch = None if watch_gone is None else watch_gone(gone)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                pass_on()  # our turn came as we gave up: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):  # its place counts against the queue
                    queue.remove(waiter)
            raise
        finally:
            if unwatch is not None:
                unwatch()

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
        while waiting.waiters:
            waiter = waiting.waiters.popleft()
            if waiter.done():
                continue
            if began_by is not None and isinstance(waiter, asyncio.Future):
                # ``_take`` compares when its request began waiting.
                waiter.set_exception(_FailedFor(error, began_by))
            else:
                # A call taken on callbacks (_Queued) never waits for a serverless
                # instance, unless an update turned its variant into one: it fails.
                waiter.set_exception(error())

    def close(self) -> None:
        for route in self.routes.values():
            for instance in route.instances():
                instance.pool.close()


class _FailedFor(Exception):
    """How fail_waiting tells a request waiting in ``_take`` that a cold start made for
    the asks written at ``began_by`` failed: it fails with ``error()`` if it was waiting
    by then."""

    def __init__(self, error: Callable[[], Exception], began_by: float) -> None:
        super().__init__(began_by)
        self.error = error
        self.began_by = began_by


Done = Callable[[Response | None, float, BaseException | None], None]
"""Told the outcome of a started call (Router.start): the answer and the model's seconds,
or the error ``invoke`` would raise."""


class _Flight:
    """A call the router started (Router.start): ``invoke``'s steps after the send, on
    callbacks; its deadline on the router's sweep."""

    __slots__ = (
        "router", "route", "variant", "instance", "call", "done", "when", "sent", "ahead",
        "abandon", "over", "admission",
    )  # fmt: skip

    def __init__(
        self,
        router: Router,
        route: EndpointRoute,
        variant: VariantRoute,
        instance: Instance,
        call: Call,
        done: Done,
        when: float | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.router = router
        self.route = route
        self.variant = variant
        self.instance = instance
        self.call = call
        self.done = done
        self.when = asyncio.get_running_loop().time() + router.timeout_s if when is None else when
        """Its deadline (the loop's time): the router's timeout from now, or from when a
        call that waited came."""
        self.sent = time.perf_counter()
        self.ahead = 0
        self.abandon: Callable[[], None] = _nothing
        self.over = False
        self.admission = variant.admission if admission is None else admission
        """What admitted it: its variant's, or (a call that waited through a swap of
        tables) its first variant's."""

    def answered(self, response: Response | None, error: UpstreamError | None) -> None:
        """The instance's answer, or the failure ``dispatch.send`` would raise."""
        if self.over:
            return
        self.over = True
        self.abandon = _nothing  # the pool's exchange, which holds this: no cycle left
        router, variant, instance = self.router, self.variant, self.instance
        try:
            router._deadlines.drop(self)
            if response is not None:
                router._give_back(self.route, variant, instance)
                model_s = time.perf_counter() - self.sent
                instance.observe(model_s, self.ahead)
                variant.dispatch.learn(instance, self.call, response)
                self.admission.leave()
                self._tell(response, model_s, None)
                return
            assert error is not None
            tried: list[Instance] = []
            try:
                try:
                    # As ``invoke``: the instance marked (unreachable) before it is given
                    # back, so that the turn it gives does not go to it.
                    router._unsent(self.route, variant, instance, self.call, error, tried)
                finally:
                    router._give_back(self.route, variant, instance)
            except Exception as exc:
                self.admission.leave()
                self._tell(None, 0.0, exc)
                return
            # It never reached the instance: on to another, as ``invoke`` goes on, still
            # admitted (``invoke`` leaves).
            router._resume(
                router._go_on(
                    self.route, variant, self.call, self.when, self.admission, self._tell, tried
                )
            )
        except Exception as exc:
            self._tell(None, 0.0, exc)

    def expire(self, now: float) -> None:
        """The deadline passed with no answer: as ``invoke``'s TimeoutError."""
        if self.over:
            return
        self.over = True
        router, variant = self.router, self.variant
        abandon, self.abandon = self.abandon, _nothing
        try:
            abandon()
            router._give_back(self.route, variant, self.instance)
            self.admission.leave()
            self._tell(None, 0.0, router.late(variant, reached=True))
        except Exception as exc:
            self._tell(None, 0.0, exc)

    def _tell(self, response: Response | None, model_s: float, error: BaseException | None) -> None:
        """``done``, once: a fault on the way out is told in the answer's place, so the
        client is never left waiting."""
        done, self.done = self.done, _told
        if done is _told:
            log.error("a started call failed after it was answered", exc_info=error)
            return
        done(response, model_s, error)


class _Queued:
    """A call Router.start holds in its variant's queue while no instance can take it:
    ``invoke``'s wait, on callbacks. It stands in the queue where ``invoke``'s future
    would, in the same order, and its turn (VariantRoute.release, from the callback that
    gave an instance back) sends it from that callback. So no task is woken and no turn
    of the loop passes between an answer and the next request to that instance: for a
    fast model that gap is the instance's idle time, and the task's wake-up most of the
    gateway's work for a request that waited. (At a swap of tables, which wakes every
    waiter, it acts at once where a future acts on the loop's next turn: the order
    among those woken together may change, as it may among futures.)

    It leaves the queue as a waiting ``invoke`` does: its client gone (ClientGone), its
    deadline passed (the router's timeout from when it came), the variant failed or
    gone. Its deadline and its admission carry over to the flight its turn starts."""

    __slots__ = (
        "router", "route", "variant", "call", "tell", "loop", "when", "over", "unwatch",
        "admission",
    )  # fmt: skip

    def __init__(
        self,
        router: Router,
        route: EndpointRoute,
        variant: VariantRoute,
        call: Call,
        tell: Done,
    ) -> None:
        self.router = router
        self.route = route
        self.variant = variant
        self.call = call
        self.tell = tell
        self.loop = asyncio.get_running_loop()
        self.when = self.loop.time() + router.timeout_s
        self.over = False
        self.unwatch: Callable[[], None] = _nothing
        self.admission = variant.admission
        """What admitted it, left when it is done whatever variant serves it."""

    def done(self) -> bool:
        return self.over

    def set_result(self, result: None) -> None:
        """Its turn (taken off the queue): the instance now free takes it, sent from
        here."""
        if self.over:
            return
        router, call = self.router, self.call
        try:
            if self.loop.time() >= self.when:  # its deadline's sweep has yet to come
                raise router.late(self.variant, reached=False)
            # After a swap of tables, the queue it was moved to is the current one's.
            variant = router.current(self.route, self.variant)
            self.route = router.routes[self.route.name]
            self.variant = variant
            instance = router._choose(variant, call, [], turn=True)
        except Exception as exc:
            self._give_up(exc)
            return
        if instance is None:
            variant.waiters.appendleft(self)  # beaten to it: keep its place at the front
            return
        self._leave(queued=False)
        try:
            sent = router._send(
                self.route, variant, instance, call, self.tell, self.when, self.admission
            )
        except Exception as exc:  # nothing was sent, nothing is left counted
            self.over = False
            self._give_up(exc)
            return
        if not sent:
            # Not sent at once (no idle connection, a dispatch that awaits): on as
            # ``invoke`` goes on, in a task, still admitted and first in line.
            router._resume(
                router._go_on(self.route, variant, call, self.when, self.admission, self._tell)
            )

    def set_exception(self, exception: BaseException) -> None:
        """Failed while it waited (Router.fail_waiting, which took it off the queue)."""
        if not self.over:
            self._finish(exception, queued=False)

    def gone(self) -> None:
        """Its client disconnected while it waited."""
        if not self.over:
            self._finish(ClientGone())

    def expire(self, now: float) -> None:
        """No turn within the router's timeout: as ``invoke``'s TimeoutError."""
        if not self.over:
            self._finish(self.router.late(self.variant, reached=False))

    def _give_up(self, error: BaseException) -> None:
        """Failed on its turn: told, and, as a waiting ``invoke`` whose turn came as it
        gave up, the turn goes on (on the loop's next turn: never into a loop here)."""
        self._finish(error, queued=False)
        self.loop.call_soon(self.variant.release)

    def _leave(self, *, queued: bool = True) -> None:
        """Out of its deadline, its client's watch and (``queued``) the queue."""
        self.over = True
        self.router._deadlines.drop(self)
        unwatch, self.unwatch = self.unwatch, _nothing
        unwatch()
        if not queued:
            return
        queues = [self.variant.waiters]
        current = self.router.routes.get(self.route.name)
        if current is not None and current is not self.route:
            successor = current.successor(self.variant)
            if successor is not None:
                queues.append(successor.waiters)
        for queue in queues:
            with contextlib.suppress(ValueError):
                queue.remove(self)
                return

    def _finish(self, error: BaseException, *, queued: bool = True) -> None:
        self._leave(queued=queued)
        self.admission.leave()
        self._tell(None, 0.0, error)

    def _tell(self, response: Response | None, model_s: float, error: BaseException | None) -> None:
        """``tell``, once. It runs inside another call's callback (the answer that gave
        the turn, the deadlines' sweep): a fault of its own is logged, not raised there."""
        tell, self.tell = self.tell, _told
        try:
            tell(response, model_s, error)
        except Exception:
            log.exception("answering a call that waited for an instance failed")


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
        pinned = instance.pinned
        while pinned:
            waiter = pinned.popleft()
            if not waiter.done():
                waiter.set_result(None)
