"""ServerlessUse on a real store: on a gateway whose requests wait for another's
serverless variant, a failed cold start written by the holder fails them at its next
write; on the holder, a failure is written for the rows it had read, and the others' use
keeps warm the instances it was on."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import update

from shipyard.backends.base import InstanceSpec
from shipyard.control.serverless_use import ServerlessUse
from shipyard.errors import Throttling
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, Slot
from shipyard.records import EndpointConfig, RoutingStrategy, ServerlessConfig, VariantSpec
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.serverless import ServerlessAdmission
from shipyard.routing.table import EndpointRoute, VariantRoute
from shipyard.storage import tables as t
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.serverless_use import ServerlessUseStore, Use

Told = tuple[str, str, str, float]


async def _until(check: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def _holder_reads(meta: MetadataStore) -> dict[tuple[str, str, str], int]:
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    return {(u.endpoint, u.variant, u.gateway): u.uses for u in holder.read(["e"])}


def _holder_fails(meta: MetadataStore, reason: str, seen: dict | None = None) -> None:
    """What the holder writes when the cold start it made for what it read (``seen``,
    else the rows as they are now) fails."""
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    holder.fail(_holder_reads(meta) if seen is None else seen, reason)


@contextlib.asynccontextmanager
async def _running(
    store: ServerlessUseStore,
) -> AsyncIterator[tuple[ServerlessUse, list[Told], ServerlessUseStore]]:
    """A gateway's ServerlessUse on ``store``, running; what it failed, as it told it;
    and a store to read the rows with."""
    failed: list[Told] = []
    use = ServerlessUse(store, period_s=0.05, keep_s=60, fail=lambda *told: failed.append(told))
    runner = asyncio.create_task(use.run())
    try:
        yield use, failed, ServerlessUseStore(store.engine, gateway="reader")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def _asked(use: ServerlessUse, reader: ServerlessUseStore, uses: int) -> tuple[float, float]:
    """Ask once more; the times between which the ask was made and written as ``uses``."""
    before = time.monotonic()
    use.ask("e", "v1", 1)
    await _until(lambda: [u.uses for u in reader.read(["e"])] == [uses])
    return before, time.monotonic()


class _Writer:
    """A gateway's ServerlessUse writing for requests that wait, as its router asks."""

    def __init__(self, meta: MetadataStore, keep_s: float = 60.0) -> None:
        self.failed: list[Told] = []
        self.use = ServerlessUse(
            ServerlessUseStore(meta.engine, gateway="a"),
            period_s=0.05,
            keep_s=keep_s,
            fail=lambda *told: self.failed.append(told),
        )
        self.reader = ServerlessUseStore(meta.engine, gateway="reader")

    async def written(self, uses: int) -> tuple[float, float]:
        """Ask once more; return the times between which the ask was made and written."""
        return await _asked(self.use, self.reader, uses)


def test_waiting_requests_fail_with_the_holders_failure_of_their_ask(meta: MetadataStore) -> None:
    async def main() -> None:
        writer = _Writer(meta)
        runner = asyncio.create_task(writer.use.run())
        try:
            await writer.written(1)
            before, after = await writer.written(2)
            await asyncio.to_thread(_holder_fails, meta, "the weights are gone")
            assert writer.failed == []  # nothing read back yet
            await writer.written(3)
            await _until(lambda: writer.failed)
            ((endpoint, variant, reason, began_by),) = writer.failed
            assert (endpoint, variant, reason) == ("e", "v1", "the weights are gone")
            assert before <= began_by <= after, "those waiting by the ask it was made for"
            await writer.written(4)
            # Written in turn: once 5 is stored, what 4 read back has been told.
            await writer.written(5)
            assert len(writer.failed) == 1, "told once"
            # The row's count passes the wrap between the failed write and its read-back.
            with meta.engine.begin() as conn:
                conn.execute(update(t.serverless_use).values(uses=999_999_998))
            await writer.written(999_999_999)
            before, after = await writer.written(1_000_000_000)
            await asyncio.to_thread(_holder_fails, meta, "again")
            await writer.written(1)
            await _until(lambda: len(writer.failed) == 2)
            assert writer.failed[1][2] == "again"
            assert before <= writer.failed[1][3] <= after
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())


class _SlowNote(ServerlessUseStore):
    """A gateway's store whose writes take a while: asks made meanwhile miss them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.writing = threading.Event()

    def note(self, *args: Any, **kwargs: Any) -> dict[tuple[str, str], Use]:
        self.writing.set()
        time.sleep(0.2)
        return super().note(*args, **kwargs)


def test_a_request_that_asked_during_the_write_is_not_failed_with_it(
    meta: MetadataStore,
) -> None:
    """The time told is when the write took its asks, not when it was done."""
    store = _SlowNote(meta.engine, gateway="a")

    async def main() -> None:
        async with _running(store) as (use, failed, reader):
            use.ask("e", "v1", 1)
            await asyncio.to_thread(store.writing.wait, 10)
            during = time.monotonic()  # a request beginning to wait now, mid-write
            await _until(lambda: [u.uses for u in reader.read(["e"])] == [1])
            await asyncio.to_thread(_holder_fails, meta, "no weights")
            use.ask("e", "v1", 1)
            await _until(lambda: failed)
            assert failed[0][3] < during

    asyncio.run(main())


def test_a_failure_for_a_write_no_longer_kept_fails_nothing(meta: MetadataStore) -> None:
    """A request waits at most the router's timeout (``keep_s``): a failure read back
    for a write older than that was for requests gone already, not for those waiting."""

    async def main() -> None:
        writer = _Writer(meta, keep_s=0.3)
        runner = asyncio.create_task(writer.use.run())
        try:
            await writer.written(1)
            seen = await asyncio.to_thread(_holder_reads, meta)  # the holder reads 1
            await asyncio.sleep(0.5)
            await writer.written(2)  # write 1 is past keeping
            await asyncio.to_thread(_holder_fails, meta, "late", seen)
            await writer.written(3)  # reads "late" back
            # The same failure written while its write is kept is told; writes are read
            # back in turn, so a "late" told would come before it in the list.
            seen = await asyncio.to_thread(_holder_reads, meta)  # 3
            await asyncio.to_thread(_holder_fails, meta, "in time", seen)
            await writer.written(4)
            await _until(lambda: writer.failed)
            assert [told[2] for told in writer.failed] == ["in time"]
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())


class _LostAnswer(ServerlessUseStore):
    """A gateway's store whose write, once ``lose`` is set, is stored but raises on the
    way back (the connection lost after the commit); the write after it waits for ``go``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lose = False
        self.lost = False
        self.go = threading.Event()

    def note(self, *args: Any, **kwargs: Any) -> dict[tuple[str, str], Use]:
        if self.lost:
            self.go.wait(10)
        written = super().note(*args, **kwargs)
        if self.lose and not self.lost:
            self.lost = True
            raise OSError("the connection was lost after the commit")
        return written


def test_a_failure_for_a_write_stored_though_it_raised_is_told(meta: MetadataStore) -> None:
    """The write raised, so its ``uses`` never came back; the next one's tells that it
    was stored, and a failure the holder made for it fails the requests waiting by then."""
    store = _LostAnswer(meta.engine, gateway="a")

    async def main() -> None:
        async with _running(store) as (use, failed, reader):
            use.ask("e", "v1", 1)
            await _until(lambda: [u.uses for u in reader.read(["e"])] == [1])
            store.lose = True
            before, after = await _asked(use, reader, 2)
            await asyncio.to_thread(_holder_fails, meta, "no weights")  # for 2, as read
            store.go.set()  # the ask is written again, and reads the failure back
            await _until(lambda: failed)
            ((endpoint, variant, reason, began_by),) = failed
            assert (endpoint, variant, reason) == ("e", "v1", "no weights")
            assert before <= began_by <= after

    asyncio.run(main())


def test_a_write_that_raised_unstored_lends_its_time_to_nothing(meta: MetadataStore) -> None:
    """The write raised before it was stored: the next write follows the last one
    stored, and a failure for that last one is told with its own time."""

    class _Refused(ServerlessUseStore):
        refuse = False

        def note(self, *args: Any, **kwargs: Any) -> dict[tuple[str, str], Use]:
            if self.refuse:
                self.refuse = False
                raise OSError("the database went away")
            return super().note(*args, **kwargs)

    store = _Refused(meta.engine, gateway="a")

    async def main() -> None:
        async with _running(store) as (use, failed, reader):
            before, after = await _asked(use, reader, 1)
            await asyncio.to_thread(_holder_fails, meta, "gone")  # for 1, as read
            store.refuse = True
            use.ask("e", "v1", 1)  # refused, then written as 2, reading the failure back
            await _until(lambda: failed)
            assert before <= failed[0][3] <= after, "the time of write 1, not the refused one's"

    asyncio.run(main())


def test_write_times_past_keeping_are_dropped_once_nothing_is_written(
    meta: MetadataStore,
) -> None:
    async def main() -> None:
        writer = _Writer(meta, keep_s=1.0)
        runner = asyncio.create_task(writer.use.run())
        try:
            await writer.written(1)
            await _until(lambda: writer.use._sent)  # kept while a failure for it could come
            await _until(lambda: not writer.use._sent)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())


class _Refusing(ServerlessUseStore):
    """The holder's store, its first write of a failure refused (a database error), once
    ``go`` is set."""

    refused = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.go = threading.Event()
        self.go.set()
        self.trying = threading.Event()

    def fail(self, rows: dict[tuple[str, str, str], int], reason: str) -> None:
        if not self.refused:
            self.trying.set()
            self.go.wait(10)
            self.refused += 1
            raise OSError("the database went away")
        super().fail(rows, reason)


def test_the_holder_writes_a_failure_on_the_rows_it_had_read(meta: MetadataStore) -> None:
    fleet = _fleet()
    other = ServerlessUseStore(meta.engine, gateway="other")
    store = _Refusing(meta.engine, gateway="holder")
    holder = ServerlessUse(store, period_s=0.05, keep_s=60, fail=lambda *_: None)

    async def main() -> None:
        runner = asyncio.create_task(holder.run())
        try:
            holds = lambda endpoint: True  # noqa: E731
            await holder.apply({"e": fleet}, holds, _Demand())  # type: ignore[arg-type]
            holder.failed("e", "v2", "not a variant anyone used")
            await asyncio.to_thread(other.note, {("e", "v1"): 1}, {})
            await holder.apply({"e": fleet}, holds, _Demand())  # type: ignore[arg-type]
            await asyncio.to_thread(other.note, {("e", "v1"): 1}, {})  # not read by the holder
            holder.failed("e", "v1", "the weights are gone")
            reader = ServerlessUseStore(meta.engine, gateway="reader")
            await _until(
                lambda: [u.failure for u in reader.read(["e"])] == ["the weights are gone"]
            )
            assert store.refused == 1, "written on the second try"
            (row,) = reader.read(["e"])
            assert (row.uses, row.failed_uses) == (2, 1), "for the use the holder had read"
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())


def test_a_failure_refused_is_not_written_over_a_newer_one(meta: MetadataStore) -> None:
    """A newer failure for the row comes while the refused write is under way: the
    refused one is not tried again after it, so the row ends with the newer."""
    fleet = _fleet()
    other = ServerlessUseStore(meta.engine, gateway="other")
    store = _Refusing(meta.engine, gateway="holder")
    store.go.clear()
    holder = ServerlessUse(store, period_s=0.05, keep_s=60, fail=lambda *_: None)
    reader = ServerlessUseStore(meta.engine, gateway="reader")

    async def main() -> None:
        runner = asyncio.create_task(holder.run())
        try:
            holds = lambda endpoint: True  # noqa: E731
            await holder.apply({"e": fleet}, holds, _Demand())  # type: ignore[arg-type]
            await asyncio.to_thread(other.note, {("e", "v1"): 1}, {})
            await holder.apply({"e": fleet}, holds, _Demand())  # type: ignore[arg-type]
            holder.failed("e", "v1", "old")
            await asyncio.to_thread(store.trying.wait, 10)
            await asyncio.to_thread(other.note, {("e", "v1"): 1}, {})
            await holder.apply({"e": fleet}, holds, _Demand())  # type: ignore[arg-type]
            holder.failed("e", "v1", "new")
            store.go.set()
            await _until(lambda: [u.failure for u in reader.read(["e"])] == ["new"])
            # Nothing is left to write: no retry of the old one can land after it.
            assert holder.failures_pending() == 0
            (row,) = reader.read(["e"])
            assert (row.failure, row.failed_uses) == ("new", 2)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())


class _Demand:
    """Stands in for the scaler: the holder's asks for instances, as they were made."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def demand(self, fleet: Fleet, variant: str, wanted: int) -> None:
        self.asked.append((variant, wanted))


def _fleet() -> Fleet:
    """A fleet of one serverless variant with two instances, run by the holder."""
    serverless = ServerlessConfig(memory_mb=1024, max_concurrency=4)
    variant = VariantSpec(
        "v1", "m", "ml.m5.large", 0, 1.0, RoutingStrategy.RANDOM, serverless=serverless
    )
    config = EndpointConfig("e", "arn:e", (variant,), datetime.now(UTC))
    instances = [Instance(f"i-{n}", "v1", f"http://127.0.0.1:{9 + n}") for n in (1, 2)]
    fleet = Fleet(
        endpoint="e",
        config=config,
        slots={
            "v1": [
                Slot(spec=InstanceSpec(i.instance_id, ""), variant="v1", instance=i)
                for i in instances
            ]
        },  # fmt: skip
        weights={"v1": 1.0},
        serverless={"v1": ServerlessAdmission("v1", serverless, slots=1, demand=lambda n: None)},
    )
    return fleet


def test_the_holder_keeps_warm_only_the_instances_the_others_used(meta: MetadataStore) -> None:
    fleet = _fleet()
    instances = [slot.instance for slot in fleet.slots["v1"]]
    other = ServerlessUseStore(meta.engine, gateway="other")
    holder = ServerlessUse(
        ServerlessUseStore(meta.engine, gateway="holder"),
        period_s=1,
        keep_s=60,
        fail=lambda *_: None,
    )
    scaler = _Demand()

    async def apply() -> None:
        await holder.apply({"e": fleet}, lambda endpoint: True, scaler)  # type: ignore[arg-type]

    other.note({("e", "v1"): 1}, {("e", "v1"): ["i-1"]})
    asyncio.run(apply())  # the first read: where the row stands, nothing more
    for instance in instances:
        instance.last_used = 0.0
    other.note({("e", "v1"): 1}, {("e", "v1"): ["i-2"]})
    asyncio.run(apply())
    assert [i.last_used > 0 for i in instances] == [False, True]
    assert scaler.asked == [("v1", 1)]
    asyncio.run(apply())  # nothing written since
    assert scaler.asked == [("v1", 1)]


def _routed(fleet: Fleet) -> dict[str, EndpointRoute]:
    """The table a gateway routes ``fleet``'s variant by, its admission the fleet's."""
    variant = VariantRoute(
        "v1",
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=1),
        instances=[slot.instance for slot in fleet.slots["v1"] if slot.instance is not None],
        metrics=Metrics().for_variant("e", "v1"),
        admission=fleet.serverless["v1"],
    )
    return {"e": EndpointRoute("e", [variant])}


def _busy(fleet: Fleet, requests: int) -> ServerlessAdmission:
    """``requests`` admitted to the fleet's variant and on its first instance."""
    admission = fleet.serverless["v1"]
    admission.active = requests
    instance = fleet.slots["v1"][0].instance
    assert instance is not None
    instance.in_flight = requests
    return admission


def test_max_concurrency_counts_every_gateways_requests(meta: MetadataStore) -> None:
    """MaxConcurrency 4 across a holder and a gateway following its fleet: three
    requests through the other leave the holder room for one; the holder's own are
    counted there too; a gateway that stops saying so stops counting."""
    holder_fleet, other_fleet = _fleet(), _fleet()
    holder, other = (
        ServerlessUse(
            ServerlessUseStore(meta.engine, gateway=name),
            period_s=0.05,
            keep_s=60,
            fail=lambda *_: None,
        )
        for name in ("holder", "other")
    )
    holds = lambda endpoint: True  # noqa: E731

    async def main() -> None:
        runners = [asyncio.create_task(u.run()) for u in (holder, other)]
        try:
            other_admission = _busy(other_fleet, 3)
            other.sample({"e": other_fleet}, _routed(other_fleet))
            admission = holder_fleet.serverless["v1"]

            async def heard_by_holder() -> bool:
                await holder.apply({"e": holder_fleet}, holds, _Demand())  # type: ignore[arg-type]
                holder.sample({"e": holder_fleet}, _routed(holder_fleet), shared_only=True)
                return admission.others == 3

            await _until_async(heard_by_holder)
            admission.admit()  # 0 here + 3 there: room for one
            with pytest.raises(Throttling):
                admission.admit()
            # The holder's own request, written since another gateway routes here too.
            _busy(holder_fleet, 1)
            holder.sample({"e": holder_fleet}, _routed(holder_fleet), shared_only=True)

            async def heard_by_other() -> bool:
                other.sample({"e": other_fleet}, _routed(other_fleet))
                return other_admission.others == 1

            await _until_async(heard_by_other)
            with pytest.raises(Throttling):
                other_admission.admit()  # 3 there + 1 here
            # The other gateway goes quiet (it died, say): after three periods the holder
            # no longer counts its last word.
            runners[1].cancel()

            async def forgotten() -> bool:
                await holder.apply({"e": holder_fleet}, holds, _Demand())  # type: ignore[arg-type]
                holder.sample({"e": holder_fleet}, _routed(holder_fleet), shared_only=True)
                return admission.others == 0

            await _until_async(forgotten)
        finally:
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)

    asyncio.run(main())


async def _until_async(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.02)
