"""The files between the gateway and a job's runner, in the job's working folder.

The gateway and the runner never talk directly: a runner must outlive the gateway that
started it, and a new gateway must pick it up from disk alone. So the working folder is
the whole protocol, and this module is its one definition:

- ``job.json`` (gateway → runner): a JobSpec, written before the runner starts.
- ``status.jsonl`` (runner → gateway): append-only StatusLines, one JSON object per
  line, each flushed and fsync'd. Exactly one line carries ``final`` and it is the last.
- ``job.log``: the script's stdout and stderr and the runner's ``[shipyard]`` lines.
- ``runner.pid``: the runner's PID, locked (``flock``) for as long as the runner lives.
- ``script.pid``: the script's PID, which is also its process group and session id;
  present while the script may be running, removed once it and its group are gone.

The job's own processes write this folder (in a sandbox, ``auth.sandbox``, they are the
only ones that may), so anything in it may have been replaced by the job's code: a link
to a file the job cannot see, a FIFO that never answers. The gateway opens what it
reads there, and what it writes there once the runner runs, with :func:`open_untrusted`
only, and sizes it with :func:`untrusted_size`.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import TypeAdapter, ValidationError

from shipyard.beneath import open_folder

JOB_FILE = "job.json"
STATUS_FILE = "status.jsonl"
LOG_FILE = "job.log"
RUNNER_PID_FILE = "runner.pid"
SCRIPT_PID_FILE = "script.pid"

SECONDARY_STATUSES = (
    "Starting",
    "Downloading",
    "Training",
    "Uploading",
    "Stopping",
    "Completed",
    "Failed",
    "Stopped",
    "MaxRuntimeExceeded",
)
"""SageMaker's SecondaryStatus values a runner writes, in the order a job meets them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Channel:
    """One InputDataConfig channel; its data lands in ``ml/input/data/<name>/``."""

    name: str
    uri: str
    data_type: str = "S3Prefix"
    content_type: str | None = None
    input_mode: str = "File"


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """CheckpointConfig: ``local_path`` is synced up to ``uri`` while the script runs."""

    uri: str
    local_path: str = "/opt/ml/checkpoints"


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """ResourceConfig, recorded for the script (``SM_RESOURCE_CONFIG``); not enforced."""

    instance_type: str = "ml.m5.large"
    instance_count: int = 1
    volume_size_gb: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What one attempt of one job runs: ``job.json``, written by the gateway.

    URIs (``submit_directory``, channel and checkpoint URIs, ``output_path``) are
    ``s3://`` URIs, ``file://`` URIs or plain paths. Unknown keys are ignored on read,
    so a newer gateway can add fields without breaking an older runner.
    """

    name: str
    arn: str
    image: str
    output_path: str
    started_at: float
    """Epoch seconds when the job was created; ``max_runtime_s`` counts from here."""
    program: str | None = None
    submit_directory: str | None = None
    hyperparameters: Mapping[str, str] = field(default_factory=dict)
    channels: tuple[Channel, ...] = ()
    checkpoint: Checkpoint | None = None
    max_runtime_s: float | None = None
    stop_grace_s: float = 120.0
    environment: Mapping[str, str] = field(default_factory=dict)
    resource: Resource = field(default_factory=Resource)
    attempt: int = 1
    entrypoint: tuple[str, ...] | None = None
    """AlgorithmSpecification.ContainerEntrypoint, for a training image."""
    arguments: tuple[str, ...] | None = None
    """AlgorithmSpecification.ContainerArguments, for a training image."""
    network_isolation: bool = False
    """EnableNetworkIsolation: a training image's container gets no network at all."""

    def locations(self) -> list[str]:
        """Every location the runner reads or writes for the job: the submit directory,
        the channels, the checkpoint and the output path."""
        found = [channel.uri for channel in self.channels]
        if self.submit_directory:
            found.append(self.submit_directory)
        if self.checkpoint is not None:
            found.append(self.checkpoint.uri)
        found.append(self.output_path)
        return found

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        """Parse ``job.json``.

        Raises:
            ValueError: not JSON, or a field is missing or of the wrong type; the
                message names the field.
        """
        try:
            return _job_spec().validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'job'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ValueError(f"invalid {JOB_FILE}: {problems}") from exc

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Build a JobSpec from ``job.json``'s shape (nested dicts, lists); as from_json."""
        return cls.from_json(json.dumps(data))


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How a job ended: the ``final`` object of the last status line."""

    status: str
    """TrainingJobStatus: ``Completed``, ``Failed`` or ``Stopped``."""
    failure_reason: str | None = None
    model_artifacts: str | None = None
    """The uploaded ``model.tar.gz`` URI, on Completed and Stopped."""
    exit_code: int | None = None
    """The script's exit status (negative: killed by that signal); None if it never ran."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusLine:
    """One line of ``status.jsonl``: a SecondaryStatus transition."""

    secondary: str
    time: float
    message: str
    final: Outcome | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        if self.final is None:
            del data["final"]
        return json.dumps(data)


# The validators are built at first use: building one takes pydantic about 0.1 s, which
# every process importing this module would pay at its start (an instance fetching its
# model imports it for ``open_beneath``) whether it reads a job's files or not.
@functools.cache
def _job_spec() -> TypeAdapter[JobSpec]:
    return TypeAdapter(JobSpec)


@functools.cache
def _status_line() -> TypeAdapter[StatusLine]:
    return TypeAdapter(StatusLine)


def append_status(path: Path, line: StatusLine) -> None:
    """Append ``line`` to the status file and make it durable before returning.

    fsync'd, because the gateway acts on what it reads (notifications, retries): a line
    it has seen must survive a crash of this machine.
    """
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_status(path: Path, *, skip: int = 0) -> list[StatusLine]:
    """The complete lines of a status file after the first ``skip``; [] if it is absent.

    A last line without its newline is still being written and is left for the next read.

    Raises:
        ValueError: a complete line is not a status line (the file is not a runner's),
            or the file is no regular file (``open_untrusted``).
    """
    try:
        with open_untrusted(path) as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ValueError(f"{path} cannot be read as a status file: {exc}") from exc
    complete = text.split("\n")[:-1]  # the last piece is "" or a line being written
    try:
        return [_status_line().validate_json(raw) for raw in complete[skip:]]
    except ValidationError as exc:
        raise ValueError(f"{path} holds a line that is not a status line: {exc}") from exc


def open_untrusted(path: Path, *, append: bool = False) -> BinaryIO:
    """Open ``path``, a file that code the gateway does not trust may have replaced (one
    in a job's working folder), for reading or, with ``append``, for appending (created
    if missing): never through a link, and only when it is a regular file.

    ``O_NOFOLLOW`` refuses a link in place of the file (the job's code could point one
    at any file the gateway may read); ``O_NONBLOCK`` keeps a FIFO from blocking the
    open, and the ``fstat`` of what was opened refuses anything but a regular file (a
    FIFO, a device, a socket), so the gateway never waits on what a job put there. The
    folders above ``path`` must be the gateway's: only the last part is not followed.

    Raises:
        FileNotFoundError: nothing there (reading).
        OSError: a link (``ELOOP``), or not a regular file (``EINVAL``).
    """
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_WRONLY | os.O_APPEND | os.O_CREAT if append else os.O_RDONLY
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "ab" if append else "rb")
    except BaseException:
        os.close(fd)
        raise


def open_folder_beneath(root: Path, relative: str) -> int:
    """A descriptor of the folder ``relative`` (a POSIX path; ``""`` or ``"."``: ``root``)
    under ``root``, reached through no link: each folder is opened with ``O_NOFOLLOW``
    relative to the one above it, so a link swapped in at any moment by code the gateway
    does not trust (a training container writes its ``/opt/ml`` tree as root) leads
    nowhere (beneath.py's walk). ``root`` itself must be the gateway's (it is followed if
    it is a link). Close the descriptor.

    Raises:
        FileNotFoundError: nothing there.
        LinkRefused: (an OSError, ``ELOOP``) a link or a part that is no folder.
        ValueError: ``relative`` climbs out of ``root`` or is absolute.
    """
    if relative.startswith("/"):
        raise ValueError(f"not a path below its folder: {relative!r}")
    return open_folder(root, [] if relative in ("", ".") else relative.split("/"))


def open_beneath(root: Path, relative: str) -> BinaryIO:
    """Open the file ``relative`` (a POSIX path) under ``root`` for reading, through no
    link (:func:`open_folder_beneath` for its folders; the file itself as
    :func:`open_untrusted` opens it).

    Raises:
        FileNotFoundError: nothing there.
        OSError: a link (``ELOOP``), a part that is no folder, or no regular file.
        ValueError: ``relative`` climbs out of ``root``, is absolute or names no file.
    """
    folder, _, name = relative.rpartition("/")
    if name in ("", ".", ".."):
        raise ValueError(f"not a file below its folder: {relative!r}")
    fd = open_folder_beneath(root, folder)
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        file = os.open(name, flags, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(file).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", relative)
        return os.fdopen(file, "rb")
    except BaseException:
        os.close(file)
        raise


def untrusted_size(path: Path) -> int:
    """The size of ``path`` as :func:`open_untrusted` would read it: 0 when it is missing,
    a link or no regular file (so a link's target is not even measured)."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0
