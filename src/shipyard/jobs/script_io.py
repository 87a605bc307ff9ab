"""What a running job writes beside its script: the combined log and checkpoint syncs.

Both work from threads of the runner, since the script's pipes and the sync period run
on their own clocks.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path
from typing import IO

from shipyard.errors import ArtifactError
from shipyard.storage.artifacts import ArtifactStore, FileStamp

log = logging.getLogger(__name__)

_MAX_LINE_BYTES = 64 * 1024  # a longer "line" is logged in pieces, never held whole


class JobLog:
    """``job.log``: the script's stdout and stderr and the runner's own lines, in one file.

    Each line is written and flushed whole under a lock, so the two pipes and the runner
    never interleave mid-line, and whoever tails the file sees a line as soon as it exists.
    """

    def __init__(self, path: Path) -> None:
        self._file = open(path, "ab")
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JobLog({self._file.name!r})"

    def close(self) -> None:
        self._file.close()

    def write(self, line: str) -> None:
        with self._lock:
            if self._file.closed:  # a pipe held open by something that left the script's group
                return
            self._file.write(line.encode(errors="replace") + b"\n")
            self._file.flush()

    def note(self, message: str) -> None:
        """A line of the runner's own, told apart from the script's by its prefix."""
        self.write(f"[shipyard] {message}")
        log.info("%s", message)

    def follow(self, stream: IO[bytes], tail: deque[str] | None = None) -> threading.Thread:
        """Copy ``stream`` line by line until it closes, in a thread; keep a ``tail``."""

        def pump() -> None:
            with stream:
                for raw in iter(lambda: stream.readline(_MAX_LINE_BYTES), b""):
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    self.write(line)
                    if tail is not None:
                        tail.append(line)

        thread = threading.Thread(target=pump, name="job-log", daemon=True)
        thread.start()
        return thread


class CheckpointSync:
    """Syncs the checkpoint folder up every ``period_s`` in a thread, and once at finish().

    Only new or changed files are sent. A failed sync is logged and the next one sends
    what did not get through, so a lost runner leaves the last good sync behind it.
    """

    def __init__(
        self,
        store: ArtifactStore,
        local_dir: Path,
        uri: str,
        *,
        period_s: float,
        job_log: JobLog,
        root: Path | None = None,
    ) -> None:
        self._store = store
        self._local_dir = local_dir
        self._root = root
        """The trusted folder ``local_dir`` lies in (the job's ``/opt/ml`` tree): from
        there down, no link is followed (ArtifactStore.sync_up)."""
        self._uri = uri
        self._period_s = period_s
        self._log = job_log
        self._stamps: dict[str, FileStamp] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-sync", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"CheckpointSync({str(self._local_dir)!r} -> {self._uri!r})"

    def finish(self) -> None:
        """Stop the periodic syncs and sync once more, after the script has ended."""
        self._done.set()
        self._thread.join()
        self._sync()

    def _loop(self) -> None:
        while not self._done.wait(self._period_s):
            self._sync()

    def _sync(self) -> None:
        try:
            stamps = self._store.sync_up(
                self._local_dir, self._uri, previous=self._stamps, root=self._root
            )
        except ArtifactError as exc:
            self._log.note(f"Checkpoint sync failed; retrying at the next one: {exc}")
            return
        sent = sum(1 for rel, stamp in stamps.items() if self._stamps.get(rel) != stamp)
        self._stamps = stamps
        if sent:
            self._log.note(f"Synced {sent} checkpoint file(s) to {self._uri}")
