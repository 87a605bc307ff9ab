"""Dispatcher: delivers recorded events to their subscribers, once per subscriber.

Procedure, for each due event (``run`` settles each in a task of its own, so a slow
subscriber holds back no other event; ``dispatch_once`` does one batch and waits):

1. Lease up to ``batch_size`` due events (``EventLog.claim_due``).
2. Resolve each event's targets to subscribers (``Topics.resolve``). An unknown topic
   gets a final 'failed' row and one error in the log; it is never retried.
3. For each subscriber, read its delivery row and decide (``_next_step``): nothing to do
   ('sent', or given up), wait (another dispatcher's fresh 'sending' row), or send.
   Sending first commits the row as 'sending' (an insert, or a compare-and-set on
   ``(status, attempts)``), so of two dispatchers only one sends; then it sends and
   commits 'sent', or 'failed' with the reason.
4. An event whose subscribers are all settled gets ``dispatched_at``. Any other is
   rescheduled after ``backoff_base_s * 2**passes`` (capped at ``backoff_max_s``), and
   its failed subscribers are tried again then, up to ``max_attempts`` each.

Guarantees: a subscriber gets an event at most once per committed 'sending' row, and a
row is only sent again when its attempt failed or its lease passed with no outcome.
Recording an event twice, running two passes or two dispatchers (two gateways on one
database) over it never sends it twice.

The one at-least-once window: a dispatcher that dies (or loses the database) after the
subscriber accepted and before 'sent' is committed leaves a 'sending' row; once
``lease_s`` has passed, it is sent again. The ``X-Shipyard-Delivery-Key`` header (the
event key) lets receivers drop that duplicate. ``lease_s`` must therefore exceed the
longest send (apprise's timeouts: well under a minute), or a slow send is repeated.

Failure modes: a database error fails the pass, which ``run`` logs and retries after
``poll_period_s``; leased events come back after ``lease_s`` (so after a crash, the
events the dead gateway held wait that long). Cancelling ``run`` lets the pass under
way record its outcomes for up to ``drain_s`` first, so a clean shutdown does not
open the window above. A subscriber that never accepts ends 'failed' after
``max_attempts`` and is logged as an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import ParamSpec, TypeVar

from shipyard.background import Wakeup
from shipyard.errors import DeliveryError
from shipyard.events.notify import Notifier
from shipyard.events.topics import Subscriber, Topics
from shipyard.records import Event
from shipyard.storage.events import (
    Delivery,
    DeliveryStatus,
    EventLog,
    EventState,
    subscriber_key,
)

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
P = ParamSpec("P")
R = TypeVar("R")


def utcnow() -> datetime:
    return datetime.now(UTC)


class _Step(Enum):
    SEND = "send"
    RETRY = "retry"
    DONE = "done"
    WAIT = "wait"
    GIVE_UP = "give up"


def _next_step(row: Delivery | None, *, now: datetime, lease_s: float, max_attempts: int) -> _Step:
    """What to do for one subscriber, given its delivery row."""
    if row is None:
        return _Step.SEND
    if row.status is DeliveryStatus.SENT:
        return _Step.DONE
    if row.status is DeliveryStatus.FAILED:
        return _Step.RETRY if 0 < row.attempts < max_attempts else _Step.DONE
    if row.updated + timedelta(seconds=lease_s) > now:
        return _Step.WAIT
    return _Step.RETRY if row.attempts < max_attempts else _Step.GIVE_UP


class Dispatcher:
    """Delivers pending events with retries and backoff; see the module docstring."""

    batch_size = 32
    """Events leased per pass; a full batch makes ``run`` start the next pass at once."""
    drain_s = 10.0
    """How long a cancelled ``run`` waits for the deliveries under way to record outcomes."""

    def __init__(
        self,
        *,
        log: EventLog,
        topics: Topics,
        notifier: Notifier,
        poll_period_s: float = 1.0,
        lease_s: float = 60,
        max_attempts: int = 10,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 300,
        clock: Clock = utcnow,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts: must be at least 1")
        self._log = log
        self._topics = topics
        self._notifier = notifier
        self._poll_period_s = poll_period_s
        self._lease_s = lease_s
        self._max_attempts = max_attempts
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._wake = Wakeup()

    def __repr__(self) -> str:
        return f"Dispatcher(log={self._log!r}, topics={self._topics!r})"

    def wake(self) -> None:
        """Make ``run`` look for due events now rather than at its next poll.

        Safe to call from any thread, e.g. right after committing an event.
        """
        self._wake.set()

    async def run(self) -> None:
        """Dispatch until cancelled: look for due events every ``poll_period_s``, or at
        once on wake, and settle each in a task of its own.

        No event waits for another: a subscriber that takes its whole read timeout to
        answer (or never does) holds back its own event alone, not the events recorded
        meanwhile (an alarm's notification waited behind a hanging webhook for longer
        than the 30 s its reader allowed). At most ``batch_size`` events are worked on
        at once; the lease keeps an event from being claimed twice while it is. A failed
        look is logged and retried; only cancellation ends the loop, after letting the
        deliveries under way record their outcomes for up to ``drain_s``.
        """
        self._wake.bind()
        await _db(self._log.release_claims)
        working: set[asyncio.Future[None]] = set()
        try:
            while True:
                room = self.batch_size - len(working)
                claimed = await self._claim_some(room) if room > 0 else []
                for state in claimed:
                    task = asyncio.ensure_future(self._settle(state))
                    working.add(task)
                    task.add_done_callback(self._done(working))
                if room <= 0 or len(claimed) < room:
                    await self._wake.wait(self._poll_period_s)
        except asyncio.CancelledError:
            await self._drain(working)
            raise

    def _done(self, working: set[asyncio.Future[None]]) -> Callable[[asyncio.Future[None]], None]:
        def done(task: asyncio.Future[None]) -> None:
            working.discard(task)
            self._wake.set()  # room for another event

        return done

    async def _claim_some(self, limit: int) -> list[EventState]:
        try:
            return await _db(
                self._log.claim_due, now=self._clock(), lease_s=self._lease_s, limit=limit
            )
        except Exception:
            log.exception("Event dispatch failed; retrying in %.1fs", self._poll_period_s)
            return []

    async def _drain(self, working: set[asyncio.Future[None]]) -> None:
        """Let the deliveries under way record their outcomes, for up to ``drain_s``.

        A send cut short by shutdown would leave a 'sending' row and be sent again after
        the restart; letting it commit its outcome keeps restarts from duplicating.
        """
        if not working:
            return
        _, late = await asyncio.wait(set(working), timeout=self.drain_s)
        for task in late:
            task.cancel()

    async def dispatch_once(self) -> int:
        """One pass over the events due now; returns how many it worked on."""
        claimed = await _db(
            self._log.claim_due, now=self._clock(), lease_s=self._lease_s, limit=self.batch_size
        )
        if claimed:
            await asyncio.gather(*(self._settle(state) for state in claimed))
        return len(claimed)

    def backoff_s(self, passes: int) -> float:
        """Delay before the next pass over an event that has had ``passes`` failed ones."""
        return float(min(self._backoff_max_s, self._backoff_base_s * 2 ** min(passes, 30)))

    async def _settle(self, state: EventState) -> None:
        event = state.event
        assert event.id is not None
        try:
            settled = await self._deliver_all(event)
        except Exception:
            log.exception("Event %s: dispatch failed; trying again later", event.key)
            settled = False
        try:
            if settled:
                await _db(self._log.mark_dispatched, event.id, now=self._clock())
            else:
                at = self._clock() + timedelta(seconds=self.backoff_s(state.attempts))
                await _db(self._log.reschedule, event.id, at=at)
        except Exception:
            log.exception("Event %s: could not record its progress", event.key)

    async def _deliver_all(self, event: Event) -> bool:
        """Deliver to every subscriber; True when all are settled."""
        resolution = self._topics.resolve(event.topics)
        if resolution.subscribers:
            # Only a delivery needs apprise: a gateway whose events go to nobody never
            # imports it (with its plugins, a fifth to half a second of CPU).
            await self._notifier.load()
        rows = {d.subscriber: d for d in await _db(self._log.deliveries, event.key)}
        for target in resolution.unknown:
            await self._refuse(event, target)
        outcomes = await asyncio.gather(
            *(
                self._deliver(event, s, rows.get(subscriber_key(s.url)))
                for s in resolution.subscribers
            ),
            return_exceptions=True,
        )
        for subscriber, outcome in zip(resolution.subscribers, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log.error(
                    "Event %s: delivery to %s failed",
                    event.key,
                    self._notifier.redact(subscriber.url),
                    exc_info=outcome,
                )
            elif isinstance(outcome, BaseException):
                raise outcome
        return all(outcome is True for outcome in outcomes)

    async def _deliver(self, event: Event, subscriber: Subscriber, row: Delivery | None) -> bool:
        """Bring one subscriber forward; True once it is settled."""
        now = self._clock()
        step = _next_step(row, now=now, lease_s=self._lease_s, max_attempts=self._max_attempts)
        if step is _Step.DONE:
            return True
        if step is _Step.WAIT:
            return False
        if row is not None and step is _Step.GIVE_UP:
            error = row.last_error or "no outcome recorded for the last attempt"
            await _db(self._log.finish_delivery, row, error=error, now=now)
            log.error("Event %s: gave up on %s: %s", event.key, row.target, error)
            return True
        sending = await self._claim(event, subscriber, row, now)
        if sending is None:
            return False
        return await self._send(event, subscriber, sending)

    async def _claim(
        self, event: Event, subscriber: Subscriber, row: Delivery | None, now: datetime
    ) -> Delivery | None:
        """Commit the subscriber's row as 'sending'; None when another dispatcher won."""
        if row is not None:
            sending = replace(row, status=DeliveryStatus.SENDING, attempts=row.attempts + 1)
            won = await _db(self._log.restart_delivery, row, now=now)
        else:
            sending = Delivery(
                event_key=event.key,
                subscriber=subscriber_key(subscriber.url),
                target=self._notifier.redact(subscriber.url),
                topic=subscriber.topic,
                status=DeliveryStatus.SENDING,
                attempts=1,
                last_error=None,
                updated=now,
            )
            won = await _db(self._log.add_delivery, sending)
        return sending if won else None

    async def _send(self, event: Event, subscriber: Subscriber, sending: Delivery) -> bool:
        """Send, then commit the outcome; True when the subscriber is settled."""
        error: str | None = None
        try:
            await self._notifier.send(
                subscriber.url, title=event.subject, body=event.message, key=event.key
            )
        except DeliveryError as exc:
            error = str(exc)
        if not await _db(self._log.finish_delivery, sending, error=error, now=self._clock()):
            log.warning("Event %s: %s was taken over while sending", event.key, sending.target)
        if error is None:
            return True
        if sending.attempts < self._max_attempts:
            log.warning("Event %s: %s failed: %s", event.key, sending.target, error)
            return False
        log.error("Event %s: gave up on %s: %s", event.key, sending.target, error)
        return True

    async def _refuse(self, event: Event, target: str) -> None:
        """Record an unknown topic as a final failure, logged once, never retried."""
        error = f"Unknown topic {target!r}: not delivered"
        refused = Delivery(
            event_key=event.key,
            subscriber=subscriber_key(target),
            target=target,
            topic=target,
            status=DeliveryStatus.FAILED,
            attempts=0,
            last_error=error,
            updated=self._clock(),
        )
        if await _db(self._log.add_delivery, refused):
            log.error("Event %s: %s", event.key, error)


async def _db(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a blocking EventLog call in a worker thread, off the event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)
