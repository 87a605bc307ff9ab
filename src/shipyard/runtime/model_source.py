"""Where a multi-model instance gets its models: artifacts on local disk, loaded and measured.

HandlersSource is the ModelSource behind the built-in runtime's ModelCache. It fetches an
artifact into the DiskCache (runtime/disk_cache.py), loads that artifact's own
``code/inference.py`` (or the default handlers), and measures the model as the growth of the
process's resident memory across the load. Unloading drops the last references,
collects garbage and hands freed heap pages back to the operating system.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from threading import Lock, Thread
from typing import Any, TypeVar

import psutil

from shipyard.errors import ArtifactError, ModelLoadFailed, ModelNotFound
from shipyard.runtime import handlers
from shipyard.runtime.disk_cache import DiskCache
from shipyard.runtime.handlers import Handlers
from shipyard.runtime.multimodel import DEFAULT_LOAD_WAIT_S, Loaded, ModelCache
from shipyard.storage.artifacts import ArtifactStore

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_DISK_CACHE_BYTES = 10 * 2**30


@dataclass(frozen=True, slots=True)
class MultiModelConfig:
    """How the runtime serves in multi-model mode; built once, from the environment."""

    prefix: str
    """``<prefix>/<TargetModel>`` is a model's artifact: a file:// URI, a path or s3://."""
    memory_budget_bytes: int
    """The measured memory that loaded models may take together."""
    cache_dir: Path
    """Where fetched artifacts are kept; one process's own (see DiskCache)."""
    max_models: int | None = None
    """At most this many models in memory; None: only the memory budget counts."""
    disk_cache_bytes: int = DEFAULT_DISK_CACHE_BYTES
    """The bytes of fetched artifacts kept in ``cache_dir``, beyond those of loaded models."""
    s3_endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, a test server) instead of AWS."""
    load_wait_timeout_s: float = DEFAULT_LOAD_WAIT_S
    """How long a request waits for its model to load before a 429."""
    program: str | None = None
    """``SAGEMAKER_PROGRAM``: the module in each artifact's ``code/``; None: inference.py."""
    code_dir: Path | None = None
    """The fetched ``SAGEMAKER_SUBMIT_DIRECTORY``, whose code serves every model; None:
    each artifact's own ``code/``."""


def open_model_cache(config: MultiModelConfig) -> ModelCache[Handlers]:
    """The ModelCache that serves ``config``, with its disk cache opened."""
    disk = DiskCache(
        root=config.cache_dir,
        max_bytes=config.disk_cache_bytes,
        artifacts=ArtifactStore(s3_endpoint_url=config.s3_endpoint_url),
    )
    return ModelCache(
        source=HandlersSource(disk=disk, program=config.program, code_dir=config.code_dir),
        prefix=config.prefix,
        memory_budget_bytes=config.memory_budget_bytes,
        max_models=config.max_models,
        load_wait_timeout_s=config.load_wait_timeout_s,
    )


class HandlersSource:
    """Loads each model with its own handlers, measuring the memory the load took.

    Loads and unloads take turns on one lock. Memory is only measurable for the whole
    process, so a load is measured while nothing else is loaded or freed; concurrent loads
    would each be charged for the others. Fetches (downloads, extraction) run outside the
    lock, in parallel. So a slow ``model_fn`` delays the other models still to be loaded,
    never the ones in memory.

    Each model's code is imported with its ``code/`` folder on ``sys.path`` and is taken out
    of ``sys.modules`` and ``sys.path`` once loaded: artifacts ship same-named modules
    (``inference``, their helpers), and one model must not import another's. So a model's
    code imports its sibling modules at import time or in ``model_fn``, not later.

    Failure modes: the measure is best effort. Libraries imported by the first model that
    needs them (numpy, torch) are charged to it and stay after it is unloaded; memory a
    model allocates after loading (caches, lazy weights) is never charged.
    """

    def __init__(
        self, *, disk: DiskCache, program: str | None = None, code_dir: Path | None = None
    ) -> None:
        self._disk = disk
        self._program = program
        self._code_dir = code_dir
        self._lock = Lock()
        self._base_bytes: int | None = None
        """The process's resident memory before its first model loaded."""

    def __repr__(self) -> str:
        return f"HandlersSource(disk={self._disk!r}, program={self._program!r})"

    async def load(self, name: str, url: str) -> Loaded[Handlers]:
        """Fetch and load ``url`` in a worker thread; ModelNotFound or ModelLoadFailed."""
        return await run_blocking(self._load, name, url)

    async def unload(self, models: list[object], urls: Sequence[str]) -> int | None:
        """Drop ``models`` (emptying the list), free their memory, and unpin their
        artifacts; how much the process has grown since its first load, after that."""
        return await run_blocking(self._unload, models, urls)

    def _load(self, name: str, url: str) -> Loaded[Handlers]:
        model_dir, download_s = self._fetch(name, url)
        failure: str | None = None
        try:
            with self._lock:
                release_memory()  # a trimmed heap first, so growth is the model's own
                before_bytes = rss_bytes()
                if self._base_bytes is None:
                    self._base_bytes = before_bytes  # what the process held before models
                started_s = time.perf_counter()
                loaded = _load_isolated(model_dir, self._program, self._code_dir)
                load_s = time.perf_counter() - started_s
                release_memory()  # and after: what the load freed is not the model's
                memory_bytes = max(rss_bytes() - before_bytes, 0)
        except Exception as exc:
            log.exception("model %s failed to load from %s", name, url)
            failure = f"{type(exc).__name__}: {exc}"
        if failure is not None:  # raised out here, so no traceback keeps the model alive
            self._disk.unpin(url)
            raise ModelLoadFailed(f"Model '{name}' failed to load: {failure}")
        return Loaded(loaded, memory_bytes, load_s, download_s)

    def _unload(self, models: list[object], urls: Sequence[str]) -> int | None:
        with self._lock:
            models.clear()
            release_memory()  # a trimmed heap, as the first load's measure began from
            grown = None if self._base_bytes is None else rss_bytes() - self._base_bytes
        for url in urls:
            self._disk.unpin(url)
        return grown

    def _fetch(self, name: str, url: str) -> tuple[Path, float | None]:
        try:
            return self._disk.fetch(url)
        except ArtifactError as exc:
            # ArtifactStore raises from the FileNotFoundError of a missing file or object.
            if isinstance(exc.__cause__, FileNotFoundError):
                raise ModelNotFound(f"Could not find model '{name}' at {url}.") from None
            raise ModelLoadFailed(f"Model '{name}' could not be fetched: {exc}") from None


async def run_blocking(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a new daemon thread, awaited without blocking the event loop.

    Not asyncio.to_thread: its pool is joined at exit, so an instance told to stop would
    wait for a model that takes minutes to download or load. An interrupted fetch leaves
    only a staging folder, which the next fetch of that artifact clears.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        outcome: tuple[Callable[[Any], None], Any]
        try:
            outcome = (future.set_result, fn(*args))
        except BaseException as exc:  # handed to the awaiting task, raised there
            outcome = (future.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            loop.call_soon_threadsafe(settle, *outcome)
        del outcome  # this thread must not keep a model alive

    Thread(target=work, name=f"shipyard-{fn.__name__}", daemon=True).start()
    return await future


def _load_isolated(model_dir: Path, program: str | None, code_dir: Path | None) -> Handlers:
    """``handlers.load``, then the model's own modules out of ``sys.modules`` and ``sys.path``.

    Left there, the next model's ``import helpers`` would find this one's, and the module
    would keep this model's globals alive after it is unloaded.
    """
    root = os.path.realpath(model_dir) + os.sep
    known = set(sys.modules)
    path_before = set(sys.path)
    try:
        return handlers.load(model_dir, program=program, code_dir=code_dir)
    finally:
        for entry in [e for e in sys.path if e not in path_before and _inside(e, root)]:
            sys.path.remove(entry)
        for module_name in set(sys.modules) - known:
            file = getattr(sys.modules.get(module_name), "__file__", None)
            if file and _inside(file, root):
                del sys.modules[module_name]


def _inside(path: str, root: str) -> bool:
    return os.path.realpath(path).startswith(root)


def rss_bytes() -> int:
    """This process's resident memory (psutil: Linux and macOS alike)."""
    return int(psutil.Process().memory_info().rss)


def total_memory_bytes() -> int:
    """The machine's memory."""
    return int(psutil.virtual_memory().total)


def release_memory() -> None:
    """Collect garbage, then return the heap's free pages to the operating system.

    Without ``malloc_trim`` glibc keeps freed small allocations mapped, so a model's
    memory would stay resident after it is unloaded. Elsewhere (musl, macOS) only the
    collection happens.
    """
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim
