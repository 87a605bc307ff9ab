"""ModelCache's policy, in process: LRU order, budgets, single flight, waiting, names.

The source is a fake whose models are strings of a given size and whose loads finish when
a test says so; the clock is injected, so which model is least recently used is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import pytest
from tests.conftest import wait_until_async

from shipyard.contract import (
    format_evicted,
    format_timings,
    model_url,
    parse_evicted,
    parse_timings,
)
from shipyard.errors import (
    InvalidTargetModel,
    ModelAlreadyLoaded,
    ModelLoadFailed,
    ModelNotFound,
    ModelNotLoaded,
    ModelStillLoading,
    ModelTooLarge,
)
from shipyard.runtime.multimodel import Loaded, ModelCache, check_model_name

T = TypeVar("T")
PREFIX = "s3://bucket/models"


def url(name: str) -> str:
    return f"{PREFIX}/{name}"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float = 1.0) -> None:
        self.now_s += seconds


class FakeSource:
    """Models are strings; ``sizes`` maps a url to the bytes its model measures.

    A url with a gate in ``gates`` finishes loading only once the gate is set; a url in
    ``failures`` raises that exception; any other unknown url is ModelNotFound.
    """

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = {url(name): size for name, size in sizes.items()}
        self.gates: dict[str, asyncio.Event] = {}
        self.failures: dict[str, Exception] = {}
        self.loads: list[str] = []
        self.unloaded: list[str] = []
        self.left: dict[str, int] = {}
        """What unloading a url leaves in the process (a library its code imported)."""
        self.leftovers: dict[str, int] = {}
        """What the unloaded models left, as it stands."""
        self.resident: list[str] = []

    async def load(self, name: str, url: str) -> Loaded[str]:
        first = url not in self.loads
        self.loads.append(url)
        gate = self.gates.get(url)
        if gate is not None:
            await gate.wait()
        if url in self.failures:
            raise self.failures[url]
        if url not in self.sizes:
            raise ModelNotFound(f"Could not find model '{name}' at {url}.")
        self.resident.append(url)
        return Loaded(
            f"model:{url}", self.sizes[url], load_s=0.5, download_s=0.25 if first else None
        )

    async def unload(self, models: list[object], urls: Sequence[str]) -> int:
        """How much the process has grown: what the loaded models hold, and what the
        unloaded ones left behind (``left``)."""
        models.clear()
        self.unloaded.extend(urls)
        for u in urls:
            self.resident.remove(u)
            self.leftovers[u] = self.leftovers.get(u, 0) + self.left.get(u, 0)
        held = sum(self.sizes[u] for u in self.resident)
        return held + sum(self.leftovers.values())


def make_cache(
    sizes: dict[str, int], *, budget: int = 100, max_models: int | None = None, wait_s: float = 5
) -> tuple[ModelCache[str], FakeSource, FakeClock]:
    source, clock = FakeSource(sizes), FakeClock()
    cache = ModelCache(
        source=source,
        prefix=PREFIX,
        memory_budget_bytes=budget,
        max_models=max_models,
        load_wait_timeout_s=wait_s,
        clock=clock,
    )
    return cache, source, clock


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def load_under_way(source: FakeSource, name: str) -> None:
    """Until the load of ``name`` has begun (and waits at its gate). Tasks run in the
    order they were made, so every request made before then is waiting on it too."""
    await wait_until_async(lambda: url(name) in source.loads, f"the load of {name!r}")


# --- hits, misses and what they report ------------------------------------------------


def test_the_first_request_loads_and_the_next_one_hits() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 10})
        first = await cache.acquire("a")
        assert (first.model, first.hit) == (f"model:{url('a')}", False)
        assert first.timings() == "wait=0.000000;download=0.250000;load=0.500000"
        second = await cache.acquire("a")
        assert (second.model, second.hit, second.timings()) == (first.model, True, "")
        assert source.loads == [url("a")]
        assert (cache.loaded_count, cache.memory_bytes) == (1, 10)

    run(scenario())


def test_timings_and_evicted_names_survive_the_round_trip() -> None:
    value = format_timings(wait_s=0.5, load_s=1.25, unload_s=0.001)
    assert value == "wait=0.500000;load=1.250000;unload=0.001000"
    assert parse_timings(value) == {"wait": 0.5, "load": 1.25, "unload": 0.001}
    names = ["a,b.tar.gz", "dir/m.tar.gz", "é 1"]
    assert "," not in format_evicted(names[:1])
    assert parse_evicted(format_evicted(names)) == names


# --- the budget and the LRU order -----------------------------------------------------


def test_the_least_recently_used_model_is_unloaded_first() -> None:
    """a and b fit; a is used again after b; loading c unloads b, not a."""

    async def scenario() -> None:
        cache, source, clock = make_cache({"a": 40, "b": 40, "c": 40})
        await cache.acquire("a")
        clock.advance()
        await cache.acquire("b")
        clock.advance()
        await cache.acquire("a")
        clock.advance()
        loaded_c = await cache.acquire("c")
        assert loaded_c.evicted == ("b",)
        assert loaded_c.unload_s is not None
        assert source.unloaded == [url("b")]
        assert [info.name for info in cache.models()] == ["a", "c"]

    run(scenario())


def test_models_are_unloaded_until_the_new_one_fits() -> None:
    async def scenario() -> None:
        cache, _, clock = make_cache({"a": 30, "b": 30, "c": 30, "d": 50})
        for name in "abc":
            await cache.acquire(name)
            clock.advance()
        loaded_d = await cache.acquire("d")
        assert loaded_d.evicted == ("a", "b")
        assert [info.name for info in cache.models()] == ["c", "d"]
        assert cache.memory_bytes == 80

    run(scenario())


def test_the_count_cap_unloads_the_coldest_and_ties_go_to_the_first_loaded() -> None:
    """The clock never moves, so the order of loading decides."""

    async def scenario() -> None:
        cache, _, _ = make_cache({"a": 1, "b": 1, "c": 1}, max_models=2)
        await cache.acquire("a")
        await cache.acquire("b")
        assert (await cache.acquire("c")).evicted == ("a",)
        assert cache.loaded_count == 2

    run(scenario())


def test_what_an_unloaded_model_left_in_the_process_counts_against_the_budget() -> None:
    """a imported a library (20 of its 30 stay when a goes): with 20 left, b and c (30
    each) no longer fit beside d, where without it they would have."""

    async def scenario() -> None:
        cache, source, clock = make_cache({"a": 30, "b": 30, "c": 30, "d": 30, "e": 30})
        source.left[url("a")] = 20
        for name in "abcd":
            await cache.acquire(name)
            clock.advance()
        assert cache.left_bytes == 20  # d's load unloaded a, which left 20 behind
        assert [info.name for info in cache.models()] == ["b", "c", "d"]
        assert cache.memory_bytes + cache.left_bytes == 110  # over: the next load says so
        loaded_e = await cache.acquire("e")
        assert loaded_e.evicted == ("b", "c")
        assert [info.name for info in cache.models()] == ["d", "e"]
        assert cache.memory_bytes + cache.left_bytes <= 100

    run(scenario())


def test_what_was_left_is_measured_afresh_and_never_past_half_the_budget() -> None:
    """What unloads left is read from the process each time (the library's memory given
    back later counts no more), and held to half the budget (a process growing for
    reasons of its own still keeps half for models)."""

    async def scenario() -> None:
        cache, source, clock = make_cache({"a": 40, "b": 30, "c": 40, "d": 40}, max_models=1)
        source.left[url("a")] = 90
        await cache.acquire("a")
        clock.advance()
        await cache.acquire("b")
        assert cache.left_bytes == 50  # 90 left, held to half of 100
        clock.advance()
        source.leftovers.clear()  # the library's memory went back since
        await cache.acquire("c")
        assert cache.left_bytes == 0

    run(scenario())


def test_a_model_larger_than_the_whole_budget_is_refused_and_evicts_nothing() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 40, "big": 150})
        await cache.acquire("a")
        with pytest.raises(ModelTooLarge) as refused:
            await cache.acquire("big")
        message = str(refused.value)
        assert "'big'" in message and "150 bytes" in message and "budget of 100 bytes" in message
        assert source.unloaded == [url("big")]  # loaded, measured, unloaded again
        assert [info.name for info in cache.models()] == ["a"]

    run(scenario())


# --- loading: single flight, waiting, failures ----------------------------------------


def test_concurrent_first_requests_share_one_load_and_one_report() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 10})
        source.gates[url("a")] = gate = asyncio.Event()
        waiters = [asyncio.create_task(cache.acquire("a")) for _ in range(20)]
        await load_under_way(source, "a")
        gate.set()
        results = await asyncio.gather(*waiters)
        assert source.loads == [url("a")]
        assert all(not result.hit for result in results)
        assert sum(result.load_s is not None for result in results) == 1
        assert all(result.wait_s is not None for result in results)

    run(scenario())


def test_models_in_memory_are_served_while_another_loads() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 10, "b": 10})
        await cache.acquire("b")
        source.gates[url("a")] = gate = asyncio.Event()
        loading = asyncio.create_task(cache.acquire("a"))
        await load_under_way(source, "a")
        assert (await cache.acquire("b")).hit
        assert not loading.done()
        gate.set()
        assert not (await loading).hit

    run(scenario())


def test_a_request_that_stops_waiting_gets_429_and_the_load_goes_on() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 10}, wait_s=0.05)
        source.gates[url("a")] = gate = asyncio.Event()
        with pytest.raises(ModelStillLoading, match="'a' is still loading after 0.05 s"):
            await cache.acquire("a")
        gate.set()
        await wait_until_async(lambda: cache.loaded_count == 1, "the load went on")
        assert (await cache.acquire("a")).hit
        assert source.loads == [url("a")]

    run(scenario())


def test_a_missing_model_is_not_remembered() -> None:
    """A model copied under the prefix after a 404 is served on the next request."""

    async def scenario() -> None:
        cache, source, _ = make_cache({})
        with pytest.raises(ModelNotFound, match="'late.tar.gz'"):
            await cache.acquire("late.tar.gz")
        source.sizes[url("late.tar.gz")] = 10
        assert not (await cache.acquire("late.tar.gz")).hit

    run(scenario())


def test_a_failed_load_reaches_every_waiter_and_nothing_is_kept() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 10})
        source.gates[url("a")] = gate = asyncio.Event()
        source.failures[url("a")] = RuntimeError("weights missing")
        waiters = [asyncio.create_task(cache.acquire("a")) for _ in range(3)]
        await load_under_way(source, "a")
        gate.set()
        for outcome in await asyncio.gather(*waiters, return_exceptions=True):
            assert isinstance(outcome, ModelLoadFailed)
            assert "weights missing" in str(outcome)
        assert cache.loaded_count == 0
        del source.failures[url("a")]
        assert not (await cache.acquire("a")).hit  # tried again, not remembered

    run(scenario())


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../x", "/abs", "a/../../b", "x" * 1025, "", "a\\b", "a/./b", "a//b", "dir/", "a\nb", ".."],
)
def test_unsafe_names_are_refused_before_any_load(name: str) -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({})
        with pytest.raises(InvalidTargetModel):
            await cache.acquire(name)
        assert source.loads == []

    run(scenario())


@pytest.mark.parametrize("name", ["Houston_TX.tar.gz", "dir/m.tar.gz", "a b#c", "x" * 1024])
def test_relative_names_are_accepted(name: str) -> None:
    assert check_model_name(name) == name


@pytest.mark.parametrize(
    ("prefix", "name", "expected"),
    [
        ("s3://bucket/models/", "m.tar.gz", "s3://bucket/models/m.tar.gz"),
        ("/srv/models", "dir/m.tar.gz", "/srv/models/dir/m.tar.gz"),
        ("file:///srv/models", "a b#c.tar.gz", "file:///srv/models/a%20b%23c.tar.gz"),
    ],
)
def test_a_name_resolves_under_the_prefix(prefix: str, name: str, expected: str) -> None:
    assert model_url(prefix, name) == expected


# --- the /models contract's operations --------------------------------------------------


def test_load_by_name_from_its_own_url_then_unload() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({})
        elsewhere = "file:///srv/registered"
        source.sizes[elsewhere] = 10
        assert not (await cache.load("reg", elsewhere)).hit
        with pytest.raises(ModelAlreadyLoaded):
            await cache.load("reg", elsewhere)
        assert cache.describe("reg").url == elsewhere
        assert cache.touch("reg").hit and (await cache.acquire("reg")).hit
        assert await cache.unload("reg") >= 0
        assert source.unloaded == [elsewhere]
        for operation in (cache.describe, cache.touch):
            with pytest.raises(ModelNotLoaded):
                operation("reg")
        with pytest.raises(ModelNotLoaded):
            await cache.unload("reg")
        with pytest.raises(ModelNotFound):  # unloaded: the name means <prefix>/reg again
            await cache.acquire("reg")

    run(scenario())


def test_a_name_loaded_from_its_own_url_reloads_from_it_after_eviction() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 1}, max_models=1)
        source.sizes["file:///srv/reg"] = 1
        await cache.load("reg", "file:///srv/reg")
        assert (await cache.acquire("a")).evicted == ("reg",)
        assert (await cache.acquire("reg")).evicted == ("a",)
        assert source.loads == ["file:///srv/reg", url("a"), "file:///srv/reg"]

    run(scenario())


def test_a_failed_load_by_name_forgets_its_url() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"big": 1})
        source.sizes["file:///srv/big"] = 500
        with pytest.raises(ModelTooLarge):
            await cache.load("big", "file:///srv/big")
        await cache.acquire("big")  # the name means <prefix>/big again
        assert source.loads == ["file:///srv/big", url("big")]

    run(scenario())


def test_a_load_in_progress_counts_as_loaded_for_post_models() -> None:
    async def scenario() -> None:
        cache, source, _ = make_cache({"a": 1})
        source.gates[url("a")] = gate = asyncio.Event()
        loading = asyncio.create_task(cache.acquire("a"))
        await load_under_way(source, "a")
        with pytest.raises(ModelAlreadyLoaded):
            await cache.load("a", url("a"))
        gate.set()
        await loading

    run(scenario())


def test_budgets_must_be_positive() -> None:
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        make_cache({}, budget=0)
    with pytest.raises(ValueError, match="max_models"):
        make_cache({}, max_models=0)
