"""Deadlines swept together: they fire (late by at most the resolution, never early),
leave the others alone, and stop sweeping once nothing is watched."""

from __future__ import annotations

import asyncio

from shipyard.routing.deadlines import Deadlines


class Entry:
    """What the router's requests give the sweep: a deadline and what expiring does."""

    def __init__(self, when: float) -> None:
        self.when = when
        self.expired: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def expire(self, now: float) -> None:
        self.expired.set_result(now)


def test_an_overdue_entry_expires_within_the_resolution_never_before() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(resolution_s=0.05)
        entry = Entry(loop.time() + 0.2)
        assert deadlines.watch(entry) and deadlines.watched() == 1
        now = await asyncio.wait_for(entry.expired, 5)
        assert now >= entry.when
        assert deadlines.watched() == 0

    asyncio.run(main())


def test_a_dropped_entry_is_untouched_and_the_sweep_stops() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(resolution_s=0.01)
        entry = Entry(loop.time() + 0.03)
        deadlines.watch(entry)
        deadlines.drop(entry)
        later = Entry(loop.time() + 0.1)  # a sentinel watched after it, expired last
        deadlines.watch(later)
        await asyncio.wait_for(later.expired, 5)
        assert not entry.expired.done()
        assert deadlines.watched() == 0 and deadlines._sweep_handle is None

    asyncio.run(main())


def test_only_the_overdue_ones_of_many_expire() -> None:
    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(resolution_s=0.02)
        entries = [Entry(loop.time() + s) for s in (0.1, 30, 0.05)]
        for entry in entries:
            deadlines.watch(entry)
        await asyncio.wait_for(asyncio.gather(entries[0].expired, entries[2].expired), 5)
        assert deadlines.watched() == 1
        deadlines.drop(entries[1])
        return [entry.expired.done() for entry in entries]

    assert asyncio.run(main()) == [True, False, True]


def test_a_fault_expiring_one_entry_does_not_keep_the_others() -> None:
    class Faulty(Entry):
        def expire(self, now: float) -> None:
            raise RuntimeError("a fault in expire")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(resolution_s=0.02)
        faulty, entry = Faulty(loop.time() + 0.03), Entry(loop.time() + 0.03)
        deadlines.watch(faulty)
        deadlines.watch(entry)
        await asyncio.wait_for(entry.expired, 5)
        assert deadlines.watched() == 0

    asyncio.run(main())


def test_a_second_loop_is_declined() -> None:
    deadlines = Deadlines(resolution_s=0.05)

    async def watch() -> bool:
        return deadlines.watch(Entry(asyncio.get_running_loop().time() + 30))

    assert asyncio.run(watch())  # the sweep's loop
    assert not asyncio.run(watch())  # another: its caller sets a timer of its own
