"""AdapterLoader (routing/adapters.py): one registration per copy and generation, a
refusal remembered for a while, an older generation never registered over a newer one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shipyard.http.client import Response
from shipyard.routing import adapters
from shipyard.routing.adapters import Adapter, AdapterLoader
from shipyard.routing.instance import Instance


class Copy:
    """A copy's connection pool: answers POST /adapters with ``status``, counting them."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.posts: list[bytes] = []

    async def request(self, method: bytes, path: bytes, headers: Any, body: bytes = b"") -> Any:
        await asyncio.sleep(0.01)
        self.posts.append(body)
        return Response(self.status, [], b"AdapterLoadFailed: no such folder")


def _copy(status: int) -> tuple[Instance, Copy]:
    instance = Instance("c-1", "base", "http://127.0.0.1:9")
    pool = Copy(status)
    instance.pool = pool  # type: ignore[assignment]
    return instance, pool


def test_concurrent_requests_register_an_adapter_once_and_newer_wins() -> None:
    async def scenario() -> None:
        instance, pool = _copy(200)
        loader = AdapterLoader()
        v1, v2 = Adapter("a", "file:///v1", 1, "t"), Adapter("a", "file:///v2", 2, "t")
        assert await asyncio.gather(*(loader.ensure(instance, v1) for _ in range(5))) == [None] * 5
        assert len(pool.posts) == 1
        await asyncio.gather(loader.ensure(instance, v2), loader.ensure(instance, v1))
        assert instance.adapters == {"a": 2}
        assert await loader.ensure(instance, v1) is None  # the older one is not sent again
        assert [b"v2" in p for p in pool.posts] == [False, True]

    asyncio.run(scenario())


def test_a_refusal_answers_for_a_while_before_the_copy_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        instance, pool = _copy(424)
        loader = AdapterLoader()
        adapter = Adapter("a", "file:///missing", 1, "t")
        first = await loader.ensure(instance, adapter)
        again = await loader.ensure(instance, adapter)
        assert first is not None and again is not None and again.status == 424
        assert len(pool.posts) == 1
        monkeypatch.setattr(adapters, "RETRY_AFTER_S", 0.0)
        await loader.ensure(instance, adapter)
        assert len(pool.posts) == 2

    asyncio.run(scenario())
