"""Server-side dynamic batching: concurrent requests gathered into one ``predict_batch_fn``.

A transformer on CPU does far more work per second on a batch of 32 sentences than on 32
single ones, so when the model's Environment sets ``SHIPYARD_MAX_BATCH_SIZE`` (and
``SHIPYARD_MAX_BATCH_DELAY_MS``, default 10) the instance gathers requests from many
clients before calling the model. How, on the event loop:

- each request waits in one FIFO, its arrival time noted;
- a gatherer (one per handler thread) takes the oldest, then more as they come, and cuts
  the batch when it holds ``max_size`` requests or when that oldest request has waited
  ``max_delay_s``, whichever is first;
- the batch goes to a handler thread (:meth:`Handlers.invoke_batch`: ``input_fn`` per
  request, one ``predict_batch_fn``, ``output_fn`` per request) and each answer to its
  own request's future, in order.

While the handler threads are busy, requests pile up in the FIFO; a gatherer coming back
finds their oldest already past the delay and cuts at once with up to ``max_size`` of
them. So under load batches fill without waiting, and a lone request waits the delay at
most (the dynamic batcher of Triton and TorchServe, where a worker that frees up takes
what is queued). The instance advertises ``max_size × (threads + 1)`` as its concurrency
(provisioning/fleet.py), so the gateway sends enough to fill the next batch while one runs.

Written here rather than taken from a library: the gathering is small, has to hand
batches to our handler threads and report each request's wait (``X-Shipyard-Batch``),
and the asyncio batchers that exist come inside a framework (Ray Serve's
``@serve.batch``).

Failure modes: a request whose item fails (its ``input_fn`` or ``output_fn`` raised, or
``predict_batch_fn`` answered an ``Exception`` for it) fails alone; when
``predict_batch_fn`` raises, or answers a list of the wrong length, every request of the
batch fails with that error. A request whose client went away is dropped from the batch
if it was not cut yet; otherwise its answer is computed and dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from shipyard.runtime.handlers import Handlers, Request
from shipyard.runtime.workers import Runner

DEFAULT_MAX_DELAY_MS = 10.0


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """``SHIPYARD_MAX_BATCH_SIZE`` and ``SHIPYARD_MAX_BATCH_DELAY_MS``, checked."""

    max_size: int
    max_delay_s: float = DEFAULT_MAX_DELAY_MS / 1000

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError(f"SHIPYARD_MAX_BATCH_SIZE must be at least 1, got {self.max_size}.")
        if self.max_delay_s < 0:
            raise ValueError(
                f"SHIPYARD_MAX_BATCH_DELAY_MS must be 0 or more, got {self.max_delay_s * 1000:g}."
            )


class Batched(NamedTuple):
    """One request's answer out of a batch, and the batch it came out of."""

    payload: bytes
    media_type: str
    size: int
    """Requests in the batch."""
    wait_s: float
    """How long the request waited in the FIFO before its batch was cut."""


class _Waiting:
    __slots__ = ("request", "arrived", "future")

    def __init__(self, request: Request, arrived: float, future: asyncio.Future[Batched]) -> None:
        self.request = request
        self.arrived = arrived
        self.future = future


class Batcher:
    """Gathers the requests of one model into batches for its handler threads."""

    def __init__(self, handlers: Handlers, threads: Runner, config: BatchConfig) -> None:
        if not handlers.batches:
            raise ValueError(
                f"SHIPYARD_MAX_BATCH_SIZE is set, but {handlers.program or 'the model'} "
                "defines no predict_batch_fn(data_list, model) (or defines transform_fn, "
                "which cannot be batched)."
            )
        self.handlers = handlers
        self.threads = threads
        self.config = config
        self._pending: deque[_Waiting] = deque()
        self._arrived = asyncio.Event()
        self._gatherers = 0
        # Gatherers stop when the FIFO is empty: none keeps an unloaded model alive.
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"Batcher({self.handlers!r}, {self.config!r})"

    async def submit(self, request: Request) -> Batched:
        """Queue ``request`` for the next batch; its answer, or the error that failed it."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(request, loop.time(), loop.create_future())
        self._pending.append(waiting)
        self._arrived.set()
        if self._gatherers < self.threads.count:
            self._gatherers += 1
            task = loop.create_task(self._gather_loop(), name="shipyard-batcher")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await waiting.future

    async def _gather_loop(self) -> None:
        try:
            while self._pending:
                batch, cut = await self._gather()
                if batch:
                    await self._run(batch, cut)
        finally:
            self._gatherers -= 1

    async def _gather(self) -> tuple[list[_Waiting], float]:
        """The next batch, cut when full or when its oldest has waited the delay."""
        loop = asyncio.get_running_loop()
        pending = self._pending
        max_size = self.config.max_size
        batch: list[_Waiting] = []
        deadline = 0.0
        while len(batch) < max_size:
            if pending:
                waiting = pending.popleft()
                if waiting.future.done():  # its client went away
                    continue
                if not batch:
                    deadline = waiting.arrived + self.config.max_delay_s
                batch.append(waiting)
                continue
            if not batch or loop.time() >= deadline:
                break
            self._arrived.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._arrived.wait()
            except TimeoutError:
                break
        return batch, loop.time()

    async def _run(self, batch: list[_Waiting], cut: float) -> None:
        requests = [waiting.request for waiting in batch]
        try:
            answers = await self.threads.run(self.handlers.invoke_batch, requests)
        except Exception as exc:
            for waiting in batch:
                _fail(waiting.future, exc)
            return
        size = len(batch)
        for waiting, answer in zip(batch, answers, strict=True):
            if isinstance(answer, Exception):
                _fail(waiting.future, answer)
            elif not waiting.future.done():
                payload, media_type = answer
                waiting.future.set_result(
                    Batched(payload, media_type, size, max(cut - waiting.arrived, 0.0))
                )


def _fail(future: asyncio.Future[Any], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
