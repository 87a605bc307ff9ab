"""Loops: background loops restarted when they crash and stopped in order."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path

from shipyard.async_inference.consumer import Consumer
from shipyard.background import Loops, Wakeup
from shipyard.metrics import Metrics
from shipyard.records import AsyncRequest, AsyncStatus
from shipyard.routing.invocation import Invocations
from shipyard.routing.router import Router
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.objects import ObjectStore
from tests.conftest import wait_until_async


def test_a_loop_that_raises_is_started_again_and_one_that_returns_is_done() -> None:
    starts: list[str] = []

    async def flaky() -> None:
        starts.append("flaky")
        if starts.count("flaky") < 3:
            raise RuntimeError("not yet")
        await asyncio.Event().wait()  # then runs until stopped

    async def once() -> None:
        starts.append("once")

    async def main() -> None:
        loops = Loops(first_backoff_s=0.01, max_backoff_s=0.02)
        loops.start("flaky", flaky)
        loops.start("once", once)
        await wait_until_async(lambda: starts.count("flaky") == 3, "the third start of flaky")
        await wait_until_async(lambda: not loops.running("once"), "once done")
        assert loops.restarts("flaky") == 2 and loops.running("flaky")
        assert loops.restarts("once") == 0 and starts.count("once") == 1
        await loops.stop()
        assert not loops.running("flaky")

    asyncio.run(main())


def test_loops_stop_in_the_reverse_order_of_their_start() -> None:
    running: list[str] = []
    stopped: list[str] = []

    def forever(name: str):  # type: ignore[no-untyped-def]
        async def run() -> None:
            running.append(name)
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0.01)  # a stop that takes a moment still keeps order
                stopped.append(name)

        return run

    async def main() -> None:
        loops = Loops()
        for name in ("reconciler", "dispatcher", "consumer"):
            loops.start(name, forever(name))
        await wait_until_async(lambda: len(running) == 3, "all three loops running")
        await loops.stop()

    asyncio.run(main())
    assert stopped == ["consumer", "dispatcher", "reconciler"]


def test_the_async_consumer_survives_a_database_that_is_not_ready_at_start(
    tmp_path: Path,
) -> None:
    """Its first step (taking back what a previous run held) fails on a missing schema;
    once the schema exists it runs, instead of having ended for good."""

    class HeldQueue(AsyncQueue):
        """Its start waits while the test sets the database up: a start between the
        schema's creation and the left-behind request would find nothing to put back."""

        setting_up = threading.Lock()

        def release_owned(self, owner: str) -> int:
            with self.setting_up:
                return super().release_owned(owner)

    store = MetadataStore(f"sqlite:///{tmp_path / 'late.db'}")
    consumer = Consumer(
        queue=HeldQueue(store.engine),
        invocations=Invocations(Router(timeout_s=5)),
        objects=ObjectStore(),
        metrics=Metrics(),
        owner="test",
        region="us-east-1",
        account_id="123456789012",
        on_event=lambda: None,
        poll_period_s=0.01,
    )

    queue = consumer.queue

    def held_by_a_previous_run() -> None:
        """A request this owner was running when it died, which a started consumer
        puts back in the queue: the sign that its start went through."""
        with HeldQueue.setting_up:
            store.migrate()
            at = now()
            queue.enqueue(
                AsyncRequest(
                    endpoint="ep",
                    inference_id="left-behind",
                    input_location="file:///nowhere/in",
                    output_location="file:///nowhere/out",
                    failure_location="file:///nowhere/failed",
                    received=at,
                    expires=at + timedelta(hours=1),
                    invocation_timeout_s=60,
                )
            )
            claimed = queue.claim("ep", owner="test", limit=1, now=at, lease_s=30)
            assert [r.inference_id for r in claimed] == ["left-behind"]

    def status() -> AsyncStatus:
        return queue.get("ep", "left-behind").status

    async def main() -> None:
        loops = Loops(first_backoff_s=0.05, max_backoff_s=0.1)
        loops.start("async-consumer", consumer.run)
        await wait_until_async(lambda: loops.restarts("async-consumer") >= 1, "a restart")
        await asyncio.to_thread(held_by_a_previous_run)
        await wait_until_async(lambda: status() is AsyncStatus.QUEUED, "the request queued")
        assert loops.running("async-consumer")
        await loops.stop()

    try:
        asyncio.run(main())
    finally:
        store.close()


def test_a_wakeup_set_from_another_thread_wakes_the_loop() -> None:
    wakeup = Wakeup()

    async def main() -> tuple[bool, bool]:
        wakeup.bind()
        threading.Timer(0.05, wakeup.set).start()
        woken = await wakeup.wait(10.0)  # returns as soon as the thread sets it
        again = await wakeup.wait(0.01)  # cleared by the wait that saw it
        return woken, again

    assert asyncio.run(main()) == (True, False)


def test_a_wakeup_set_before_its_loop_runs_is_seen() -> None:
    wakeup = Wakeup()
    wakeup.set()
    assert asyncio.run(wakeup.wait(0.01)) is True
