"""The Backend protocol: start, stop and locate instance processes; nothing more.

Everything else (health checks, restarts, routing) lives above it, so a Ray or Docker
backend only has to answer these few questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

BUILTIN_IMAGES = ("shipyard/python",)
# SageMaker framework images served by the built-in runtime (matched inside the URI).
FRAMEWORK_IMAGE_MARKERS = (
    "sagemaker-scikit-learn",
    "sklearn",
    "pytorch-inference",
    "xgboost",
    "huggingface",
    "tensorflow-inference",
    "mxnet-inference",
)


def runtime_for(image: str) -> str:
    """Which runtime serves ``image``: ``python``, ``cmd`` or ``docker``."""
    if image.startswith("cmd:"):
        return "cmd"
    if image in BUILTIN_IMAGES or any(m in image for m in FRAMEWORK_IMAGE_MARKERS):
        return "python"
    return "docker"


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What one instance runs: a model's image and files, and where its log goes."""

    instance_id: str
    image: str
    model_dir: Path
    environment: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    s3_access: bool = False
    """Whether the instance reads ``s3://`` itself, and so gets S3 credentials."""


class InstanceHandle(Protocol):
    """A started instance, as its backend knows it."""

    @property
    def instance_id(self) -> str: ...

    @property
    def url(self) -> str:
        """``http://host:port`` where the instance serves the container contract."""
        ...


class BackendError(Exception):
    """An instance could not be started; the message becomes the FailureReason."""


class Backend(Protocol):
    """Starts, stops and locates instances.

    ``start`` returns as soon as the process exists; readiness is the caller's business
    (it pings ``/ping``). ``exit_reason`` answers None while the instance runs and a
    human-readable reason once it has stopped, which the reconciler shows to users.
    """

    async def start(self, spec: InstanceSpec) -> InstanceHandle: ...

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None: ...

    def exit_reason(self, handle: InstanceHandle) -> str | None: ...


class JobBackend(Protocol):
    """Starts, signals and locates job runner processes (``python -m shipyard.jobs.runner``).

    A runner must outlive the gateway that started it, so it is located again by its PID
    and its working folder, never by a handle held in memory.
    """

    async def start_job(
        self, workdir: Path, *, s3_endpoint_url: str | None, s3_access: bool = True
    ) -> int:
        """Start the runner of the job in ``workdir``; return its PID.

        ``s3_access``: whether the job names ``s3://`` locations, and so gets S3
        credentials."""
        ...

    def job_running(self, pid: int, workdir: Path) -> bool:
        """Whether ``pid`` is still the runner of ``workdir`` (not ended, not reused)."""
        ...

    def signal_job(self, pid: int, workdir: Path, sig: int) -> None:
        """Send ``sig`` to the runner, if it still runs."""
        ...

    def kill_job(self, pid: int, workdir: Path) -> None:
        """SIGKILL the runner and the script it started, wherever they are."""
        ...
