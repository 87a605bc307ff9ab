"""The Backend protocol: start, stop and locate instance processes; nothing more.

Everything else (health checks, restarts, routing) lives above it, so a Ray or Docker
backend only has to answer these few questions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from shipyard.images import (
    BUILTIN_IMAGES,
    FRAMEWORK_IMAGES_ENV,
    FRAMEWORK_REPOSITORIES,
    is_framework_image,
    runtime_for,
)

if TYPE_CHECKING:
    from shipyard.job_contract import StatusLine
    from shipyard.records import VariantSpec

__all__ = [
    "BUILTIN_IMAGES",
    "FRAMEWORK_IMAGES_ENV",
    "FRAMEWORK_REPOSITORIES",
    "is_framework_image",
    "runtime_for",
]


def token_pipe(token: str) -> int:
    """The read end of a pipe holding ``token`` and then its end, for a child to inherit
    (the caller closes it once the child is started). A token is far shorter than a
    pipe's buffer, so the write never blocks."""
    read, write = os.pipe()
    try:
        os.write(write, token.encode())
    finally:
        os.close(write)
    return read


def log_tail(path: Path | None, lines: int = 3) -> str:
    """The last ``lines`` of an instance's log, to end a reason it stopped with; ``""``
    when there is none."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 2048))
            tail = f.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("; last log lines: " + " | ".join(tail)) if tail else ""


@dataclass(frozen=True, slots=True)
class Resources:
    """What an instance reserves on a node of a cluster: the vCPUs and memory of its
    variant's InstanceType (instance_types.py). A backend with one host ignores it."""

    vcpus: float
    memory_bytes: int

    def split(self, parts: int) -> Resources:
        """An equal share, for each of ``parts`` processes of one instance."""
        return Resources(self.vcpus / parts, self.memory_bytes // parts)


def variant_resources(variant: VariantSpec) -> Resources | None:
    """What each instance of ``variant`` reserves: its InstanceType's vCPUs and memory; a
    serverless variant's, one vCPU and its MemorySizeInMB. None: a type not in the
    table, which reserves nothing."""
    from shipyard.instance_types import INSTANCE_TYPES

    if variant.serverless is not None:
        return Resources(1, variant.serverless.memory_mb << 20)
    known = INSTANCE_TYPES.get(variant.instance_type)
    return Resources(known.vcpus, known.memory_bytes) if known else None


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What one instance runs: a model's image and artifact, and where its log goes.

    The artifact travels as its URI: the instance fetches it on its own host
    (shipyard/launch.py), so a backend need not share the gateway's disk.
    """

    instance_id: str
    image: str
    model_url: str | None = None
    """The model artifact (``s3://``, ``file://``, a path) the instance fetches before it
    serves; None: no artifact (an empty model folder), or a multi-model instance."""
    workdir: Path | None = None
    """A folder of the instance's own, kept across its restarts, as its model directory
    (a multi-model instance keeps its disk cache there); set only by a gateway whose
    backend shares its disk. None: the model's folder, or an empty one."""
    environment: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    s3_access: bool = False
    """Whether the instance reads ``s3://`` itself, and so gets S3 credentials."""
    warm: bool = False
    """Whether the instance may start from a warm spare (runtime/spare.py): set for
    serverless instances, whose start a client waits for. (Not for batch transform
    instances: a spare importing beside a CPU-bound job slowed it more than the spare
    saved, in bench/transform_throughput.py.)"""
    cpu_nice: int = 0
    """How much lower than the gateway's the instance's CPU priority is (nice(2)). A
    shadow variant's instances run lower, so on a host they share with production
    instances they take only the CPU those leave. Backends that cannot lower it ignore it."""
    resources: Resources | None = None
    """What the instance reserves where it is placed (``variant_resources``)."""
    hostname: str | None = None
    """A container's ContainerHostname: a container image's instance gets it as its
    host name; processes ignore it."""
    endpoint: str | None = None
    """The endpoint whose fleet the instance is in: a backend whose instances outlive
    their gateway files them under it, for the next gateway to adopt or stop."""
    adapters_token: str | None = None
    """For a copy of an inference component alone: the token its ``/adapters`` route
    requires (contract.ADAPTERS_TOKEN). The built-in runtime reads it from a pipe
    (``--adapters-token-fd``, ``token_pipe``), never from its environment, which its
    model's code and a caller's Environment share; without it there is no route."""


class InstanceHandle(Protocol):
    """A started instance, as its backend knows it."""

    @property
    def instance_id(self) -> str: ...

    @property
    def url(self) -> str:
        """``http://host:port`` where the instance serves the container contract."""
        ...

    @property
    def socket_path(self) -> str | None:
        """A Unix socket on the gateway's host where the instance also serves, for the
        gateway that started it (cheaper than the TCP port; backends/instance_sockets.py); None:
        ``url`` only."""
        ...


class Backend(Protocol):
    """Starts, stops and locates instances.

    ``start`` returns as soon as the process exists; readiness is the caller's business
    (it pings ``/ping``). ``exit_reason`` answers None while the instance runs and a
    human-readable reason once it has stopped, which the reconciler shows to users.
    """

    async def start(self, spec: InstanceSpec) -> InstanceHandle: ...

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None: ...

    def exit_reason(self, handle: InstanceHandle) -> str | None: ...

    def memory_bytes(self, handle: InstanceHandle) -> int | None:
        """Resident memory of the instance and what it spawned; None when unknown (the
        instance is gone). Serverless variants enforce MemorySizeInMB with it. Blocks
        briefly: call it off the event loop."""
        ...

    def cpu_seconds(self, handle: InstanceHandle) -> float | None:
        """CPU time (user and system) the instance and what it spawned have used so
        far; None when unknown. CloudWatch's CPUUtilization is read from it. Blocks
        briefly: call it off the event loop."""
        ...


@dataclass(frozen=True, slots=True)
class JobHandle:
    """A started job runner, as its backend knows it.

    ``ref`` is all the store keeps: a runner outlives the gateway that started it, and
    the next gateway finds it again from ``ref`` alone (``JobBackend.attach_job``).
    """

    ref: str


JOB_RUNNER = "shipyard.jobs.runner"
"""The training job runner (``python -m``)."""
PROCESSING_RUNNER = "shipyard.processing.runner"
"""The processing job runner (``python -m``)."""


class JobBackend(Protocol):
    """Starts, watches and signals job runners (``python -m shipyard.jobs.runner``).

    The supervisor never reads a PID or a runner's files itself: it holds handles, and
    asks the backend whether a runner lives and what it has reported (the status lines
    of job_contract.py), so the runner may be a process on another machine.
    """

    async def start_job(
        self,
        workdir: Path,
        *,
        s3_endpoint_url: str | None,
        s3_access: bool = True,
        runner: str = JOB_RUNNER,
    ) -> JobHandle:
        """Start the runner of the job prepared in ``workdir`` (its ``job.json``).

        ``s3_access``: whether the job names ``s3://`` locations, and so gets S3
        credentials. ``runner``: the module run, JOB_RUNNER or PROCESSING_RUNNER, which
        sandboxes its own script (it shows it ``/opt/ml`` at that very path), so its
        runner is started outside the sandbox, with ``auth.file_roots`` to enforce."""
        ...

    def attach_job(self, ref: str) -> JobHandle:
        """The handle whose ``ref`` the store kept."""
        ...

    def find_job(self, workdir: Path) -> JobHandle | None:
        """A runner already started for ``workdir``, running or ended, if any (a start
        whose handle was never recorded: the gateway stopped in between)."""
        ...

    def job_running(self, handle: JobHandle) -> bool:
        """Whether the runner still runs (not ended, its PID not reused)."""
        ...

    def job_status(self, handle: JobHandle, *, skip: int) -> list[StatusLine]:
        """The status lines the runner has completed, after the first ``skip``.

        Raises:
            ValueError: what the runner wrote is not status lines.
        """
        ...

    def signal_job(self, handle: JobHandle, sig: int) -> None:
        """Send ``sig`` to the runner, if it still runs."""
        ...

    def kill_job(self, handle: JobHandle) -> None:
        """SIGKILL the runner and the script it started, wherever they are."""
        ...
