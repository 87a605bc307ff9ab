"""Warm spares: built-in runtime processes started ahead, that become an instance.

A spare (``shipyard.runtime --spare``, runtime/spare.py) imports what the serverless
instances of this home imported (``warm-imports`` in the run folder) and waits on one
end of a socket pair. Told an instance's command, environment and folder, it becomes
that instance without paying the imports; the instance's bound Unix socket travels
with its work (``SCM_RIGHTS``). Spares run unsandboxed, and take no adapters token: the
local backend asks one only for an instance that may use one (``can_take``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shipyard import autogroup
from shipyard.backends.base import InstanceSpec
from shipyard.backends.environment import process_environment
from shipyard.backends.process_groups import die_with_parent, signal_group
from shipyard.runtime import spare

log = logging.getLogger(__name__)

_REFILL_AFTER_S = 0.5
"""How long after a warm start the spares are refilled."""


@dataclass(slots=True)
class _Spare:
    """A warm spare: its process, and our end of the socket pair it waits on."""

    process: subprocess.Popen[bytes]
    channel: socket.socket


class WarmSpares:
    """Up to ``count`` spares waiting, refilled shortly after each is taken.

    Guarantee: ``take`` never waits on a spare for long (a spare that does not read its
    work is killed and the next tried) and returns None rather than fail: the caller
    then starts the instance cold. Spares die with the gateway (``die_with_parent``)
    and are stopped by ``close``.
    """

    def __init__(self, *, run_dir: Path, environ: Mapping[str, str], count: int = 0) -> None:
        self.run_dir = run_dir
        self.count = count
        self._environ = environ
        self._waiting: list[_Spare] = []

    def __repr__(self) -> str:
        return f"WarmSpares(count={self.count}, waiting={len(self._waiting)})"

    @property
    def imports_file(self) -> Path:
        """What the serverless instances of this home imported: what spares preload."""
        return self.run_dir / "warm-imports"

    @property
    def _home(self) -> Path:
        return self.run_dir / "home" / "_spare"

    def _environment(self) -> dict[str, str]:
        return process_environment(self._environ, home=self._home)

    def can_take(self, env: Mapping[str, str]) -> bool:
        """Whether a spare may become an instance started with ``env``: spares are
        kept, and what they imported under their environment holds under this one."""
        return self.count > 0 and spare.can_become(self._environment(), env)

    def pids(self) -> list[int]:
        """The PIDs of the spares waiting."""
        return [s.process.pid for s in self._waiting]

    def take(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        spec: InstanceSpec,
        fds: list[int],
    ) -> subprocess.Popen[bytes] | None:
        """A waiting spare, told to become the instance (the runtime's arguments
        ``argv``, handed ``fds``), and the spares refilled soon; None when none is left.
        ``env`` gains the imports file, where the instance records what it imports."""
        env[spare.IMPORTS_FILE] = str(self.imports_file)
        work = {
            "argv": argv,
            "environ": env,
            "cwd": str(cwd),
            "log": spec.log_path and str(spec.log_path),
            "nice": spec.cpu_nice,
        }
        # Later: a spare importing now would take the CPU the new instance needs.
        asyncio.get_running_loop().call_later(_REFILL_AFTER_S, self.refill)
        line = json.dumps(work).encode() + b"\n"
        while self._waiting:
            waiting = self._waiting.pop(0)
            process = waiting.process
            try:
                if process.poll() is not None:
                    continue
                # Its priority back first, if the kernel takes it now; the spare sees to
                # it otherwise (runtime/spare.py).
                if autogroup.leads_session(process.pid):
                    autogroup.set_nice(process.pid, spec.cpu_nice, 0.0)
                # The descriptor goes with the first bytes; the rest follow on the stream.
                # A spare reads at once; one that does not is not waited for long.
                waiting.channel.settimeout(5.0)
                sent = socket.send_fds(waiting.channel, [line], fds)
                if sent < len(line):
                    # Only what is left: a spare that has its whole line may already
                    # have closed its end, and even an empty send would then fail.
                    waiting.channel.sendall(line[sent:])
            except OSError:
                signal_group(process.pid, signal.SIGKILL)
                process.wait()
                continue
            finally:
                waiting.channel.close()  # the spare reads its work to the end
            return process
        return None

    def refill(self) -> None:
        """Start spares until ``count`` wait; each imports for a second or so on its
        own, off the gateway's path."""
        for gone in [s for s in self._waiting if s.process.poll() is not None]:
            gone.channel.close()
            self._waiting.remove(gone)
        home = self._home
        home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "shipyard.runtime", "--spare"]
        argv += ["--preload-file", str(self.imports_file)]
        while len(self._waiting) < self.count:
            # A socket pair rather than a pipe: it carries descriptors (runtime/spare.py).
            channel, theirs = socket.socketpair()
            try:
                process = subprocess.Popen(
                    argv,
                    env=self._environment(),
                    cwd=home,
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=functools.partial(die_with_parent, os.getpid()),
                )
            except OSError as exc:
                channel.close()
                log.warning("could not start a warm spare: %s", exc)
                return
            finally:
                theirs.close()
            if autogroup.leads_session(process.pid):  # one try: the spare waits out refusals
                autogroup.set_nice(process.pid, spare.WAITING_NICE, 0.0)
            self._waiting.append(_Spare(process, channel))

    def close(self) -> None:
        """Stop the spares: each reads the end of its channel and exits, or is killed."""
        spares, self._waiting = self._waiting, []
        for waiting in spares:
            waiting.channel.close()  # a spare reads EOF and exits
        for process in (s.process for s in spares):
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                signal_group(process.pid, signal.SIGKILL)
                process.wait()
