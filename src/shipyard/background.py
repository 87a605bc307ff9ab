"""Background loops under one supervisor: restarted when they crash, stopped in order.

The gateway's loops (reconciler, job supervisor, event dispatcher, async consumer) each
catch what goes wrong inside a pass, but not what goes wrong around it: a database that
is not reachable yet when a loop starts, a bug in its setup. Run as loose tasks, such a
loop would end for good and silently (no more async results, no more notifications)
while the gateway kept answering. Here a loop that raises is logged and started again
after a backoff that doubles from ``first_backoff_s`` up to ``max_backoff_s``, and resets
once the loop has run for ``healthy_after_s``; a loop that returns is done. ``stop``
cancels them in the reverse order of their start, each awaited before the next, so a
loop is never left feeding one that has already stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

LoopFn = Callable[[], Awaitable[None]]


class Wakeup:
    """Tells a loop to run its next pass now; ``set`` is safe from any thread.

    The control plane runs its store work in worker threads and wakes loops from there:
    ``asyncio.Event.set`` from another thread is not thread-safe (the waiter may never
    be woken), so ``set`` goes through the loop's ``call_soon_threadsafe``. Before the
    loop binds it (``wait`` does, on first use) a ``set`` is kept and seen then.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"Wakeup(set={self._event.is_set()})"

    def set(self) -> None:
        loop = self._loop
        if loop is None:
            self._event.set()
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._event.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
            loop.call_soon_threadsafe(self._event.set)

    def bind(self) -> None:
        """Bind to the running loop; ``wait`` does it too."""
        self._loop = asyncio.get_running_loop()

    async def wait(self, timeout_s: float) -> bool:
        """Wait until set or ``timeout_s`` passes; whether it was set. Clears it."""
        if self._loop is None:
            self.bind()
        try:
            async with asyncio.timeout(timeout_s):
                await self._event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._event.clear()


@dataclass(eq=False)
class _Loop:
    name: str
    run: LoopFn
    task: asyncio.Task[None] | None = None
    restarts: int = 0
    last_error: BaseException | None = field(default=None, repr=False)


class Loops:
    """Named background loops, each restarted with backoff when it raises."""

    def __init__(
        self,
        *,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        healthy_after_s: float = 60.0,
    ) -> None:
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.healthy_after_s = healthy_after_s
        self._loops: list[_Loop] = []

    def __repr__(self) -> str:
        return f"Loops({[loop.name for loop in self._loops]})"

    def start(self, name: str, run: LoopFn) -> None:
        """Run ``run()`` as the loop ``name`` from now until ``stop``."""
        loop = _Loop(name, run)
        loop.task = asyncio.create_task(self._keep(loop), name=name)
        self._loops.append(loop)

    def restarts(self, name: str) -> int:
        """How many times the loop ``name`` was started again after it raised."""
        return next(loop.restarts for loop in self._loops if loop.name == name)

    def running(self, name: str) -> bool:
        return any(
            loop.name == name and loop.task is not None and not loop.task.done()
            for loop in self._loops
        )

    async def stop(self) -> None:
        """Cancel every loop, the last started first, each awaited before the next."""
        while self._loops:
            loop = self._loops.pop()
            if loop.task is None:
                continue
            loop.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop.task

    async def _keep(self, loop: _Loop) -> None:
        backoff = self.first_backoff_s
        while True:
            started = time.monotonic()
            try:
                await loop.run()
                log.info("background loop %s finished", loop.name)
                return
            except Exception as exc:
                loop.last_error = exc
                if time.monotonic() - started >= self.healthy_after_s:
                    backoff = self.first_backoff_s
                log.exception(
                    "background loop %s crashed; starting it again in %.1f s", loop.name, backoff
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)
            loop.restarts += 1
