"""Local processes: the embedded default backend's instances.

Each instance is a child process in its own session, so stopping it by its PID also
stops whatever it spawned (a user's ``cmd:`` server may fork workers;
backends/process_groups.py). Job runners are ``LocalJobs`` (backends/local_jobs.py),
and the spare runtimes an instance may start from are ``WarmSpares``
(backends/spares.py); ``LocalBackend`` composes the three.

With a :class:`~shipyard.backends.sandbox.Sandbox` (``auth.sandbox``), every instance is
started through ``bwrap``, which is then the process the backend holds: its PID leads
the group, its exit code is the process's, and a SIGKILL to its group ends the whole
sandbox. A sandboxed process writes its own folders, so the backend reads nothing there
through a link or from a FIFO (job_contract.py ``open_untrusted``).

A built-in runtime instance also serves on a Unix socket the backend binds for it
(backends/instance_sockets.py); its TCP port stays what the container contract and
``/ping`` use.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shipyard.backends.base import (
    JOB_RUNNER,
    InstanceHandle,
    InstanceSpec,
    JobHandle,
    log_tail,
    runtime_for,
    token_pipe,
)
from shipyard.backends.containers import ContainerBackend, ContainerInstance
from shipyard.backends.environment import process_environment
from shipyard.backends.instance_commands import InstanceCommands, command
from shipyard.backends.instance_sockets import InstanceSockets, UnixListener
from shipyard.backends.local_jobs import LocalJobs
from shipyard.backends.process_groups import (
    group_lives,
    groups_carrying,
    signal_group,
    signal_inside,
    start_instance,
    tree_sum,
)
from shipyard.backends.sandbox import Sandbox
from shipyard.backends.spares import WarmSpares
from shipyard.contract import ADAPTERS_TOKEN_FD_ENV
from shipyard.errors import BackendError
from shipyard.job_contract import StatusLine, open_untrusted
from shipyard.storage.artifacts import ArtifactStore

log = logging.getLogger(__name__)

_MAX_REASON_BYTES = 1024
"""The most of an instance's error file read for its failure's reason (SageMaker's
FailureReason holds 1,024 characters)."""


@dataclass(slots=True)
class LocalInstance:
    """An instance the local backend started: its process, and what it leaves."""

    instance_id: str
    url: str
    process: subprocess.Popen[bytes]
    error_file: Path
    log_path: Path | None
    sandboxed: bool = False
    """Whether ``process`` is the ``bwrap`` of a sandbox (backends/sandbox.py)."""
    socket_path: str | None = None
    """The Unix socket the instance also serves on (see the module); None: none."""

    def __repr__(self) -> str:
        return f"LocalInstance(id={self.instance_id!r}, pid={self.process.pid}, url={self.url!r})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalBackend:
    """Runs each instance as a local process bound to a free port on 127.0.0.1."""

    def __init__(
        self,
        *,
        run_dir: Path,
        models_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
        s3: Mapping[str, str] | None = None,
        warm_spares: int = 0,
        sandbox: Sandbox | None = None,
        containers: ContainerBackend | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self.run_dir = run_dir
        self._environ = dict(environ or {})
        """The gateway's environment, read once; processes get only what environment.py
        picks from it."""
        self._s3 = dict(s3 or {})
        """The S3 access handed to processes that use s3:// (``s3_variables``)."""
        self.sandbox = sandbox
        """Runs every instance and job runner in a sandbox (``auth.sandbox``); None: not."""
        self.containers = containers
        """Runs the instances whose Image is a container image (backends/containers.py)."""
        self.commands = InstanceCommands(
            models_dir=models_dir or run_dir.parent / "models",
            s3_endpoint_url=self._s3.get("SHIPYARD_S3_ENDPOINT_URL") or None,
            artifacts=artifacts,
        )
        """What each instance runs, and where its model is (backends/instance_commands.py)."""
        self.spares = WarmSpares(run_dir=run_dir, environ=self._environ, count=warm_spares)
        """Started ``--spare`` runtimes, waiting to become an instance (backends/spares.py)."""
        self.jobs = LocalJobs(
            environ=self._environ, s3=self._s3, sandbox=sandbox, containers=containers
        )
        """The job runners (backends/local_jobs.py)."""
        self.sockets = InstanceSockets()
        """The built-in runtime instances' Unix sockets (backends/instance_sockets.py)."""

    def __repr__(self) -> str:
        return f"LocalBackend(run_dir={str(self.run_dir)!r}, sandbox={self.sandbox!r})"

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        kind = runtime_for(spec.image)
        if kind == "docker":
            if self.containers is None:
                raise BackendError(
                    f"Image {spec.image} is a container image, which needs a Docker engine; "
                    "this gateway runs none. Use shipyard/python or cmd:<command>."
                )
            return await self.containers.start(spec)
        port = _free_port()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        error_file = self.run_dir / f"{spec.instance_id}.error"
        error_file.unlink(missing_ok=True)
        home = self.run_dir / "home" / spec.instance_id
        home.mkdir(parents=True, exist_ok=True)
        s3 = self._s3 if spec.s3_access else None
        env = process_environment(self._environ, home=home, s3=s3)
        env.update(spec.environment)
        env["SHIPYARD_INSTANCE_ID"] = spec.instance_id
        env["SAGEMAKER_BIND_TO_PORT"] = str(port)
        cwd = spec.workdir or home
        unix = self.sockets.bind(port) if kind == "python" else None
        token = token_pipe(spec.adapters_token) if spec.adapters_token else None
        if token is not None and kind == "cmd":
            env[ADAPTERS_TOKEN_FD_ENV] = str(token)
        try:
            if self.sandbox is not None:
                unix_fd = None if unix is None else unix.sock.fileno()
                argv = await self.commands.sandboxed(
                    self.sandbox, spec, kind, port, env, error_file, home, unix_fd, token
                )
                process = self._popen(argv, env, cwd, spec, unix, token)
            else:
                process = self._start_process(spec, kind, port, env, error_file, cwd, unix, token)
        except BaseException:
            if unix is not None:
                unix.path.unlink(missing_ok=True)
            raise
        finally:
            if unix is not None:
                unix.sock.close()  # the instance holds its own
            if token is not None:
                os.close(token)
        (self.run_dir / f"{spec.instance_id}.pid").write_text(str(process.pid))
        log.info("started instance %s pid %s on port %s", spec.instance_id, process.pid, port)
        return LocalInstance(
            instance_id=spec.instance_id,
            url=f"http://127.0.0.1:{port}",
            process=process,
            error_file=error_file,
            log_path=spec.log_path,
            sandboxed=self.sandbox is not None,
            socket_path=None if unix is None else str(unix.path),
        )

    def _start_process(
        self,
        spec: InstanceSpec,
        kind: str,
        port: int,
        env: dict[str, str],
        error_file: Path,
        cwd: Path,
        unix: UnixListener | None,
        token: int | None,
    ) -> subprocess.Popen[bytes]:
        """Start the instance unsandboxed, from a warm spare when it may (never a
        component's copy: a spare takes no adapters token)."""
        where = self.commands.where(spec, kind, env)
        unix_fd = None if unix is None else unix.sock.fileno()
        argv = command(spec, kind, port, where, error_file, unix_fd, token)
        warm = kind == "python" and token is None and spec.warm and self.spares.can_take(env)
        if not warm:
            return self._popen(argv, env, cwd, spec, unix, token)
        # The spare is told the socket by the descriptor it receives, not by our number.
        fresh = command(spec, kind, port, where, error_file)
        fds = [] if unix_fd is None else [unix_fd]
        process = self.spares.take(fresh[3:], env, cwd, spec, fds)
        return process or self._popen(argv, env, cwd, spec, unix)

    def _popen(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        spec: InstanceSpec,
        unix: UnixListener | None = None,
        token: int | None = None,
    ) -> subprocess.Popen[bytes]:
        out = open(spec.log_path, "ab") if spec.log_path else subprocess.DEVNULL
        fds = [] if unix is None else [unix.sock.fileno()]
        fds += [] if token is None else [token]
        try:
            return subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(start_instance, os.getpid(), spec.cpu_nice),
            )
        except OSError as exc:
            raise BackendError(f"Could not start instance {spec.instance_id}: {exc}") from exc
        finally:
            if spec.log_path:
                out.close()  # type: ignore[union-attr]

    def close(self) -> None:
        """Stop the spares (instances are stopped by their fleets)."""
        if self.containers is not None:
            self.containers.close()
        self.spares.close()
        self.sockets.close()

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        if isinstance(handle, ContainerInstance):
            assert self.containers is not None
            return await self.containers.stop(handle, timeout_s=timeout_s)
        assert isinstance(handle, LocalInstance)
        process = handle.process
        if process.poll() is None:
            if handle.sandboxed:
                signal_inside(process.pid, signal.SIGTERM, group=True)
            else:
                signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(process.wait), timeout_s)
            # The leader may end while its group lives on (a cmd: image's server that
            # ignores SIGTERM, under shipyard.launch's exit): it has the same time.
            while time.monotonic() < deadline and group_lives(process.pid):
                await asyncio.sleep(0.05)
            signal_group(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        else:
            # The leader is gone; its session may still hold children.
            signal_group(process.pid, signal.SIGKILL)
        handle.error_file.unlink(missing_ok=True)
        (self.run_dir / f"{handle.instance_id}.pid").unlink(missing_ok=True)
        if handle.socket_path is not None:
            Path(handle.socket_path).unlink(missing_ok=True)
        # Its $HOME was the model's to fill: it goes with the instance, or deleted
        # endpoints would leave their instances' files on the disk that holds the store
        # (and a later instance of the same id, after a restart, would find them).
        await asyncio.to_thread(shutil.rmtree, self.run_dir / "home" / handle.instance_id, True)

    def stop_leftovers(self) -> list[int]:
        """Kill the instances an earlier gateway on this home left running; their PIDs.

        A gateway that is SIGKILLed cannot stop its instances; the kernel stops the
        built-in ones with it (``die_with_parent``), but not what a ``cmd:`` server
        spawned. Each instance's PID is recorded in ``<run_dir>/<id>.pid``; a process of
        that group (the instance leads its own session) with that instance id in its
        environment is ours, not a reused PID, and its whole group goes.
        """
        if self.containers is not None:
            self.containers.stop_leftovers()
        recorded: dict[int, str] = {}
        for pid_file in sorted(self.run_dir.glob("*.pid")):
            with contextlib.suppress(OSError, ValueError):
                recorded[int(pid_file.read_text().strip())] = pid_file.stem
            pid_file.unlink(missing_ok=True)
        stopped = []
        for pgid in groups_carrying(recorded):
            signal_group(pgid, signal.SIGKILL)
            stopped.append(pgid)
            log.warning(
                "stopped instance %s (pid %s), left by an earlier gateway", recorded[pgid], pgid
            )
        return stopped

    def exit_reason(self, handle: InstanceHandle) -> str | None:
        if isinstance(handle, ContainerInstance):
            assert self.containers is not None
            return self.containers.exit_reason(handle)
        assert isinstance(handle, LocalInstance)
        code = handle.process.poll()
        if code is None:
            return None
        with contextlib.suppress(OSError), open_untrusted(handle.error_file) as error:
            # The model's process writes it: a bounded head, never all of it (a model
            # that wrote gigabytes there filled the gateway's memory, log and store).
            text = error.read(_MAX_REASON_BYTES).decode(errors="replace").strip()
            if text:
                return text
        return f"the process exited with code {code}{log_tail(handle.log_path)}"

    def memory_bytes(self, handle: InstanceHandle) -> int | None:
        if isinstance(handle, ContainerInstance):
            assert self.containers is not None
            return self.containers.memory_bytes(handle)
        assert isinstance(handle, LocalInstance)
        used = tree_sum(handle.process.pid, lambda p: float(p.memory_info().rss))
        return None if used is None else int(used)

    def cpu_seconds(self, handle: InstanceHandle) -> float | None:
        if isinstance(handle, ContainerInstance):
            assert self.containers is not None
            return self.containers.cpu_seconds(handle)
        assert isinstance(handle, LocalInstance)
        return tree_sum(handle.process.pid, lambda p: p.cpu_times().user + p.cpu_times().system)

    # -- job runners: LocalJobs (backends/local_jobs.py) ----------------------------------

    async def start_job(
        self,
        workdir: Path,
        *,
        s3_endpoint_url: str | None,
        s3_access: bool = True,
        runner: str = JOB_RUNNER,
    ) -> JobHandle:
        return await self.jobs.start_job(
            workdir, s3_endpoint_url=s3_endpoint_url, s3_access=s3_access, runner=runner
        )

    def attach_job(self, ref: str) -> JobHandle:
        return self.jobs.attach_job(ref)

    def find_job(self, workdir: Path) -> JobHandle | None:
        return self.jobs.find_job(workdir)

    def job_running(self, handle: JobHandle) -> bool:
        return self.jobs.job_running(handle)

    def job_status(self, handle: JobHandle, *, skip: int) -> list[StatusLine]:
        return self.jobs.job_status(handle, skip=skip)

    def signal_job(self, handle: JobHandle, sig: int) -> None:
        self.jobs.signal_job(handle, sig)

    def kill_job(self, handle: JobHandle) -> None:
        self.jobs.kill_job(handle)
