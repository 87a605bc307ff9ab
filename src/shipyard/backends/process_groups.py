"""Process groups: how the local backend starts, signals and measures its processes.

Each instance and job runner is a child process in its own session, so its process
group id is its PID: signalling that group reaches whatever it spawned (a user's
``cmd:`` server may fork workers) and nothing else.

A sandboxed process (backends/sandbox.py) is a ``bwrap``, whose group a SIGKILL ends
whole; polite signals (SIGTERM) go to the processes inside instead (``signal_inside``),
since ``bwrap`` itself dies of them at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping

import psutil

from shipyard import autogroup

_PR_SET_PDEATHSIG = 1


def start_instance(gateway_pid: int, cpu_nice: int) -> None:
    """In an instance's process, before exec: tied to the gateway, at its CPU priority.

    The instance leads a session of its own: its nice value ranks it only within that
    session's autogroup, so the group's is set too (shipyard/autogroup.py)."""
    die_with_parent(gateway_pid)
    if cpu_nice:
        os.nice(cpu_nice)
        autogroup.set_nice("self", cpu_nice, autogroup.BEFORE_EXEC_PATIENCE_S)


def die_with_parent(gateway_pid: int, sig: int = signal.SIGKILL) -> None:
    """In the child, before exec: the kernel sends it ``sig`` when the gateway dies.

    PR_SET_PDEATHSIG fires when the thread that forked exits, so instances are started
    from the event loop's thread (``start`` is a coroutine; never call it through
    ``to_thread``), which lives as long as the gateway. A gateway that died between the
    fork and here is not noticed by the kernel, so the child checks its parent itself.
    Linux only: elsewhere (macOS) there is no prctl, and ``stop_leftovers`` at the next
    start does the work.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != gateway_pid:
        os._exit(1)


def groups_carrying(instances: Mapping[int, str]) -> set[int]:
    """Which of the process groups ``instances`` (group id to instance id) still live.

    A group lives while one of its processes does, and it is the instance's when that
    process has ``SHIPYARD_INSTANCE_ID=<id>`` in its environment (inherited from the
    leader, which may be gone): a reused PID is not mistaken for it. One pass over the
    process table, through psutil (Linux's /proc, macOS's sysctl).
    """
    found: set[int] = set()
    if not instances:
        return found
    for proc in psutil.process_iter():
        try:
            pgid = os.getpgid(proc.pid)
            if pgid not in instances or pgid in found:
                continue
            if proc.environ().get("SHIPYARD_INSTANCE_ID") == instances[pgid]:
                found.add(pgid)
        except (OSError, psutil.Error):
            continue
    return found


def signal_inside(pid: int, sig: int, *, group: bool) -> None:
    """Send ``sig`` to the processes a sandbox's bwrap (``pid``) runs, not to bwrap.

    bwrap handles no signal: a SIGTERM kills it at once, and its end SIGKILLs the
    sandbox, so the process inside would never get to stop politely. Inside, bwrap's
    own init (its child) runs the command: ``group`` sends to every process of bwrap's
    group under that init (as ``killpg`` would, but for bwrap and its init), else to
    the command alone (as ``kill`` would).
    """
    try:
        inits = psutil.Process(pid).children()
        inside = [p for init in inits for p in init.children(recursive=group)]
    except psutil.Error:
        return
    for process in inside:
        with contextlib.suppress(OSError, psutil.Error):
            if not group or os.getpgid(process.pid) == pid:
                process.send_signal(sig)


def group_lives(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` still runs. Zombies do not count: an
    orphan's waits for a parent that may not reap it (the init of some containers does not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                return True
    return False


def signal_group(pid: int, sig: signal.Signals) -> None:
    # The instance leads its own session (start_new_session), so its process group id is
    # its PID: this reaches the children it spawned and nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def tree_sum(pid: int, measure: Callable[[psutil.Process], float]) -> float | None:
    """``measure`` added up over the process ``pid`` and all it spawned; None when
    that process is gone."""
    try:
        leader = psutil.Process(pid)
        processes = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):  # a child that just ended
            total += measure(process)
    return total
