"""Handler threads: the user's handlers run here, never on the instance's event loop.

A prediction that takes a minute must not stop the instance answering ``GET /ping``:
the gateway would take it for hung and replace it mid-request. So every handler call is
handed to one of ``SAGEMAKER_MODEL_SERVER_WORKERS`` threads (default 1: one request at a
time, as one SageMaker model-server worker, and user code need not be thread-safe) and
awaited.

Daemon threads of our own rather than ``ThreadPoolExecutor``: its threads are joined at
interpreter exit, so an instance told to stop would first wait for the prediction in
hand. A request the gateway abandons finishes on its thread and its answer is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from queue import SimpleQueue
from threading import Thread
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class HandlerThreads:
    """``count`` daemon threads that run handler calls in arrival order."""

    def __init__(self, count: int = 1) -> None:
        if count < 1:
            raise ValueError(f"SAGEMAKER_MODEL_SERVER_WORKERS must be at least 1, got {count}.")
        self.count = count
        self._queue: SimpleQueue[_Work] = SimpleQueue()
        for n in range(count):
            Thread(target=self._work, name=f"shipyard-handler-{n}", daemon=True).start()

    def __repr__(self) -> str:
        return f"HandlerThreads(count={self.count})"

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a handler thread; its result or exception, here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return await future

    def _work(self) -> None:
        while True:
            loop, future, fn, args = self._queue.get()
            if future.cancelled():
                continue
            outcome: tuple[bool, Any]
            try:
                outcome = (True, fn(*args))
            except BaseException as exc:  # handed to the awaiting task, raised there
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(_settle, future, outcome)
            del outcome, args, fn, future  # this thread must not keep a model's data alive


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
