"""``shipyard serve --workers N``: N gateway processes on one port, one home, one store.

A gateway's data path runs on its event loop, and one loop is at most one core: on a
machine with cores to spare, one gateway caps every endpoint behind it
(bench/results/lead.md, "On 16 cores"). Workers are what DESIGN 4.1 already allows,
several gateways on one store, on one host and one port:

- each worker is a whole gateway, with an identity of its own (``Settings.identity``: the
  host, the home and the worker's index), so each fleet is leased to one worker and every
  worker routes to it: N workers never mean N fleets;
- each binds the port with ``SO_REUSEPORT``, and the kernel spreads new connections over
  them;
- worker 0 is the gateway a plain ``shipyard serve`` on that home is (same identity and
  lock), the only one that serves ``--grpc-port`` and deploys ``--demo``, and it starts
  first: it creates or migrates the store the others open.

This process, the supervisor, serves nothing. It starts the workers, passes SIGTERM and
SIGINT on to them, and starts again a worker that died (its fleets' leases pass to the
others meanwhile, or back to it). A worker that exits within ``_SETTLE_S`` of its start
failed to start (a port in use, a bad flag): then the supervisor stops the others and
exits with that worker's status, rather than start it again and again.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

_SETTLE_S = 10.0
_PR_SET_PDEATHSIG = 1


def hold_home(lock: Path) -> IO[bytes]:
    """Lock ``lock`` (``Settings.home_lock``) for as long as this process lives.

    Two gateways with one identity would each take its leases and start each fleet
    again; this is where a second one is refused. The lock goes with the process, a
    killed one's too.

    Raises:
        ValueError: another process holds it.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = open(lock, "ab")  # held open for the process's life
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.close()
        raise ValueError(
            f"home {lock.parent}: another gateway serves from it ({lock.name} is locked). "
            "One home serves one gateway; run several on one port with --workers."
        ) from None
    return held


def shared_socket(host: str, port: int) -> socket.socket:
    """The listening socket of one worker: ``port`` with ``SO_REUSEPORT``, so that the
    other workers (processes of the same user) bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def supervise(count: int, host: str, port: int, argv: Sequence[str]) -> int:
    """Run ``count`` workers of ``shipyard <argv>`` until a signal; the exit status."""
    return _Supervisor(argv).run(count, host, port)


class _Supervisor:
    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.workers: dict[int, tuple[subprocess.Popen[bytes], float]] = {}
        self.stopping = False
        self.status = 0

    def run(self, count: int, host: str, port: int) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        first = self._start(0)
        while not self.stopping and not _listening(host, port):
            if first.poll() is not None:
                return first.returncode
            time.sleep(0.05)
        for index in range(1, count):
            self._start(index)
        while not self.stopping:
            time.sleep(0.2)
            self._restart_the_dead()
        for child, _ in self.workers.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child, _ in self.workers.values():
            child.wait()
        return self.status

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _start(self, index: int) -> subprocess.Popen[bytes]:
        env = dict(os.environ, SHIPYARD_WORKER=str(index))
        command = [sys.executable, "-m", "shipyard", *self.argv]
        # A group of its own: a terminal's Ctrl-C reaches the supervisor alone, which
        # passes one SIGTERM on (a second signal would make uvicorn skip its drain).
        child = subprocess.Popen(command, env=env, process_group=0, preexec_fn=_tied)
        self.workers[index] = (child, time.monotonic())
        return child

    def _restart_the_dead(self) -> None:
        for index, (child, started) in list(self.workers.items()):
            if child.poll() is None:
                continue
            if time.monotonic() - started < _SETTLE_S:  # it never came up: give up
                self.status, self.stopping = child.returncode or 1, True
                return
            self._start(index)


def _listening(host: str, port: int) -> bool:
    """Whether a worker accepts on ``port`` (a wildcard ``host`` asked at loopback)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    with contextlib.suppress(OSError), socket.create_connection((target, port), timeout=1):
        return True
    return False


def _tied() -> None:
    """In a worker, before exec: SIGTERM (a drain, as any stop) when the supervisor dies.
    Linux only; elsewhere a killed supervisor leaves its workers serving."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
