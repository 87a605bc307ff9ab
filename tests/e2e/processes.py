"""Finding the instance processes a gateway started, by PID (via /proc)."""

from __future__ import annotations

from pathlib import Path

import psutil


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def instance_pids(gateway_pid: int) -> list[int]:
    """PIDs of the gateway's instance processes (its direct children running shipyard)."""
    pids = []
    for pid in children(gateway_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--spare" in cmdline and not listening(pid):
            continue  # a warm spare waiting for work is not an instance yet
        if b"shipyard.runtime" in cmdline or any(b"server.py" in a for a in cmdline):
            pids.append(pid)
    return sorted(pids)


def listening(pid: int) -> bool:
    """Whether the process has a TCP socket listening."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN for c in connections)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"
