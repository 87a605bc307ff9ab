"""``shipyard serve --workers N``: N gateway processes on one port, one home, one store.

A gateway's data path runs on its event loop, and one loop is at most one core: on a
machine with cores to spare, one gateway caps every endpoint behind it
(bench/results/lead.md, "On 16 cores"). Workers are what several gateways on one database
(docs/deploying/several-gateways.md) already allow, on one host and one port:

- each worker is a whole gateway, with an identity of its own (``Settings.identity``: the
  host, the home and the worker's index) and a run folder of its own
  (``Settings.run_dir``), so each fleet is leased to one worker, every worker routes to
  it, and no worker stops what another one started: N workers never mean N fleets;
- the supervisor (this process, which serves nothing) binds the port once and hands the
  listening socket down; the workers accept from it in turn. No ``SO_REUSEPORT``: any
  process of the same user, a sandboxed model's included (its user namespace maps it to
  the gateway's user), could join such a port and take its connections;
- worker 0 is the gateway a plain ``shipyard serve`` on that home is (same identity,
  lock and run folder), the only one that serves ``--grpc-port`` and deploys ``--demo``.
  The supervisor migrates the store before it starts the workers, which start together.

The supervisor passes SIGTERM and SIGINT on (a second one kills the workers), and
starts again a worker that died, after a pause that doubles while it keeps dying within
``_SETTLE_S`` of its start (its fleets' leases pass to the others meanwhile, or back to
it). A worker says it is serving through a pipe (``READY_VARIABLE``) once uvicorn has
started it; one that exits within ``_SETTLE_S`` of its first start before saying so
failed to start (a bad flag, a store it cannot open): then the supervisor stops the
others and exits with that worker's status. A worker that said so is started again
however soon it died (one killed a second after it came up took the others down when
its age alone decided), and so is one whose first start failed only after ``_SETTLE_S``
(a store that went away meanwhile, say).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # the CLI's other commands load none of the gateway
    import uvicorn

    from shipyard.settings import Settings

_SETTLE_S = 10.0
_PAUSE_MAX_S = 30.0
_SLOW_START_S = 60.0
"""A worker not serving this long after its start is reported (once), as it may hang."""
log = logging.getLogger(__name__)
SOCKET_VARIABLE = "SHIPYARD_WORKER_SOCKET"
"""A worker's environment: the descriptor of the listening socket its supervisor bound."""
READY_VARIABLE = "SHIPYARD_WORKER_READY"
"""A worker's environment: the descriptor of the pipe it writes to once it serves."""


def hold_home(lock: Path) -> IO[bytes]:
    """Lock ``lock`` (``Settings.home_lock``) for as long as this process lives.

    Two gateways with one identity would each take its leases and start each fleet
    again; this is where a second one is refused. The lock goes with the process, a
    killed one's too.

    Raises:
        ValueError: another process holds it.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        held = os.fdopen(os.open(lock, flags, 0o600), "ab")  # held for the process's life
    except OSError as exc:  # a link planted there (ELOOP), a folder, no permission
        raise ValueError(f"home {lock.parent}: cannot lock {lock.name}: {exc}") from None
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.close()
        raise ValueError(
            f"home {lock.parent}: another gateway serves from it ({lock.name} is locked). "
            "One home serves one gateway; run several on one port with --workers."
        ) from None
    return held


def listening_socket(host: str, port: int) -> socket.socket:
    """The port, bound once by the supervisor for all its workers (as uvicorn binds it:
    ``SO_REUSEADDR``, so a restart does not wait out old connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def inherited_socket() -> socket.socket:
    """In a worker: the listening socket its supervisor handed down, kept from the
    worker's own children (its instances)."""
    sock = socket.socket(fileno=int(os.environ[SOCKET_VARIABLE]))
    sock.set_inheritable(False)
    return sock


def ready_pipe() -> int | None:
    """In a worker: the pipe to tell its supervisor it serves (``say_ready``), kept from
    the worker's own children; None in a gateway alone."""
    value = os.environ.pop(READY_VARIABLE, None)
    if value is None:
        return None
    fd = int(value)
    os.set_inheritable(fd, False)
    return fd


def say_ready(fd: int) -> None:
    """Tell the supervisor this worker serves: one byte, and the pipe closed. A
    supervisor gone (its workers are being stopped) is logged, not raised: raised here,
    uvicorn would skip the gateway's shutdown."""
    try:
        os.write(fd, b"\n")
    except OSError as exc:
        log.warning("worker serving, but its supervisor could not be told: %s", exc)
        return
    finally:
        os.close(fd)
    log.info("worker serving: its supervisor was told")


def server(config: uvicorn.Config, ready: int | None) -> uvicorn.Server:
    """uvicorn's server; in a worker (``ready``: ``ready_pipe()``), one that tells its
    supervisor once it serves: its app started and the socket taken."""
    import uvicorn

    if ready is None:
        return uvicorn.Server(config)
    fd = ready

    class Worker(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                say_ready(fd)

    return Worker(config)


def supervise(settings: Settings, argv: Sequence[str]) -> int:
    """Run ``settings.workers`` workers of ``shipyard <argv>`` until a signal; the exit
    status.

    The store is created and migrated here first: workers starting together on a new
    SQLite file would race to switch it to WAL (one found it locked and failed).

    Raises:
        OSError: the port cannot be bound.
    """
    from shipyard.storage.metadata import MetadataStore

    with listening_socket(settings.host, settings.port) as sock:
        settings.home.mkdir(parents=True, exist_ok=True)
        store = MetadataStore(settings.db_url)
        try:
            store.migrate()
        finally:
            store.close()
        # Where the workers serve their metrics to one another (gateway/ops/worker_metrics.py):
        # a folder of this run's alone (mode 0700), gone with it.
        with tempfile.TemporaryDirectory(prefix="shipyard-workers-") as peers:
            return _Supervisor(argv, sock, Path(peers)).run(settings.workers)


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    ready: int
    """The read end of the pipe it says it serves through (``say_ready``)."""
    started: float
    first: bool = True
    """Its first start: dying before it served then is failing to start, and ends the
    supervisor."""
    restarts: int = 0
    """Starts in a row that died young: the pause before the next one doubles with it."""
    died: float | None = None
    served: bool = False
    """It said it serves."""
    slow: bool = False
    """Reported as slow to start (``_SLOW_START_S``)."""

    def has_served(self) -> bool:
        """Whether it said it serves; read without waiting."""
        if not self.served:
            try:
                self.served = bool(os.read(self.ready, 1))
            except BlockingIOError:  # nothing said yet
                pass
        return self.served

    def close(self) -> None:
        os.close(self.ready)


class _Supervisor:
    def __init__(self, argv: Sequence[str], sock: socket.socket, peers: Path) -> None:
        self.argv = list(argv)
        self.sock = sock
        self.peers = peers
        self.fd = sock.fileno()
        self.workers: dict[int, _Worker] = {}
        self.signals = 0
        self.status = 0

    def run(self, count: int) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        for index in range(count):
            if not self.signals:
                self.workers[index] = self._start(index)
        while not self.signals:
            time.sleep(0.2)
            if not self.signals:
                self._watch()
        for worker in self.workers.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        # New connections are refused from now on, as a plain gateway's are while it
        # drains, rather than queued where no worker will take them.
        self.sock.close()
        for worker in self.workers.values():
            while worker.process.poll() is None:
                if self.signals > 1:  # asked again: no more waiting for drains
                    worker.process.kill()
                time.sleep(0.05)
            worker.close()
        return self.status

    def _signal(self, signum: int, frame: object) -> None:
        self.signals += 1

    def _start(self, index: int, first: bool = True, restarts: int = 0) -> _Worker:
        from shipyard.backends.process_groups import die_with_parent

        read, write = os.pipe()
        os.set_blocking(read, False)
        env = dict(os.environ, SHIPYARD_WORKER=str(index))
        env.update({SOCKET_VARIABLE: str(self.fd), READY_VARIABLE: str(write)})
        env["SHIPYARD_WORKER_PEERS"] = str(self.peers)  # Settings.worker_peers
        command = [sys.executable, "-m", "shipyard", *self.argv]
        try:
            # A group of its own: a terminal's Ctrl-C reaches the supervisor alone, which
            # passes one SIGTERM on (a second signal would make uvicorn skip its drain).
            process = subprocess.Popen(
                command,
                env=env,
                pass_fds=(self.fd, write),
                process_group=0,
                # SIGTERM when the supervisor dies: a drain, as any stop.
                preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGTERM),
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)  # the worker's own now
        return _Worker(process, read, time.monotonic(), first, restarts)

    def _watch(self) -> None:
        now = time.monotonic()
        for index, worker in list(self.workers.items()):
            pid = worker.process.pid
            if worker.process.poll() is None:
                if not worker.slow and now - worker.started > _SLOW_START_S:
                    if not worker.has_served():
                        log.warning(
                            "worker %d (pid %d) is not serving %.0f s after its start",
                            index,
                            pid,
                            now - worker.started,
                        )
                    worker.slow = True
                continue
            if worker.died is None:
                worker.died = now
                code = worker.process.returncode
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                log.warning(
                    "worker %d (pid %d) %s after %.1f s", index, pid, how, now - worker.started
                )
            young = worker.died - worker.started < _SETTLE_S
            if worker.first and young and not worker.has_served():  # it never came up
                log.error("worker %d failed to start: stopping the others", index)
                self.status = _exit_status(worker.process.returncode)
                self.signals = max(self.signals, 1)
                return
            pause = min(2.0**worker.restarts, _PAUSE_MAX_S) if young else 0.0
            if now - worker.died >= pause:
                worker.close()
                restarts = worker.restarts + 1 if young else 0
                self.workers[index] = self._start(index, False, restarts)
                log.warning(
                    "worker %d started again (pid %d)", index, self.workers[index].process.pid
                )


def _exit_status(code: int) -> int:
    """A child's return code as a shell gives it: 128 + N for a signal N."""
    return 128 - code if code < 0 else code or 1
