"""Shadow variants: copies of production requests, sent off the client's path.

A shadow variant (ShadowProductionVariants) is a fleet of its own that gets
a share of the production variant's requests, equal to its weight over the production
weight and capped at all of them. The client's answer never waits for a copy: the door
hands the copies over only once the production answer is sent (or has failed), and each
copy is a task of its own whose outcome goes to ``/metrics`` under the shadow's name
(``shipyard_invocations``, ``shipyard_invocation_{4xx,5xx}_errors``,
``shipyard_model_latency_seconds``) and nowhere else.

A slow or failing shadow must not take the gateway down with it, so copies are bounded
per shadow variant: past ``max_pending`` copies sent and not yet answered, new ones are
dropped and counted (``shipyard_shadow_copies_dropped``) rather than queued. A pending
copy holds its request body, so the bound also caps the memory copies take.

Copies to a shadow whose instances run the built-in runtime travel together: each
instance has at most one exchange of copies in flight, and the copies made meanwhile go
in the next one, up to ``MAX_COPIES`` copies or ``BULK_BYTES`` of bodies
(``POST /copies``, shipyard/contract.py). A copy is a second exchange of the gateway's
per request, as costly as the production one; together they cost one exchange per
batch, in the gateway and in the shadow's instance alike (bench/results/shadow.md). A
copy's latency is then the instance's time on it and its share of the exchange. Copies
to any other shadow (a container of one's own, a multi-model one) are sent one by one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import Counter

from shipyard.contract import (
    COPIES_MEDIA_TYPE,
    COPIES_PATH,
    MAX_COPIES,
    pack_copies,
    unpack_outcomes,
)
from shipyard.errors import ModelError, RuntimeFailure
from shipyard.routing.call import Call
from shipyard.routing.strategies import OneModel

if TYPE_CHECKING:  # the router and the tables import this module
    from shipyard.metrics import VariantMetrics
    from shipyard.routing.router import Router
    from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)

Copies = dict[str, tuple[tuple["VariantRoute", float], ...]]


def copy_shares(production: Sequence[VariantRoute], shadows: Sequence[VariantRoute]) -> Copies:
    """Per production variant, each shadow with the share of its requests to copy.

    The share is the shadow's weight over the production variant's, capped at 1, so
    equal weights copy every request; a shadow of weight 0 gets none, and a production
    variant of weight 0 (taking requests only by TargetVariant) has each of them copied.
    """
    if not shadows:
        return {}
    copies: Copies = {}
    for variant in production:
        shares = []
        for shadow in shadows:
            if shadow.weight <= 0:
                continue
            share = 1.0 if variant.weight <= 0 else min(shadow.weight / variant.weight, 1.0)
            shares.append((shadow, share))
        if shares:
            copies[variant.name] = tuple(shares)
    return copies


BULK_BYTES = 1 << 20
"""Most body bytes one exchange carries (a larger copy goes alone)."""
LINGER_S = 0.001
"""How long a sender waits for more copies before an exchange of fewer than
LINGER_COPIES: an exchange costs the shadow's instance and the gateway a few times what
a copy in it does, and a copy is no one's answer, so it may wait a little."""
LINGER_COPIES = 16
BULK_WORK_S = 0.25
"""About how long the shadow's instance may work on one exchange, by the time its copies
took so far: an exchange of a slow model's copies holds few of them, so one copy that
hangs or fails its instance takes few others with it."""


class _Queue:
    """A shadow's copies waiting for an exchange, the exchanges sending them, and how
    long its copies take the instance (a moving average, seconds)."""

    __slots__ = ("calls", "senders", "copy_s")

    def __init__(self) -> None:
        self.calls: deque[Call] = deque()
        self.senders = 0
        self.copy_s = 0.0


class PendingCopies(dict[tuple[str, str], int]):
    """Per (endpoint, shadow variant), the copies sent and not answered yet: kept by
    the copier, read by the router (``Router.in_flight``), which is built first."""

    def of(self, endpoint: str, shadow: str) -> int:
        return self.get((endpoint, shadow), 0)


class ShadowCopier:
    """Sends copies of production requests to shadow variants and records their outcome.

    Guarantee: ``send`` never blocks and never raises; the copies run as tasks of their
    own. Fails soft: a copy that cannot be sent, fails or times out is an error in the
    shadow's metrics, and one over the ``max_pending`` bound is dropped and counted.
    """

    def __init__(
        self,
        *,
        router: Router,
        max_pending: int,
        dropped: Counter,
        pending: PendingCopies | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.router = router
        self.max_pending = max_pending
        self._dropped = dropped
        self._rng = rng or random.Random()
        self._pending = PendingCopies() if pending is None else pending
        """The copies pending; the router built with ``copies_pending=pending.of``
        counts them as the shadows' requests in flight."""
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"ShadowCopier(max_pending={self.max_pending}, pending={len(self._tasks)})"

    def pending(self, endpoint: str, shadow: str) -> int:
        """The copies sent to ``shadow`` of ``endpoint`` and not answered yet, waiting
        for an exchange or in one (Router.in_flight counts these for a shadow)."""
        return self._pending.of(endpoint, shadow)

    def pick(self, route: EndpointRoute, variant: VariantRoute) -> list[VariantRoute]:
        """The shadows that get a copy of this request to ``variant``, drawn by share."""
        shares = route.copies.get(variant.name)
        if not shares:
            return []
        return [s for s, share in shares if share >= 1.0 or self._rng.random() < share]

    def send(self, route: EndpointRoute, shadows: Sequence[VariantRoute], call: Call) -> None:
        """Start one copy of ``call`` per shadow, or drop it when the shadow is full."""
        for shadow in shadows:
            key = (route.name, shadow.name)
            pending = self._pending.get(key, 0)
            if pending >= self.max_pending:
                self._dropped.labels(route.name, shadow.name).inc()
                continue
            self._pending[key] = pending + 1
            if _together(shadow):
                queue = self._queues.get(key)
                if queue is None:
                    queue = self._queues[key] = _Queue()
                queue.calls.append(call)
                if queue.senders < len(shadow.instances):
                    self._start_sender(route, shadow, key, queue)
            else:
                self._start(self._copy(route, shadow, call, key))

    def _start(self, work: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _start_sender(
        self, route: EndpointRoute, shadow: VariantRoute, key: tuple[str, str], queue: _Queue
    ) -> None:
        queue.senders += 1
        task = self._start(self._drain(route, shadow, key, queue))
        # Its end is counted by a callback, which runs even for a task cancelled before
        # its first step (the gateway stopping at once).
        task.add_done_callback(partial(self._sender_done, route, shadow, key, queue))

    def _sender_done(
        self,
        route: EndpointRoute,
        shadow: VariantRoute,
        key: tuple[str, str],
        queue: _Queue,
        task: asyncio.Task[None],
    ) -> None:
        queue.senders -= 1
        failed = task.cancelled()
        if not failed and (exc := task.exception()) is not None:
            log.error("sending copies to shadow %s failed", shadow.name, exc_info=exc)
            failed = True
        if queue.calls and not failed:
            # Copies made after the sender last looked, with its task already ending.
            self._start_sender(route, shadow, key, queue)
            return
        if queue.senders:
            return  # the others send what waits
        if queue.calls:  # nobody left to send them: the gateway stops
            self._answered(key, len(queue.calls))
            queue.calls.clear()
        if self._queues.get(key) is queue:
            del self._queues[key]

    async def _copy(
        self, route: EndpointRoute, shadow: VariantRoute, call: Call, key: tuple[str, str]
    ) -> None:
        # A copy of its own: the shadow's instance is not the production call's, nor is
        # its session's (a session lives on one production instance; the shadow gets the
        # id and may keep its own state under it).
        copy = call.copy_to(shadow)
        model_s = None
        try:
            response, model_s = await self.router.invoke(route, shadow, copy)
        except RuntimeFailure as exc:
            status = _status_of(exc)
        except Exception:
            log.exception("copy to shadow variant %s of %s failed", shadow.name, route.name)
            status = 500
        else:
            status = response.status
        finally:
            self._answered(key, 1)
        _record(shadow.metrics, status, model_s)

    async def _drain(
        self, route: EndpointRoute, shadow: VariantRoute, key: tuple[str, str], queue: _Queue
    ) -> None:
        """Send the shadow's waiting copies, an exchange at a time, until none wait."""
        calls = queue.calls
        while calls:
            if len(calls) < LINGER_COPIES:
                await asyncio.sleep(LINGER_S)
            room = MAX_COPIES
            if queue.copy_s > 0:
                room = max(1, min(room, int(BULK_WORK_S / queue.copy_s)))
            batch = [calls.popleft()]
            size = len(batch[0].body)  # type: ignore[arg-type]  # copies hold bytes
            while calls and len(batch) < room:
                size += len(calls[0].body)  # type: ignore[arg-type]
                if size > BULK_BYTES:
                    break
                batch.append(calls.popleft())
            try:
                shadow = self.router.current(route, shadow)
            except RuntimeFailure:
                pass  # the exchange fails with it, and counts each copy
            if _together(shadow):
                await self._bulk(route, shadow, key, queue, batch)
            else:  # the shadow was replaced by one that takes copies one by one
                for call in batch:
                    await self._copy(route, shadow, call, key)

    async def _bulk(
        self,
        route: EndpointRoute,
        shadow: VariantRoute,
        key: tuple[str, str],
        queue: _Queue,
        batch: list[Call],
    ) -> None:
        """One exchange of ``batch``'s copies, and each copy's outcome in the metrics."""
        timeout_s = self.router.timeout_s
        outcomes: list[tuple[int, float | None]]
        try:
            body = pack_copies([(c.headers, c.body) for c in batch])  # type: ignore[misc]
            bulk = Call(_BULK_HEADERS, body, variant=shadow, path=COPIES_PATH)
            response, elapsed_s = await self.router.invoke(
                route, shadow, bulk, timeout_s * len(batch)
            )
            if response.status == 404 and bulk.instance is not None:
                # A runtime from before the route (an instance this gateway adopted):
                # this instance gets its copies one by one from now on, these first.
                bulk.instance.takes_copies = False
                self._pending[key] = self._pending.get(key, 0) + len(batch)
                for call in batch:
                    self._start(self._copy(route, shadow, call, key))
                return
            if response.status != 200:
                raise ValueError(f"the copies were answered {response.status}")
            answers = unpack_outcomes(response.body, len(batch))
            # Each copy's latency, as production's is measured from the gateway: the
            # instance's time on it and its share of the exchange around them.
            around_s = max(elapsed_s - sum(s for _, s in answers), 0.0) / len(batch)
            outcomes = [
                (status, seconds + around_s) if seconds <= timeout_s else (504, None)
                for status, seconds in answers
            ]
            for _, seconds in answers:
                queue.copy_s += (seconds - queue.copy_s) * 0.125
        except RuntimeFailure as exc:
            outcomes = [(_status_of(exc), None)] * len(batch)
        except Exception:
            log.exception("copies to shadow variant %s of %s failed", shadow.name, route.name)
            outcomes = [(500, None)] * len(batch)
        finally:
            self._answered(key, len(batch))
        metrics = shadow.metrics
        for status, model_s in outcomes:
            _record(metrics, status, model_s)

    def _answered(self, key: tuple[str, str], count: int) -> None:
        left = self._pending[key] - count
        if left:
            self._pending[key] = left
        else:
            del self._pending[key]

    async def close(self) -> None:
        """Cancel the copies still pending: they are best effort, and the gateway stops."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_BULK_HEADERS = [(b"Content-Type", COPIES_MEDIA_TYPE)]


def _together(shadow: VariantRoute) -> bool:
    """Whether the shadow's copies go together: every instance of it takes them."""
    instances = shadow.instances
    return (
        bool(instances)
        and type(shadow.dispatch) is OneModel
        and all(i.takes_copies for i in instances)
    )


def _status_of(exc: RuntimeFailure) -> int:
    """What the model (or the gateway, for it) answered, as CloudWatch counts it."""
    return exc.original_status_code if isinstance(exc, ModelError) else exc.status_code


def _record(metrics: VariantMetrics, status: int, model_s: float | None) -> None:
    """One copy's outcome in the shadow's metrics; its latency when the instance
    answered it."""
    if model_s is not None:
        metrics.latency.add(model_s, None)
    metrics.invocations.inc()
    if status >= 500:
        metrics.errors_5xx.inc()
    elif status >= 400:
        metrics.errors_4xx.inc()
