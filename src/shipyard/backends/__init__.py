"""Backends by name: ``shipyard serve --backend <name>`` picks one from this registry.

Each backend declares what it can run (:class:`Capabilities`), so the gateway refuses
what a backend cannot do with a clear FailureReason instead of a late crash. ``local``
(processes on the gateway's host) is the embedded default; ``ray`` places them on a Ray
cluster's nodes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shipyard.backends.base import Backend, JobBackend
from shipyard.backends.environment import s3_variables
from shipyard.errors import BackendError
from shipyard.settings import Settings
from shipyard.stackfile import StackFile
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.filesystems import Filesystems

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can run."""

    runtimes: frozenset[str]
    """Instance runtimes it starts: ``python`` (the built-in one), ``cmd``, ``docker``."""
    shared_disk: bool
    """Whether its instances see the gateway's disk: a ``cmd:`` multi-model server, into
    whose folder the gateway itself loads artifacts, needs it."""


@dataclass(frozen=True, slots=True)
class BackendContext:
    """What every backend is built from."""

    home: Path
    """The gateway's state folder."""
    run_dir: Path
    """Where the gateway records what it starts (``Settings.run_dir``: the home's
    ``run``, or a worker's own)."""
    environ: Mapping[str, str]
    """The gateway's environment, read once: processes get only what they need of it."""
    s3: Mapping[str, str]
    """The S3 access handed to processes that read s3:// (backends/environment.py)."""
    warm_spares: int = 0
    """Spare built-in runtime processes to keep for instances that ask for one."""
    ray_address: str | None = None
    """The Ray cluster the ``ray`` backend joins (``host:port`` of its head)."""
    start_timeout_s: float = 600.0
    """How long an instance may wait to be placed and to start (the gateway's
    ``instance_start_timeout_s``)."""
    sandbox_file_roots: tuple[Path, ...] | None = None
    """None: processes run unsandboxed. Else (``auth.sandbox``) the local backend runs
    each in a bubblewrap sandbox (backends/sandbox.py) that grants these folders
    (``auth.file_roots``); it refuses to be built where it cannot. The Ray backend
    ignores it: its processes run as Ray starts them on the cluster's nodes."""

    hidden: tuple[Path, ...] = ()
    """Folders of the gateway's besides its home that a sandbox masks even where a file
    root holds them (the workers' metrics sockets: gateway/ops/worker_metrics.py)."""

    filesystems: Filesystems | None = None
    """The gateway's file systems (``auth.file_roots`` enforced): what a backend fetches
    on a caller's behalf in the gateway's own process (a container's model, a sandboxed
    instance's) is opened through them. None: no roots (no ``auth:``)."""

    @classmethod
    def of(
        cls, settings: Settings, stack: StackFile, *, filesystems: Filesystems | None = None
    ) -> BackendContext:
        """The context a gateway with these settings and stack file builds its backend in."""
        return cls(
            filesystems=filesystems,
            home=settings.home,
            run_dir=settings.run_dir,
            hidden=() if settings.worker_peers is None else (settings.worker_peers,),
            environ=os.environ,
            s3=s3_variables(
                os.environ,
                s3_endpoint_url=settings.s3_endpoint_url,
                callers_keys=frozenset(k.access_key_id for k in stack.auth.keys)
                if stack.auth is not None
                else (),
            ),
            warm_spares=settings.warm_spares,
            ray_address=settings.ray_address,
            start_timeout_s=settings.instance_start_timeout_s,
            sandbox_file_roots=tuple(stack.auth.file_roots)
            if stack.auth is not None and stack.auth.sandbox
            else None,
        )


class FullBackend(Backend, JobBackend, Protocol):
    """A backend of instances and of job runners, as the gateway uses it."""

    def stop_leftovers(self) -> Any:
        """Stop what an earlier gateway on this home left running (called at start)."""
        ...

    def close(self) -> None:
        """Release what the backend holds beyond instances and jobs (called at stop)."""
        ...


@dataclass(frozen=True, slots=True)
class Registration:
    name: str
    capabilities: Capabilities
    factory: Callable[[BackendContext], FullBackend]


_REGISTRY: dict[str, Registration] = {}


def register(
    name: str, capabilities: Capabilities, factory: Callable[[BackendContext], FullBackend]
) -> None:
    """Make ``--backend <name>`` build backends with ``factory``."""
    _REGISTRY[name] = Registration(name, capabilities, factory)


def names() -> list[str]:
    return sorted(_REGISTRY)


def create_backend(name: str, context: BackendContext) -> tuple[FullBackend, Capabilities]:
    """The backend called ``name`` and what it can run.

    Raises:
        ValueError: no backend of that name (the message names the known ones), or a
            sandbox asked for where none can be made (``SandboxUnavailable``).
    """
    registration = _REGISTRY.get(name)
    if registration is None:
        raise ValueError(f"backend: unknown backend {name!r} (known: {', '.join(names())})")
    return registration.factory(context), registration.capabilities


def _local(context: BackendContext, *, engine_required: bool = False) -> FullBackend:
    from shipyard.backends.containers import ContainerBackend
    from shipyard.backends.local import LocalBackend
    from shipyard.backends.sandbox import Sandbox

    sandbox = None
    if context.sandbox_file_roots is not None:
        # Tried here, at start: a gateway that cannot sandbox refuses to start.
        sandbox = Sandbox.create(
            file_roots=context.sandbox_file_roots,
            hidden=[context.home, *context.hidden],
            environ=context.environ,
        )
    # Container images go to the engine at DOCKER_HOST, connected to when one is first
    # run: a gateway that runs none needs no engine.
    artifacts = ArtifactStore(
        filesystems=context.filesystems
        or Filesystems(s3_endpoint_url=context.s3.get("SHIPYARD_S3_ENDPOINT_URL") or None)
    )
    containers = ContainerBackend(
        # Whose containers they are (their label): the home, or a worker's own folder.
        home=context.home if context.run_dir == context.home / "run" else context.run_dir,
        run_dir=context.run_dir,
        models_dir=context.home / "models",
        environ=context.environ,
        artifacts=artifacts,
    )
    if engine_required:
        try:
            containers.check()
        except BackendError as exc:
            raise ValueError(f"backend: {exc}") from None
    return LocalBackend(
        run_dir=context.run_dir,
        models_dir=context.home / "models",
        environ=context.environ,
        s3=context.s3,
        warm_spares=context.warm_spares,
        sandbox=sandbox,
        containers=containers,
        artifacts=artifacts,
    )


_PROCESSES_AND_CONTAINERS = Capabilities(
    runtimes=frozenset({"python", "cmd", "docker"}), shared_disk=True
)
register("local", _PROCESSES_AND_CONTAINERS, _local)
# The same, but a gateway that cannot reach its container engine refuses to start.
register("docker", _PROCESSES_AND_CONTAINERS, lambda c: _local(c, engine_required=True))


def _ray(context: BackendContext) -> FullBackend:
    if not context.ray_address:
        raise ValueError("ray_address: the ray backend needs the address of a Ray cluster")
    if context.sandbox_file_roots is not None:
        log.warning(
            "auth.sandbox: the ray backend does not sandbox its processes; they run as Ray "
            "starts them on the cluster's nodes"
        )
    try:
        from shipyard.backends.ray import RayBackend
    except ImportError as exc:
        raise ValueError(
            f"backend: the ray backend needs Ray (pip install 'shipyard[ray]'): {exc}"
        ) from exc
    return RayBackend(
        address=context.ray_address,
        s3=context.s3,
        start_timeout_s=context.start_timeout_s,
    )


# Nodes do not share the gateway's disk: a multi-model cmd: server cannot be loaded there.
register("ray", Capabilities(runtimes=frozenset({"python", "cmd"}), shared_disk=False), _ray)
