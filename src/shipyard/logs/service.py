"""Log streams in CloudWatch Logs' terms, read from the files shipyard already writes.

The sagemaker SDK's ``fit()`` and ``aws logs tail`` read logs through the CloudWatch Logs
API, so the gateway serves the part of it they use (actions/logs.py) over two groups:

- ``/aws/sagemaker/TrainingJobs``: one stream per job, ``<job>/algo-1-<created epoch>``,
  its attempts' ``job.log`` files one after the other;
- ``/aws/sagemaker/ProcessingJobs``: likewise, one stream per processing job;
- ``/aws/sagemaker/Endpoints/<endpoint>``: one stream per instance,
  ``<variant>/<instance id>``, its log file.

Each line is an event. The files keep no time per line, so every event of a stream
carries the time its file was last written: enough for ``aws logs tail --since`` and for
the SDK, which print messages in order. Tokens are byte offsets into the stream
(``f/<offset>``), so reading on from a token never repeats or skips a line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shipyard.errors import LogResourceNotFound
from shipyard.job_contract import open_untrusted, untrusted_size
from shipyard.jobs.service import JobService
from shipyard.provisioning.fleet import TRANSFORM_JOB_LOGS
from shipyard.records import Job

JOBS_GROUP = "/aws/sagemaker/TrainingJobs"
PROCESSING_GROUP = "/aws/sagemaker/ProcessingJobs"
ENDPOINTS_GROUP = "/aws/sagemaker/Endpoints/"

MAX_EVENTS = 10_000
MAX_BYTES = 1 << 20
"""GetLogEvents' own limits per call: 10,000 events or 1 MB."""


@dataclass(frozen=True, slots=True)
class LogStream:
    name: str
    files: tuple[Path, ...]
    created_ms: int

    def size(self) -> int:
        return sum(_size(f) for f in self.files)

    def last_written_ms(self) -> int:
        stamps: list[int] = []
        for f in self.files:
            with contextlib.suppress(OSError):  # not followed: a job may have left a link
                stamps.append(int(f.lstat().st_mtime * 1000))
        return max(stamps, default=self.created_ms)


@dataclass(frozen=True, slots=True)
class LogEvent:
    timestamp_ms: int
    message: str
    offset: int
    """Byte offset of the line in its stream."""


class LogService:
    """The log groups and streams of this gateway's jobs and endpoint instances."""

    def __init__(
        self, *, jobs: JobService, logs_dir: Path, processing: _Jobs | None = None
    ) -> None:
        self.jobs = jobs
        self.processing = processing
        self.logs_dir = logs_dir
        """Where instance logs are: ``<logs_dir>/<endpoint>/<instance id>.log`` (and a
        transform job's under TRANSFORM_JOB_LOGS, which is no endpoint's)."""

    def __repr__(self) -> str:
        return f"LogService(logs_dir={str(self.logs_dir)!r})"

    def groups(self) -> list[str]:
        folder = self.logs_dir
        endpoints = (
            sorted(p.name for p in folder.iterdir() if p.name != TRANSFORM_JOB_LOGS)
            if folder.is_dir()
            else []
        )
        jobs = [JOBS_GROUP] if self.processing is None else [JOBS_GROUP, PROCESSING_GROUP]
        return [*jobs, *(ENDPOINTS_GROUP + name for name in endpoints)]

    def streams(self, group: str) -> list[LogStream]:
        """Every stream of ``group``, by name; LogResourceNotFound for an unknown group."""
        if group == JOBS_GROUP:
            return _job_streams(self.jobs)
        if group == PROCESSING_GROUP and self.processing is not None:
            return _job_streams(self.processing)
        if group.startswith(ENDPOINTS_GROUP):
            endpoint = group.removeprefix(ENDPOINTS_GROUP)
            folder = self.logs_dir / endpoint
            if endpoint not in ("", TRANSFORM_JOB_LOGS) and "/" not in endpoint and folder.is_dir():
                return sorted(
                    (_instance_stream(endpoint, path) for path in folder.glob("*.log")),
                    key=lambda s: s.name,
                )
        raise LogResourceNotFound("The specified log group does not exist.")

    def stream(self, group: str, name: str) -> LogStream:
        for stream in self.streams(group):
            if stream.name == name:
                return stream
        raise LogResourceNotFound("The specified log stream does not exist.")

    def events(
        self, stream: LogStream, *, start: int, limit: int = MAX_EVENTS
    ) -> tuple[list[LogEvent], int]:
        """Up to ``limit`` whole lines from byte ``start``; the offset after the last."""
        stamp = stream.last_written_ms()
        events: list[LogEvent] = []
        taken = 0
        offset = start
        for line_offset, line in _lines(stream.files, start):
            if len(events) >= limit or taken + len(line) > MAX_BYTES:
                break
            message = line.decode(errors="replace").rstrip("\r\n")
            events.append(LogEvent(stamp, message, line_offset))
            taken += len(line)
            offset = line_offset + len(line)
        return events, offset


class _Jobs(Protocol):
    def list_jobs(self) -> list[Job]: ...
    def log_files(self, name: str) -> list[Path]: ...


def _job_streams(jobs: _Jobs) -> list[LogStream]:
    found = []
    for job in jobs.list_jobs():
        created_ms = int(job.created.timestamp() * 1000)
        name = f"{job.name}/algo-1-{created_ms // 1000}"
        found.append(LogStream(name, tuple(jobs.log_files(job.name)), created_ms))
    return sorted(found, key=lambda s: s.name)


def _instance_stream(endpoint: str, path: Path) -> LogStream:
    instance = path.stem
    # Instance ids are <endpoint>-<variant>-<n> (provisioning/fleet.py).
    variant = instance.removeprefix(f"{endpoint}-").rpartition("-")[0] or "AllTraffic"
    created_ms = int(path.stat().st_ctime * 1000)
    return LogStream(f"{variant}/{instance}", (path,), created_ms)


def _size(path: Path) -> int:
    return untrusted_size(path)


def _lines(files: tuple[Path, ...], start: int) -> Iterator[tuple[int, bytes]]:
    """(offset in the stream, line) of every complete line at or after ``start``.

    A last line without its newline is still being written: it is left for a later
    read, so a follower never sees half a line twice. A job's log is in a folder the
    job's code writes: a link or a FIFO put in its place reads as empty
    (``open_untrusted``), never as the file it points to.
    """
    base = 0
    for path in files:
        size = _size(path)
        if start >= base + size:
            base += size
            continue
        with contextlib.suppress(OSError), open_untrusted(path) as f:
            f.seek(max(start - base, 0))
            position = base + f.tell()
            for line in f:
                if not line.endswith(b"\n"):
                    return
                yield position, line
                position += len(line)
        base += size
