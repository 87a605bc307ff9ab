"""Dispatcher: exactly one notification per subscriber, against real stores and receivers."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shipyard.events.dispatcher import Dispatcher
from shipyard.events.notify import DELIVERY_KEY_HEADER, Notifier
from shipyard.events.topics import Topics
from shipyard.storage.events import DeliveryStatus, EventLog, EventState
from shipyard.storage.metadata import MetadataStore
from tests.conftest import wait_until_async
from tests.events.conftest import FakeClock, make_event, sending_row
from tests.listeners import SmtpListener, WebhookListener

KEY = DELIVERY_KEY_HEADER.lower()


@pytest.fixture
def failing() -> Iterator[WebhookListener]:
    """A webhook receiver that answers 500 to everything."""
    listener = WebhookListener()
    listener.fail_next(10_000)
    yield listener
    listener.close()


@pytest.fixture
def dispatcher_factory(store: MetadataStore, clock: FakeClock) -> Callable[..., Dispatcher]:
    def create(topics: dict[str, list[str]] | None = None, **kwargs: Any) -> Dispatcher:
        options: dict[str, Any] = {"clock": clock, "backoff_base_s": 1.0, **kwargs}
        log = options.pop("log", None) or EventLog(store.engine)
        return Dispatcher(log=log, topics=Topics(topics or {}), notifier=Notifier(), **options)

    return create


def once(dispatcher: Dispatcher) -> int:
    return asyncio.run(dispatcher.dispatch_once())


def test_one_event_is_one_post_with_its_title_body_and_key(
    store: MetadataStore, clock: FakeClock, webhook: WebhookListener, dispatcher_factory: Any
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("job/a/Completed", topics=("done",), time=clock()))
    dispatcher = dispatcher_factory({"done": [webhook.url + "/hook"]})
    assert once(dispatcher) == 1
    [request] = webhook.wait_for(1)
    assert request.path == "/hook" and request.headers[KEY] == "job/a/Completed"
    assert request.body["title"] == "Job job/a/Completed completed"
    assert request.body["message"].startswith("Job job/a/Completed completed in 3 s")
    [delivery] = log.deliveries("job/a/Completed")
    assert (delivery.status, delivery.attempts, delivery.topic) == (DeliveryStatus.SENT, 1, "done")
    assert delivery.target.startswith("json://127.0.0.1")
    assert log.pending_count() == 0


def test_an_event_recorded_twice_is_announced_once(
    store: MetadataStore, clock: FakeClock, webhook: WebhookListener, dispatcher_factory: Any
) -> None:
    log = EventLog(store.engine)
    assert log.record(make_event("k", topics=(webhook.url,), time=clock()))
    assert not log.record(make_event("k", topics=(webhook.url,), time=clock()))
    assert len(log.list_events()) == 1
    once(dispatcher_factory())
    clock.advance(3600)
    assert once(dispatcher_factory()) == 0
    assert len(webhook.wait_for(1)) == 1


def test_two_passes_and_two_dispatchers_announce_once(
    store_factory: Callable[[], MetadataStore],
    clock: FakeClock,
    webhook: WebhookListener,
    dispatcher_factory: Any,
) -> None:
    """Two gateways on one database, racing, then each running a second pass."""
    EventLog(store_factory().engine).record(make_event("k", topics=(webhook.url,), time=clock()))
    first = dispatcher_factory(log=EventLog(store_factory().engine))
    second = dispatcher_factory(log=EventLog(store_factory().engine))

    async def race() -> list[int]:
        return list(await asyncio.gather(first.dispatch_once(), second.dispatch_once()))

    assert sorted(asyncio.run(race())) == [0, 1]
    clock.advance(3600)
    assert asyncio.run(race()) == [0, 0]
    assert len(webhook.wait_for(1)) == 1


def test_a_subscriber_that_fails_twice_is_retried_with_backoff_and_gets_it_once(
    store: MetadataStore, clock: FakeClock, webhook: WebhookListener, dispatcher_factory: Any
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", topics=(webhook.url,), time=clock()))
    dispatcher = dispatcher_factory(backoff_base_s=10)
    webhook.fail_next(2)
    assert once(dispatcher) == 1
    assert once(dispatcher) == 0, "not due before the first backoff (10 s)"
    clock.advance(10)
    assert once(dispatcher) == 1
    clock.advance(19)
    assert once(dispatcher) == 0, "the second backoff doubles (20 s)"
    clock.advance(1)
    assert once(dispatcher) == 1
    requests = webhook.wait_for(3)
    assert [r.status for r in requests] == [500, 500, 200]
    assert {r.headers[KEY] for r in requests} == {"k"}
    [delivery] = log.deliveries("k")
    assert (delivery.status, delivery.attempts, delivery.last_error) == (
        DeliveryStatus.SENT,
        3,
        None,
    )
    assert log.pending_count() == 0


def test_a_sending_row_left_by_a_crashed_dispatcher_is_sent_again_once(
    store: MetadataStore, clock: FakeClock, webhook: WebhookListener, dispatcher_factory: Any
) -> None:
    """A dispatcher committed 'sending', then died before the outcome; its lease passed."""
    log = EventLog(store.engine)
    log.record(make_event("k", topics=(webhook.url,), time=clock()))
    crashed_at = clock() - timedelta(seconds=61)
    assert log.add_delivery(sending_row("k", webhook.url, at=crashed_at))
    once(dispatcher_factory(lease_s=60))
    clock.advance(3600)
    once(dispatcher_factory(lease_s=60))
    assert [r.headers[KEY] for r in webhook.wait_for(1)] == ["k"]
    [delivery] = log.deliveries("k")
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.SENT, 2)


def test_a_sending_row_within_its_lease_is_left_to_its_dispatcher(
    store: MetadataStore, clock: FakeClock, webhook: WebhookListener, dispatcher_factory: Any
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", topics=(webhook.url,), time=clock()))
    assert log.add_delivery(sending_row("k", webhook.url, at=clock()))
    assert once(dispatcher_factory(lease_s=60)) == 1
    assert webhook.requests == []
    [state] = log.list_events()
    assert state.dispatched_at is None and state.attempts == 1


def test_one_failing_subscriber_among_three_gives_up_and_the_others_get_one_each(
    store: MetadataStore,
    clock: FakeClock,
    webhook: WebhookListener,
    failing: WebhookListener,
    dispatcher_factory: Any,
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", topics=("a", "b"), time=clock()))
    topics = {"a": [webhook.url + "/a", failing.url + "/bad"], "b": [webhook.url + "/b"]}
    dispatcher = dispatcher_factory(topics, max_attempts=3, backoff_base_s=1)
    for _ in range(6):
        once(dispatcher)
        clock.advance(300)
    assert Counter(r.path for r in webhook.requests) == {"/a": 1, "/b": 1}
    assert len(failing.requests) == 3
    by_topic = {(d.topic, d.status, d.attempts) for d in log.deliveries("k")}
    assert by_topic == {
        ("a", DeliveryStatus.SENT, 1),
        ("a", DeliveryStatus.FAILED, 3),
        ("b", DeliveryStatus.SENT, 1),
    }
    assert log.pending_count() == 0


def test_an_unknown_topic_is_a_failed_delivery_and_never_retried(
    store: MetadataStore, clock: FakeClock, webhook: WebhookListener, dispatcher_factory: Any
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", topics=("nope", webhook.url), time=clock()))
    assert once(dispatcher_factory()) == 1
    clock.advance(3600)
    assert once(dispatcher_factory()) == 0
    assert len(webhook.wait_for(1)) == 1
    refused = next(d for d in log.deliveries("k") if d.topic == "nope")
    assert refused.status is DeliveryStatus.FAILED
    assert refused.last_error == "Unknown topic 'nope': not delivered"
    assert log.pending_count() == 0


def test_an_event_without_topics_is_settled_at_once(
    store: MetadataStore, clock: FakeClock, dispatcher_factory: Any
) -> None:
    log = EventLog(store.engine)
    log.record(make_event("k", time=clock()))
    assert once(dispatcher_factory()) == 1
    assert log.pending_count() == 0 and log.deliveries("k") == []


_DISPATCH_TO_NOBODY = """
import asyncio, sys
from shipyard.events.dispatcher import Dispatcher
from shipyard.events.notify import Notifier
from shipyard.events.topics import Topics
from shipyard.storage.events import EventLog
from shipyard.storage.metadata import MetadataStore
from tests.events.conftest import make_event

store = MetadataStore(sys.argv[1])
store.migrate()
log = EventLog(store.engine)
log.record(make_event("k"))
log.record(make_event("unknown", topics=("nope",)))
dispatcher = Dispatcher(log=log, topics=Topics({}), notifier=Notifier())
assert asyncio.run(dispatcher.dispatch_once()) == 2
assert log.pending_count() == 0
print("apprise" in sys.modules)
"""


@pytest.mark.processes  # a fresh interpreter, as a start is
def test_a_gateway_whose_events_go_to_nobody_never_imports_apprise(tmp_path: Path) -> None:
    """apprise and its plugins cost a fifth to half a second of CPU to import: paid by
    the first delivery, not by the first event (a job's first state change, beside it)."""
    done = subprocess.run(
        [sys.executable, "-c", _DISPATCH_TO_NOBODY, f"sqlite:///{tmp_path / 'meta.db'}"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_an_sns_arn_target_reaches_the_topic_by_webhook_and_email(
    store: MetadataStore,
    clock: FakeClock,
    webhook: WebhookListener,
    smtp: SmtpListener,
    dispatcher_factory: Any,
) -> None:
    log = EventLog(store.engine)
    arn = "arn:aws:sns:us-east-1:123456789012:done"
    log.record(make_event("k", topics=(arn,), time=clock()))
    once(dispatcher_factory({"done": [webhook.url + "/hook", smtp.mailto()]}))
    assert webhook.wait_for(1)[0].headers[KEY] == "k"
    [message] = smtp.wait_for(1)
    assert message.subject == "Job k completed"
    assert "output at file:///out/a." in message.body


def test_run_sends_as_soon_as_it_is_woken_and_finishes_the_send_when_cancelled(
    store: MetadataStore, webhook: WebhookListener
) -> None:
    """The poll period is far longer than the test: only wake() can explain the send.

    The cancel lands while the send is under way; the pass still records the outcome, so
    a restart would not send it again.
    """

    class CountedLog(EventLog):
        passes = 0

        def claim_due(self, **kwargs: Any) -> list[EventState]:
            claimed = super().claim_due(**kwargs)
            self.passes += 1
            return claimed

    log = CountedLog(store.engine)
    dispatcher = Dispatcher(log=log, topics=Topics(), notifier=Notifier(), poll_period_s=600)

    def record_and_wake() -> None:
        log.record(make_event("k", topics=(webhook.url,)))
        dispatcher.wake()

    async def main() -> None:
        task = asyncio.create_task(dispatcher.run(), name="dispatcher")
        # Its first pass found nothing; the next one is 600 s away unless woken.
        await wait_until_async(lambda: log.passes == 1, "the first pass")
        await asyncio.to_thread(record_and_wake)
        await asyncio.to_thread(webhook.wait_for, 1, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert log.pending_count() == 0


def test_two_gateways_racing_over_fifty_events_send_each_once(
    store_factory: Callable[[], MetadataStore], webhook: WebhookListener
) -> None:
    recorder = EventLog(store_factory().engine)
    for i in range(50):
        recorder.record(make_event(f"job/{i}/Completed", topics=("done",)))
    topics = Topics({"done": [webhook.url + "/one", webhook.url + "/two"]})
    dispatchers = [
        Dispatcher(
            log=EventLog(store_factory().engine),
            topics=topics,
            notifier=Notifier(),
            poll_period_s=0.01,
        )
        for _ in range(2)
    ]
    for dispatcher in dispatchers:
        dispatcher.batch_size = 4

    async def main() -> None:
        tasks = [asyncio.create_task(d.run()) for d in dispatchers]
        await asyncio.to_thread(webhook.wait_for, 100, 30)
        while await asyncio.to_thread(recorder.pending_count):
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    sent = Counter((r.path, r.headers[KEY]) for r in webhook.requests)
    assert len(sent) == 100 and set(sent.values()) == {1}


def test_a_failed_pass_is_logged_and_run_keeps_going(
    store: MetadataStore, webhook: WebhookListener, caplog: pytest.LogCaptureFixture
) -> None:
    class FlakyLog(EventLog):
        failures = 1

        def claim_due(self, **kwargs: Any) -> Any:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("database went away")
            return super().claim_due(**kwargs)

    log = FlakyLog(store.engine)
    log.record(make_event("k", topics=(webhook.url,)))
    dispatcher = Dispatcher(log=log, topics=Topics(), notifier=Notifier(), poll_period_s=0.01)

    async def main() -> None:
        task = asyncio.create_task(dispatcher.run())
        await asyncio.to_thread(webhook.wait_for, 1, 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert "database went away" in caplog.text


def test_backoff_doubles_up_to_its_cap(store: MetadataStore) -> None:
    dispatcher = Dispatcher(
        log=EventLog(store.engine),
        topics=Topics(),
        notifier=Notifier(),
        backoff_base_s=1.5,
        backoff_max_s=300,
    )
    assert [dispatcher.backoff_s(n) for n in (0, 1, 3, 8, 1000)] == [1.5, 3.0, 12.0, 300, 300]


def test_a_subscriber_that_never_answers_holds_back_no_other_event(
    store: MetadataStore, webhook: WebhookListener
) -> None:
    """An alarm's notification must not wait for another event's hanging webhook.

    The hanging subscriber is a socket that listens and never answers: the kernel takes
    the connection and the request, and the send waits for its read timeout (a minute
    here). While it does, an event recorded to a working webhook is delivered at once.
    """
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    slow_url = f"http://127.0.0.1:{hanging.getsockname()[1]}"
    log = EventLog(store.engine)
    dispatcher = Dispatcher(
        log=log, topics=Topics(), notifier=Notifier(read_timeout_s=60), poll_period_s=600
    )
    dispatcher.drain_s = 0.1

    def sending(key: str) -> bool:
        return [d.status for d in log.deliveries(key)] == [DeliveryStatus.SENDING]

    async def main() -> None:
        task = asyncio.create_task(dispatcher.run(), name="dispatcher")
        try:
            await asyncio.to_thread(log.record, make_event("slow", topics=(slow_url,)))
            dispatcher.wake()
            await wait_until_async(lambda: sending("slow"), "the hanging send under way")
            await asyncio.to_thread(log.record, make_event("alarm", topics=(webhook.url,)))
            dispatcher.wake()
            got = await asyncio.to_thread(webhook.wait_for, 1, 10)
            assert got[0].headers[KEY] == "alarm"
            assert sending("slow")  # still waiting for its answer
        finally:
            # Closing the listener resets the connection it never accepted: the send
            # in its worker thread ends now, not at its read timeout, which
            # asyncio.run would otherwise wait out before it returns.
            hanging.close()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        asyncio.run(main())
    finally:
        hanging.close()
