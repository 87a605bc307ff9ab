"""A session's share of the CPU: the nice value of its autogroup (Linux, sched(7)).

Where autogroups are on, the kernel shares the CPU between sessions' scheduling groups,
weighed by each group's nice value; a process's own nice value ranks it only among the
processes of its session. The local backend starts every instance and spare in a session
of its own, so a group's value is what lowers one beside the others. Unlike a process's
own nice value or ``SCHED_IDLE``, a group's may be set back down to 0 without
``CAP_SYS_NICE``.

The kernel takes one change a tenth of a second from all processes without
``CAP_SYS_ADMIN`` together, host-wide, and refuses the others with ``EAGAIN``: a change
is retried for as long as its caller can wait. Where the kernel has no autogroups the
changes fail, and where they are off, or the process is in a CPU cgroup other than the
root, they are taken and change nothing: either way the process runs as it would without.
"""

from __future__ import annotations

import os
import time

_RETRY_S = 0.01
BEFORE_EXEC_PATIENCE_S = 1.0
"""How long a process lowered as it starts, before exec, waits out the kernel's
refusals."""


def nice(pid: int | str = "self") -> int | None:
    """The nice value of the autogroup of ``pid``; None where there is none to read."""
    try:
        with open(f"/proc/{pid}/autogroup", encoding="ascii") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def leads_session(pid: int) -> bool:
    """Whether ``pid`` leads a session of its own: its autogroup is its alone."""
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def set_nice(pid: int | str, value: int, patience_s: float) -> bool:
    """Set the nice value of the autogroup of ``pid`` (a number or ``self``), retrying the
    kernel's refusals for up to ``patience_s`` (0: one try, never a sleep); whether it was
    set. The caller makes sure the group is the process's alone (:func:`leads_session`)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fd = os.open(f"/proc/{pid}/autogroup", os.O_WRONLY)
        except OSError:
            return False  # no autogroups in this kernel, or the process is gone
        try:
            os.write(fd, str(value).encode())
            return True
        except BlockingIOError:  # EAGAIN: another change was taken less than 0.1 s ago
            if time.monotonic() >= deadline:
                return False
        except OSError:
            return False
        finally:
            os.close(fd)
        time.sleep(_RETRY_S)
