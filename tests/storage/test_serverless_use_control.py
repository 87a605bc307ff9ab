"""ServerlessUse on a real store: on a gateway whose requests wait for another's
serverless variant, a failed cold start written by the holder fails them at its next
write; on the holder, the others' use keeps warm the instances it was on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import update

from shipyard.backends.base import InstanceSpec
from shipyard.control.serverless_use import ServerlessUse
from shipyard.provisioning.fleet import Fleet, Slot
from shipyard.records import EndpointConfig, RoutingStrategy, ServerlessConfig, VariantSpec
from shipyard.routing.instance import Instance
from shipyard.routing.serverless import ServerlessRoute
from shipyard.storage import tables as t
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.serverless_use import ServerlessUseStore


async def _until(check: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def _holder_fails(meta: MetadataStore, reason: str) -> None:
    """What the holder writes when the cold start it made for what it read fails."""
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    seen = {(u.endpoint, u.variant, u.gateway): u.uses for u in holder.read(["e"])}
    holder.fail(seen, reason)


def test_waiting_requests_fail_with_the_holders_failure_of_their_ask(meta: MetadataStore) -> None:
    failed: list[tuple[str, str, str]] = []

    async def main() -> None:
        use = ServerlessUse(
            ServerlessUseStore(meta.engine, gateway="a"),
            period_s=0.05,
            fail=lambda *told: failed.append(told),
        )
        runner = asyncio.create_task(use.run())
        try:
            store = ServerlessUseStore(meta.engine, gateway="reader")

            async def written(uses: int) -> None:
                use.ask("e", "v1", 1)  # still waiting: written again
                await _until(lambda: [u.uses for u in store.read(["e"])] == [uses])

            await written(1)
            await written(2)
            await asyncio.to_thread(_holder_fails, meta, "the weights are gone")
            assert failed == []  # nothing read back yet
            await written(3)
            await _until(lambda: failed)
            assert failed == [("e", "v1", "the weights are gone")]
            # A later wait starts afresh: the old failure is not taken for it, nor is a
            # failure told twice. Its writes pass the row's count over the wrap.
            use.sample({}, {})  # none waits any more
            with meta.engine.begin() as conn:
                conn.execute(update(t.serverless_use).values(uses=999_999_999))
            await written(1_000_000_000)
            await written(1)
            await asyncio.to_thread(_holder_fails, meta, "again")
            await written(2)
            await _until(lambda: len(failed) == 2)
            assert failed[1] == ("e", "v1", "again")
            await written(3)
            await asyncio.sleep(0.2)
            assert len(failed) == 2, "told once"
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


def test_the_holder_keeps_warm_only_the_instances_the_others_used(meta: MetadataStore) -> None:
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
        serverless={"v1": ServerlessRoute("v1", serverless, slots=1, demand=lambda n: None)},
    )
    other = ServerlessUseStore(meta.engine, gateway="other")
    holder = ServerlessUse(
        ServerlessUseStore(meta.engine, gateway="holder"), period_s=1, fail=lambda *_: None
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
