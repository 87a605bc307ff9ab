"""ServerlessUse on a gateway whose requests wait for another's serverless variant: a
failed cold start written by the holder fails them at its next write, on a real store."""

from __future__ import annotations

import asyncio

from sqlalchemy import update

from shipyard.control.serverless_use import ServerlessUse
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
