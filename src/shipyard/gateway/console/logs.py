"""Instance logs for the console: the end of each log file of an endpoint or a job.

Endpoint instances and a transform job's instances write ``<home>/logs/<name>/<instance
id>.log`` (provisioning/fleet.py). The console shows the last lines of the most recently
written few, rendered again at each poll: enough to see why an instance died or what
it prints now. The whole history is one ``shipyard logs`` or GetLogEvents away.
"""

from __future__ import annotations

import re
from pathlib import Path

TAIL_BYTES = 16 * 1024
"""Of each instance's log, the most shown."""
MAX_INSTANCES = 8
"""Logs shown, most recently written first."""

_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
"""SageMaker's pattern for endpoint and job names: nothing that could leave the folder."""


def instance_tails(logs_dir: Path, name: str) -> list[tuple[str, str]]:
    """(instance id, the last lines of its log) for the instances of ``name``."""
    if not _NAME.fullmatch(name):
        return []
    found: list[tuple[float, Path]] = []
    for path in (logs_dir / name).glob("*.log"):
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            continue  # removed meanwhile
    tails = []
    for _, path in sorted(found, reverse=True)[:MAX_INSTANCES]:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                start = max(0, size - TAIL_BYTES)
                f.seek(start)
                data = f.read(TAIL_BYTES)
        except OSError:
            continue
        if start > 0:
            data = data[data.find(b"\n") + 1 :]  # from the first whole line
        tails.append((path.stem, data.decode(errors="replace")))
    return tails
