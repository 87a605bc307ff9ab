"""Multi-model serving inside one instance: which models stay in memory, and for how long.

A SageMaker multi-model endpoint serves every artifact under one prefix: a request names
its model (``TargetModel``, sent as ``X-Amzn-SageMaker-Target-Model``), and the instance
loads that model on first use, keeps the hot ones in memory and unloads the coldest when
memory runs short. ModelCache is that policy. Fetching, loading and measuring a model is a
ModelSource's job (runtime/model_source.py), and HTTP is runtime/model_contract.py's.

What the instance tells the gateway travels in the headers of shipyard/contract.py.
Platform errors are answered with their status, a ``text/plain`` body
``<Code>: <message>`` and ``X-Shipyard-Error: <Code>``:

    MultiModelError
     ├── InvalidTargetModel   400  not a safe relative path, or no TargetModel header
     ├── BadModelRequest      400  a /models request that is not of the contract's form
     ├── ModelNotFound        404  nothing at <prefix>/<name>
     ├── ModelNotLoaded       404  /models/{name} routes: the model is not in memory
     ├── ModelAlreadyLoaded   409  POST /models: the name is loaded or being loaded
     ├── ModelStillLoading    429  still loading when the wait ran out; retry (code ModelNotReady)
     ├── ModelLoadFailed      500  the artifact is unusable, or the model's code raised
     └── ModelTooLarge        507  the model alone needs more memory than the budget
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from shipyard.contract import format_timings, model_name_problem, model_url
from shipyard.errors import (
    InvalidTargetModel,
    ModelAlreadyLoaded,
    ModelLoadFailed,
    ModelNotLoaded,
    ModelStillLoading,
    ModelTooLarge,
    MultiModelError,
)

log = logging.getLogger(__name__)

M = TypeVar("M")
M_co = TypeVar("M_co", covariant=True)

DEFAULT_LOAD_WAIT_S = 50.0
"""Below the gateway's 60 s invocation timeout, so a slow load is a 429, never a hang."""


def check_model_name(name: str, *, what: str = "TargetModel") -> str:
    """``name`` if it is a safe path relative to the prefix, else InvalidTargetModel."""
    problem = model_name_problem(name)
    if problem is not None:
        shown = name if len(name) <= 80 else name[:80] + "..."
        raise InvalidTargetModel(f"{what} {shown!r} is invalid: {problem}.")
    return name


@dataclass(frozen=True, slots=True)
class Loaded(Generic[M_co]):
    """What a ModelSource hands back for one load."""

    model: M_co
    memory_bytes: int
    load_s: float
    download_s: float | None = None
    """None when the artifact was already on local disk."""


class ModelSource(Protocol[M_co]):
    """Fetches, loads, measures and releases models, keeping the event loop free."""

    async def load(self, name: str, url: str) -> Loaded[M_co]:
        """Fetch ``url`` and load it as ``name``; ModelNotFound or ModelLoadFailed if not."""
        ...

    async def unload(self, models: list[object], urls: Sequence[str]) -> int | None:
        """Empty ``models`` (the last references to them) and give their memory back;
        how much the process has grown since its first load, measured once they are
        gone (None when not measured)."""
        ...


@dataclass(frozen=True, slots=True)
class Acquired(Generic[M]):
    """A model for one request, and what it took to have it in memory."""

    model: M
    hit: bool
    wait_s: float | None = None
    download_s: float | None = None
    load_s: float | None = None
    unload_s: float | None = None
    evicted: tuple[str, ...] = ()

    def timings(self) -> str:
        """The value of MODEL_TIMINGS_HEADER for this request; empty on a hit."""
        return format_timings(
            wait_s=self.wait_s,
            download_s=self.download_s,
            load_s=self.load_s,
            unload_s=self.unload_s,
        )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A model in memory, as GET /models shows it."""

    name: str
    url: str
    memory_bytes: int
    last_used_s: float


@dataclass(slots=True, eq=False)
class _Entry(Generic[M]):
    name: str
    url: str
    model: M
    memory_bytes: int
    last_used_s: float
    order: int  # breaks ties between equal clock readings: first loaded, first out


@dataclass(slots=True, eq=False)
class _Outcome(Generic[M]):
    """A finished load: its model for every waiter, its report for the first one only."""

    model: M
    download_s: float | None
    load_s: float
    unload_s: float | None
    evicted: tuple[str, ...]
    claimed: bool = False


class ModelCache(Generic[M]):
    """Keeps the most recently used models in memory, within a byte budget and a count cap.

    A request for a model in memory costs one dict lookup and one clock reading.

    The first request for a model not in memory starts its load: the source fetches and
    loads it off the event loop, which keeps serving the models in memory meanwhile.
    Every request for that model, including later ones, waits for that same load (single
    flight), for at most ``load_wait_timeout_s``; past that it fails with ModelStillLoading
    (429, which clients retry) while the load goes on, so a retry finds the model ready.
    A failed load is not remembered: a model copied under the prefix after a ModelNotFound
    is served on the next request.

    After each load the model's measured memory is added up, with what unloaded models
    left behind (below). While the total exceeds ``memory_budget_bytes``, or more than
    ``max_models`` are loaded, the least recently used *other* model is unloaded, and the
    request whose load caused it reports the names. A model that needs more than the
    whole budget by itself is unloaded again and refused with ModelTooLarge (507), and
    nothing else is unloaded for it.

    A model is charged what the process grew by while it loaded, and that is not all
    given back when it goes: the libraries its code imported first (numpy, torch) stay,
    and so do caches it filled. Each unload measures how much the process has grown since
    its first load; what that is beyond the charges of the models still loaded counts
    against the budget (``left_bytes``), measured afresh each time (so the errors of
    measures never add up), and at most half the budget (so a process that grows for
    reasons of its own still keeps half for models). The budget thus bounds the process's
    growth, not only the sum of the models' charges: an instance that had counted only
    the charges held 6-14% more than its budget under load
    (bench/results/multimodel.md).

    Failure modes: the budget bounds the memory measured *after* a load, not the peak
    during one, so leave headroom for the largest model beyond the budget. A model can be
    unloaded just after a request was handed it; that request still finishes with it, and
    the memory returns when the request ends. The report of a load (download, load and
    unload times, evicted names) goes to the first request that sees the load finish; if
    every waiter gave up first, it is lost, and GET /models tells what is loaded.

    Args:
        source: fetches, loads, measures and releases models.
        prefix: where model names resolve, as ``<prefix>/<name>``.
        clock: monotonic seconds; tests inject one to order uses exactly.
    """

    def __init__(
        self,
        *,
        source: ModelSource[M],
        prefix: str,
        memory_budget_bytes: int,
        max_models: int | None = None,
        load_wait_timeout_s: float = DEFAULT_LOAD_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes must be above 0, got {memory_budget_bytes}")
        if max_models is not None and max_models < 1:
            raise ValueError(f"max_models must be above 0 or None, got {max_models}")
        self.prefix = prefix
        self.memory_budget_bytes = memory_budget_bytes
        self.max_models = max_models
        self.load_wait_timeout_s = load_wait_timeout_s
        self._source = source
        self._clock = clock
        self._entries: dict[str, _Entry[M]] = {}
        self._loading: dict[str, asyncio.Task[_Outcome[M]]] = {}
        self._urls: dict[str, str] = {}  # POST /models: names loaded from their own url
        self._order = itertools.count()
        self._left_bytes = 0

    def __repr__(self) -> str:
        return (
            f"ModelCache(prefix={self.prefix!r}, loaded={len(self._entries)}, "
            f"memory_bytes={self.memory_bytes}, left_bytes={self._left_bytes}, "
            f"memory_budget_bytes={self.memory_budget_bytes}, "
            f"max_models={self.max_models})"
        )

    @property
    def loaded_count(self) -> int:
        return len(self._entries)

    @property
    def memory_bytes(self) -> int:
        """The measured memory of every model in memory."""
        return sum(entry.memory_bytes for entry in self._entries.values())

    @property
    def left_bytes(self) -> int:
        """Memory unloaded models left in the process (imports, caches), as measured."""
        return self._left_bytes

    async def acquire(self, name: str) -> Acquired[M]:
        """The model a request's TargetModel names, loaded first when it is not in memory.

        Raises:
            InvalidTargetModel, ModelNotFound, ModelStillLoading, ModelLoadFailed, ModelTooLarge.
        """
        entry = self._entries.get(name)
        if entry is not None:
            entry.last_used_s = self._clock()
            return Acquired(entry.model, hit=True)
        task = self._loading.get(name)
        if task is None:
            check_model_name(name)
            task = self._start_load(name, self._urls.get(name) or model_url(self.prefix, name))
        return await self._wait(name, task)

    def touch(self, name: str) -> Acquired[M]:
        """A model in memory, never loading it (``POST /models/{name}/invoke``)."""
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotLoaded(f"Model '{name}' is not loaded.")
        entry.last_used_s = self._clock()
        return Acquired(entry.model, hit=True)

    async def load(self, name: str, url: str) -> Acquired[M]:
        """Load ``url`` as ``name`` (``POST /models``); it keeps that url until unloaded.

        Raises:
            ModelAlreadyLoaded, and what acquire raises.
        """
        check_model_name(name)
        if name in self._entries or name in self._loading:
            raise ModelAlreadyLoaded(f"Model '{name}' is already loaded or being loaded.")
        self._urls[name] = url
        return await self._wait(name, self._start_load(name, url))

    async def unload(self, name: str) -> float:
        """Unload ``name`` now and forget any url it was loaded from; the seconds it took.

        Raises:
            ModelNotLoaded: it is not in memory (a load under way is not stopped).
        """
        self._urls.pop(name, None)
        entry = self._entries.pop(name, None)
        if entry is None:
            raise ModelNotLoaded(f"Model '{name}' is not loaded.")
        models: list[object] = [entry.model]
        url = entry.url
        del entry  # the source must hold the last reference
        return await self._unload(models, [url], names=[name])

    def models(self) -> list[ModelInfo]:
        """Every model in memory, by name."""
        return [self._info(self._entries[name]) for name in sorted(self._entries)]

    def describe(self, name: str) -> ModelInfo:
        """One model in memory; ModelNotLoaded if it is not."""
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotLoaded(f"Model '{name}' is not loaded.")
        return self._info(entry)

    @staticmethod
    def _info(entry: _Entry[M]) -> ModelInfo:
        return ModelInfo(entry.name, entry.url, entry.memory_bytes, entry.last_used_s)

    def _start_load(self, name: str, url: str) -> asyncio.Task[_Outcome[M]]:
        task = asyncio.create_task(self._load(name, url), name=f"load model {name}")
        self._loading[name] = task
        task.add_done_callback(functools.partial(self._forget_load, name))
        return task

    def _forget_load(self, name: str, task: asyncio.Task[_Outcome[M]]) -> None:
        if self._loading.get(name) is task:
            del self._loading[name]
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have given up

    async def _wait(self, name: str, task: asyncio.Task[_Outcome[M]]) -> Acquired[M]:
        started_s = self._clock()
        try:
            async with asyncio.timeout(self.load_wait_timeout_s):
                outcome = await asyncio.shield(task)  # giving up must not stop the load
        except TimeoutError:
            raise ModelStillLoading(
                f"Model '{name}' is still loading after {self.load_wait_timeout_s:g} s; "
                "retry the request."
            ) from None
        now_s = self._clock()
        entry = self._entries.get(name)
        if entry is not None:
            entry.last_used_s = now_s
        wait_s = now_s - started_s
        if outcome.claimed:
            return Acquired(outcome.model, hit=False, wait_s=wait_s)
        outcome.claimed = True
        return Acquired(
            outcome.model,
            hit=False,
            wait_s=wait_s,
            download_s=outcome.download_s,
            load_s=outcome.load_s,
            unload_s=outcome.unload_s,
            evicted=outcome.evicted,
        )

    async def _load(self, name: str, url: str) -> _Outcome[M]:
        try:
            loaded = await self._source.load(name, url)
        except Exception as exc:
            self._forget_url(name, url)
            if isinstance(exc, MultiModelError):
                raise
            raise ModelLoadFailed(f"Model '{name}' could not be loaded: {exc!r}") from None
        size = loaded.memory_bytes
        if size > self.memory_budget_bytes:
            self._forget_url(name, url)
            models: list[object] = [loaded.model]
            del loaded
            await self._unload(models, [url], names=[name])
            raise ModelTooLarge(
                f"Model '{name}' needs {size} bytes ({size / 2**20:.1f} MiB) of memory, more "
                f"than the whole budget of {self.memory_budget_bytes} bytes "
                f"({self.memory_budget_bytes / 2**20:.1f} MiB)."
            )
        model = loaded.model
        self._entries[name] = _Entry(name, url, model, size, self._clock(), next(self._order))
        log.info("loaded model %s from %s: %d bytes in %.3f s", name, url, size, loaded.load_s)
        names, urls, doomed = self._evict(keep=name)
        unload_s = await self._unload(doomed, urls, names=names) if names else None
        return _Outcome(model, loaded.download_s, loaded.load_s, unload_s, tuple(names))

    def _forget_url(self, name: str, url: str) -> None:
        """A failed load from a url given by POST /models: the name means the prefix again."""
        if self._urls.get(name) == url:
            del self._urls[name]

    def _evict(self, *, keep: str) -> tuple[list[str], list[str], list[object]]:
        """Take least recently used models out until the rest fit; their names, urls, models."""
        names: list[str] = []
        urls: list[str] = []
        models: list[object] = []
        total = self.memory_bytes + self._left_bytes
        while total > self.memory_budget_bytes or (
            self.max_models is not None and len(self._entries) > self.max_models
        ):
            others = (entry for entry in self._entries.values() if entry.name != keep)
            victim = min(others, key=lambda e: (e.last_used_s, e.order), default=None)
            if victim is None:
                break
            del self._entries[victim.name]
            total -= victim.memory_bytes
            names.append(victim.name)
            urls.append(victim.url)
            models.append(victim.model)
        return names, urls, models

    async def _unload(self, models: list[object], urls: list[str], *, names: list[str]) -> float:
        started_s = self._clock()
        grown = await self._source.unload(models, urls)
        unload_s = self._clock() - started_s
        if grown is not None:
            beyond = max(grown - self.memory_bytes, 0)
            self._left_bytes = min(beyond, self.memory_budget_bytes // 2)
        log.info(
            "unloaded %s in %.3f s; %d bytes held beyond the models' charges",
            ", ".join(names),
            unload_s,
            self._left_bytes,
        )
        return unload_s
