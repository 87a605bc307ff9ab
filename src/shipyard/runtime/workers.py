"""Where the user's handlers run, and how ``GET /ping`` answers while they do.

A prediction that takes a minute must not stop the instance answering ``GET /ping``: the
gateway would take it for hung and replace it mid-request. Two designs keep that true:

- ``SAGEMAKER_MODEL_SERVER_WORKERS=1`` (the default: one request at a time, as one
  SageMaker model-server worker, and user code need not be thread-safe): :class:`Inline`
  runs each handler call on the event loop itself, which costs nothing per request. While
  a call has run longer than :data:`STANDBY_AFTER_S`, :class:`PingStandby`, a thread of
  its own, accepts the connections the stuck loop cannot: it answers a ``/ping`` itself
  and hands any other connection, unread, to the loop for when it is free. (The gateway
  pings on a connection of its own, so its pings always arrive as new connections.)
- More workers: :class:`HandlerThreads` hands every call to one of that many threads and
  awaits it; the loop stays free. That hand-off, and the GIL passing between the loop and
  the threads, costs tens of microseconds a request (bench/results/handler_runner.md),
  which is why one worker does not pay it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import time
from collections.abc import Callable
from queue import SimpleQueue
from threading import Thread
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

STANDBY_AFTER_S = 0.5
"""How long a handler call holds the loop before PingStandby starts accepting."""
_WATCH_EVERY_S = 0.25
"""How often PingStandby looks at the loop; a ping waits at most this plus the above."""
_READ_TIMEOUT_S = 2.0
"""How long PingStandby waits for a new connection's request line (and a ping's head)."""
_PING_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class Runner(Protocol):
    """Runs handler calls for the app: on the loop, or on threads."""

    count: int
    """How many calls run at once."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


def runner(workers: int) -> Inline | HandlerThreads:
    """The runner for ``SAGEMAKER_MODEL_SERVER_WORKERS=workers``."""
    return Inline() if workers == 1 else HandlerThreads(workers)


def batch_runner(runner: Runner) -> Runner:
    """What runs batches: ``runner``'s threads, or one thread when it runs inline. A batch
    is worth the hand-off, and the loop must gather the next one while it runs."""
    return HandlerThreads(1) if isinstance(runner, Inline) else runner


class Inline:
    """Handler calls on the event loop itself, one at a time; ``since`` says for how long
    the current one has run (0.0: none runs), for PingStandby to read."""

    count = 1

    def __init__(self) -> None:
        self.since = 0.0

    def __repr__(self) -> str:
        return "Inline()"

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, here and now; the loop waits for it."""
        return self.call(fn, *args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``run`` for a caller that is no coroutine (http/direct.py)."""
        self.since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.since = 0.0


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


class PingStandby:
    """A thread that answers ``/ping`` on ``sock`` while ``inline`` holds the loop.

    Started once the server listens (:func:`shipyard.runtime.server.serve`), with the loop
    and the function that makes the server's protocol for a connection, so that a
    connection it accepts but does not answer is served by the loop exactly as one the
    loop accepted itself. It never reads such a connection's bytes (it only peeks at the
    request line), and a keep-alive connection the loop already holds stays the loop's.
    """

    def __init__(self, sock: socket.socket, inline: Inline) -> None:
        self.sock = sock
        self.inline = inline

    def __repr__(self) -> str:
        return f"PingStandby({self.inline!r})"

    def start(
        self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], asyncio.Protocol]
    ) -> None:
        self._loop = loop
        self._protocol = protocol
        Thread(target=self._watch, name="shipyard-ping-standby", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(_WATCH_EVERY_S)
            since = self.inline.since
            if since and time.monotonic() - since >= STANDBY_AFTER_S:
                try:
                    self._stand_in(since)
                except Exception:  # a bug here must not end the thread
                    log.exception("the ping standby failed; watching again")

    def _stand_in(self, since: float) -> None:
        """Accept while the call that began at ``since`` still holds the loop."""
        while self.inline.since == since:
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready or self.inline.since != since:
                continue  # (the loop is free again: the connection is its to take)
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                continue  # the loop took it
            except OSError:  # the server closed its socket: it is stopping
                return
            if not self._answered_ping(conn):
                conn.setblocking(False)
                self._loop.call_soon_threadsafe(self._hand_over, conn)

    def _answered_ping(self, conn: socket.socket) -> bool:
        """Answer ``conn`` when it asks ``GET``/``HEAD /ping``; False, with nothing read,
        for anything else (or no request line within the timeout)."""
        conn.settimeout(_READ_TIMEOUT_S)
        deadline = time.monotonic() + _READ_TIMEOUT_S
        try:
            line = conn.recv(64, socket.MSG_PEEK)
            while line and b"\r\n" not in line and len(line) < 64:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)  # the line is coming in pieces: look again
                line = conn.recv(64, socket.MSG_PEEK)
        except OSError:  # timed out or reset: the loop will find it so
            return False
        if not line.startswith((b"GET /ping ", b"HEAD /ping ")):
            return False
        try:
            head = b""
            while b"\r\n\r\n" not in head and time.monotonic() < deadline:
                chunk = conn.recv(4096)  # a ping has no body: its head is all of it
                if not chunk:
                    break
                head += chunk
            conn.sendall(_PING_ANSWER)
        except OSError:
            pass  # the gateway gave up on this ping; it will send another
        finally:
            conn.close()
        return True

    def _hand_over(self, conn: socket.socket) -> None:
        """On the loop: serve ``conn`` as if the server had accepted it."""
        task = self._loop.create_task(self._loop.connect_accepted_socket(self._protocol, conn))
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("a connection taken while busy could not be served: %s", task.exception())
