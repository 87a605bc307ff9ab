"""Deadlines swept together: they fire (late by at most the resolution, never early),
leave other cancellations alone, and stop sweeping once nothing waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from shipyard.routing.deadlines import Deadlines


def test_an_overdue_call_gets_timeout_error_within_the_resolution() -> None:
    async def main() -> float:
        deadlines = Deadlines(resolution_s=0.05)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadlines.after(0.2):
                await asyncio.sleep(10)
        return time.monotonic() - started

    took = asyncio.run(main())
    assert 0.2 <= took < 0.2 + 0.05 + 0.5  # the last term: a slow machine's scheduling


def test_a_call_done_in_time_is_untouched_and_the_sweep_stops() -> None:
    async def main() -> None:
        deadlines = Deadlines(resolution_s=0.01)
        async with deadlines.after(5) as deadline:
            await asyncio.sleep(0.05)  # a few sweeps pass over a live deadline
        assert not deadline.expired()
        await asyncio.sleep(0.05)
        assert deadlines._sweep_handle is None
        assert not deadlines._live

    asyncio.run(main())


def test_only_the_overdue_ones_of_many_fire() -> None:
    async def call(deadlines: Deadlines, limit: float, work: float) -> str:
        try:
            async with deadlines.after(limit):
                await asyncio.sleep(work)
        except TimeoutError:
            return "timed out"
        return "done"

    async def main() -> list[str]:
        deadlines = Deadlines(resolution_s=0.02)
        return await asyncio.gather(
            call(deadlines, 0.1, 5), call(deadlines, 5, 0.2), call(deadlines, 0.05, 5)
        )

    assert asyncio.run(main()) == ["timed out", "done", "timed out"]


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def main() -> None:
        deadlines = Deadlines(resolution_s=0.01)
        entered = asyncio.Event()

        async def wait() -> None:
            async with deadlines.after(0.05):
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(wait())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)  # the sweep finds nothing left to expire
        assert not deadlines._live

    asyncio.run(main())


def test_a_second_loop_gets_a_deadline_of_its_own() -> None:
    deadlines = Deadlines(resolution_s=0.05)

    async def overdue() -> None:
        async with deadlines.after(0.05):
            await asyncio.sleep(10)

    for _ in range(2):  # the second run is on another loop than the sweep's
        with pytest.raises(TimeoutError):
            asyncio.run(overdue())


def test_a_deadline_is_entered_once() -> None:
    async def main() -> None:
        deadlines = Deadlines(resolution_s=0.05)
        deadline = deadlines.after(5)
        async with deadline:
            with pytest.raises(RuntimeError):
                async with deadline:
                    pass
        with pytest.raises(RuntimeError):
            async with deadline:
                pass

    asyncio.run(main())
