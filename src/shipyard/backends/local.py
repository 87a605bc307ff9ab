"""Local processes: the embedded default backend.

Each instance is a child process in its own session, so stopping it by its PID also
stops whatever it spawned (a user's ``cmd:`` server may fork workers).

With a :class:`~shipyard.backends.sandbox.Sandbox` (``auth.sandbox``), every instance and
job runner is started through ``bwrap``, which is then the process the backend holds: its
PID leads the group, its exit code is the process's, and a SIGKILL to its group ends the
whole sandbox. Polite signals (SIGTERM) go to the processes inside instead
(``_signal_inside``), since ``bwrap`` itself dies of them at once.

A sandboxed process writes its own folders, so the backend reads nothing there through
a link or from a FIFO (job_contract.py ``open_untrusted``), and keeps what it must trust
outside them: a sandboxed runner's bwrap is recorded beside its working folder
(``<attempt>.sandbox``, its PID and start time), never found by a name or a command
line, which any process can take.

A built-in runtime instance also serves on a Unix socket, and the gateway that started
it sends its requests there (http/client.py): on one host that costs both processes
less than TCP on loopback. The backend binds the socket itself, in a folder only the
gateway's user reads and no sandbox is shown (``<temp>/shipyard-*/<n>.sock``), and
hands the instance the bound socket (``--unix-socket-fd``): the instance never names,
creates or replaces a file there, so it cannot point the gateway's connections anywhere
else. Its TCP port stays what the container contract and ``/ping`` use, and what every
other gateway reads from the store. A warm spare waits on one end of a socket pair, so
the bound socket travels to it with its work (``SCM_RIGHTS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from shipyard import autogroup, launch
from shipyard.backends.base import (
    FRAMEWORK_IMAGES_ENV,
    JOB_RUNNER,
    InstanceHandle,
    InstanceSpec,
    JobHandle,
    log_tail,
    runtime_for,
    token_pipe,
)
from shipyard.backends.containers import (
    ContainerBackend,
    ContainerInstance,
    remove_job_container,
)
from shipyard.backends.environment import process_environment
from shipyard.backends.sandbox import MODEL_DIR, Sandbox
from shipyard.contract import ADAPTERS_TOKEN_FD_ENV
from shipyard.errors import BackendError
from shipyard.job_contract import (
    JOB_FILE,
    RUNNER_PID_FILE,
    SCRIPT_PID_FILE,
    STATUS_FILE,
    JobSpec,
    StatusLine,
    open_untrusted,
    read_status,
)
from shipyard.routing.model_agent import MODELS_FOLDER
from shipyard.runtime import spare
from shipyard.storage.artifacts import ArtifactStore, join_uri
from shipyard.storage.filesystems import local_location

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_LOCAL = "local"
_SANDBOXED = "local-sandboxed"
"""The kinds of job handle: a runner's PID, or the PID of the bwrap running it."""
_REFILL_AFTER_S = 0.5
"""How long after a warm start the spares are refilled."""
_MAX_REASON_BYTES = 1024
"""The most of an instance's error file read for its failure's reason (SageMaker's
FailureReason holds 1,024 characters)."""


@dataclass(slots=True)
class LocalInstance:
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


def _command(
    spec: InstanceSpec,
    kind: str,
    port: int,
    where: list[str],
    error_file: Path,
    unix: _UnixListener | None = None,
    token_fd: int | None = None,
) -> list[str]:
    """The command of an instance: the built-in runtime, or ``shipyard.launch`` running
    a ``cmd:`` image's command; ``where`` says where its model is, ``token_fd`` where
    a component's copy reads its adapters token (InstanceSpec.adapters_token)."""
    if kind == "python":
        argv = [sys.executable, "-m", "shipyard.runtime", "--port", str(port)]
        if unix is not None:
            argv += ["--unix-socket-fd", str(unix.sock.fileno())]
        if token_fd is not None:
            argv += ["--adapters-token-fd", str(token_fd)]
        return [*argv, *where, "--error-file", str(error_file)]
    argv = [sys.executable, "-m", "shipyard.launch", *where, "--error-file", str(error_file)]
    return [*argv, "--", "/bin/sh", "-c", spec.image.removeprefix("cmd:")]


@dataclass(slots=True)
class _Spare:
    """A warm spare: its process, and our end of the socket pair it waits on."""

    process: subprocess.Popen[bytes]
    channel: socket.socket


@dataclass(slots=True)
class _UnixListener:
    """An instance's Unix socket, bound by the backend: its path, and the socket until
    the instance's process holds it."""

    path: Path
    sock: socket.socket


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
        self.models_dir = models_dir or run_dir.parent / "models"
        """This host's artifact cache: instances fetch their model into it."""
        self._environ = dict(environ or {})
        """The gateway's environment, read once; processes get only what environment.py
        picks from it."""
        self._s3 = dict(s3 or {})
        """The S3 access handed to processes that use s3:// (``s3_variables``)."""
        self._runners: dict[int, subprocess.Popen[bytes]] = {}
        self.warm_spares = warm_spares
        self._spares: list[_Spare] = []
        """Started ``--spare`` runtimes, waiting for work (runtime/spare.py)."""
        self.sandbox = sandbox
        """Runs every instance and job runner in a sandbox (``auth.sandbox``); None: not."""
        self.containers = containers
        self.artifacts = artifacts
        """Fetches a sandboxed instance's model in the gateway's process, with
        ``auth.file_roots`` enforced; None: one with the gateway's S3 endpoint only."""
        """Runs the instances whose Image is a container image (backends/containers.py)."""
        self._sockets: Path | None = None
        """The folder of the instances' Unix sockets, made on first use."""
        self._socket_names = itertools.count(1)
        """Each instance's socket a name of its own: a stopped instance's clean-up never
        removes a later one's that took its port."""

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
        unix = self._unix_listener(port) if kind == "python" else None
        token = token_pipe(spec.adapters_token) if spec.adapters_token else None
        if token is not None and kind == "cmd":
            env[ADAPTERS_TOKEN_FD_ENV] = str(token)
        try:
            if self.sandbox is not None:
                argv = await self._sandboxed(spec, kind, port, env, error_file, home, unix, token)
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

    def _unix_listener(self, port: int) -> _UnixListener | None:
        """A Unix socket for the instance on ``port``, bound (readable and writable by
        this user alone) in this backend's folder; None where the temporary folder's
        path is too long for a socket's address (108 bytes) or it cannot be made: the
        instance is then reached on its port alone."""
        sock = None
        try:
            if self._sockets is None:
                self._sockets = Path(tempfile.mkdtemp(prefix="shipyard-"))  # mode 0700
            path = self._sockets / f"{next(self._socket_names)}.sock"
            if len(os.fsencode(path)) >= 100:
                return None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            os.chmod(path, 0o600)
        except OSError as exc:
            if sock is not None:
                sock.close()
            log.warning("no Unix socket for the instance on port %s: %s", port, exc)
            return None
        return _UnixListener(path, sock)

    def _start_process(
        self,
        spec: InstanceSpec,
        kind: str,
        port: int,
        env: dict[str, str],
        error_file: Path,
        cwd: Path,
        unix: _UnixListener | None,
        token: int | None,
    ) -> subprocess.Popen[bytes]:
        """Start the instance unsandboxed, from a warm spare when it may (never a
        component's copy: a spare takes no adapters token)."""
        # The model folder: the instance's own, or the artifact fetched by the instance
        # itself into this host's cache (shipyard/launch.py), shared by its instances.
        if spec.workdir is not None:
            where = ["--model-dir", str(spec.workdir)]
            env["SM_MODEL_DIR"] = str(spec.workdir)
        elif kind == "python" and not spec.model_url:
            where = ["--model-dir", str(self._empty_model_dir())]
        else:
            where = ["--model-cache", str(self.models_dir)]
            if spec.model_url:
                where += ["--model-url", spec.model_url]
        argv = _command(spec, kind, port, where, error_file, unix, token)
        warm = (
            kind == "python"
            and token is None
            and spec.warm
            and self.warm_spares > 0
            and spare.can_become(self._spare_environment(), env)
        )
        if not warm:
            return self._popen(argv, env, cwd, spec, unix, token)
        env[spare.IMPORTS_FILE] = str(self._imports_file)
        # The spare is told the socket by the descriptor it receives, not by our number.
        fresh = _command(spec, kind, port, where, error_file)
        process = self._from_spare(fresh[3:], env, cwd, spec, unix)
        # Later: a spare importing now would take the CPU the new instance needs.
        asyncio.get_running_loop().call_later(_REFILL_AFTER_S, self._refill)
        return process or self._popen(argv, env, cwd, spec, unix)

    async def _sandboxed(
        self,
        spec: InstanceSpec,
        kind: str,
        port: int,
        env: dict[str, str],
        error_file: Path,
        home: Path,
        unix: _UnixListener | None,
        token: int | None,
    ) -> list[str]:
        """The ``bwrap`` command of a sandboxed instance.

        Its model folder is read-only, so the instance cannot fetch into it: the
        artifact is fetched here (into the same cache slot an unsandboxed instance uses)
        and shown at ``/opt/ml/model``; a framework model's code is fetched by the
        instance into its own ``/tmp``. A multi-model instance's folder (its disk cache)
        is its own and writable, but for the folder a ``cmd:`` server's models are
        fetched into by the gateway (routing/model_agent.py), read-only inside: the
        gateway writes and deletes there, so the instance must not be able to put a
        link in its place. Never from a warm spare: a spare is started before it
        knows its model, so it would have to see every model of the cache (and write
        the shared list of imports); serverless cold starts pay the imports instead.
        """
        assert self.sandbox is not None
        env["TMPDIR"] = "/tmp"  # the gateway's may be a folder the sandbox does not show
        error_file.touch()  # bound, so it must exist; an empty one reads as no reason
        writable = [home, error_file]
        readonly = []
        model = None
        if spec.workdir is not None:
            where = ["--model-dir", str(spec.workdir)]
            env["SM_MODEL_DIR"] = str(spec.workdir)
            writable.append(spec.workdir)
            if kind == "cmd":
                readonly.append(_gateway_folder(spec.workdir / MODELS_FOLDER))
        else:
            model = await asyncio.to_thread(self._fetch, spec)
            where = ["--model-dir", str(MODEL_DIR)]
        argv = _command(spec, kind, port, where, error_file, unix, token)
        return self.sandbox.wrap(
            argv, chdir=spec.workdir or home, writable=writable, readonly=readonly, model=model
        )

    def _fetch(self, spec: InstanceSpec) -> Path:
        """The instance's model folder in this host's cache, fetched if need be."""
        if not spec.model_url:
            return self._empty_model_dir()
        try:
            return launch.model_folder(
                spec.model_url,
                self.models_dir,
                s3_endpoint_url=self._s3.get("SHIPYARD_S3_ENDPOINT_URL") or None,
                store=self.artifacts,
            )
        except Exception as exc:
            text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise BackendError(
                f"Instance {spec.instance_id} failed to start: {type(exc).__name__}: {text}"
            ) from exc

    def _popen(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        spec: InstanceSpec,
        unix: _UnixListener | None = None,
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
                preexec_fn=functools.partial(_start_instance, os.getpid(), spec.cpu_nice),
            )
        except OSError as exc:
            raise BackendError(f"Could not start instance {spec.instance_id}: {exc}") from exc
        finally:
            if spec.log_path:
                out.close()  # type: ignore[union-attr]

    # -- warm spares ----------------------------------------------------------------------

    @property
    def _imports_file(self) -> Path:
        """What the serverless instances of this home imported: what spares preload."""
        return self.run_dir / "warm-imports"

    @property
    def _spare_home(self) -> Path:
        return self.run_dir / "home" / "_spare"

    def _spare_environment(self) -> dict[str, str]:
        return process_environment(self._environ, home=self._spare_home)

    def _from_spare(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        spec: InstanceSpec,
        unix: _UnixListener | None,
    ) -> subprocess.Popen[bytes] | None:
        """A waiting spare, told to become the instance (and handed its Unix socket);
        None when none is left."""
        log_path = spec.log_path and str(spec.log_path)
        work = {
            "argv": argv,
            "environ": env,
            "cwd": str(cwd),
            "log": log_path,
            "nice": spec.cpu_nice,
        }
        line = json.dumps(work).encode() + b"\n"
        fds = [] if unix is None else [unix.sock.fileno()]
        while self._spares:
            waiting = self._spares.pop(0)
            process = waiting.process
            try:
                if process.poll() is not None:
                    continue
                # Its priority back first, if the kernel takes it now; the spare sees to
                # it otherwise (runtime/spare.py).
                if autogroup.leads_session(process.pid):
                    autogroup.set_nice(process.pid, spec.cpu_nice, 0.0)
                # The descriptor goes with the first bytes; the rest follow on the stream.
                # A spare reads at once; one that does not is not waited for long.
                waiting.channel.settimeout(5.0)
                sent = socket.send_fds(waiting.channel, [line], fds)
                if sent < len(line):
                    # Only what is left: a spare that has its whole line may already
                    # have closed its end, and even an empty send would then fail.
                    waiting.channel.sendall(line[sent:])
            except OSError:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
                continue
            finally:
                waiting.channel.close()  # the spare reads its work to the end
            return process
        return None

    def _refill(self) -> None:
        """Start spares until ``warm_spares`` wait; each imports for a second or so on
        its own, off the gateway's path."""
        for gone in [s for s in self._spares if s.process.poll() is not None]:
            gone.channel.close()
            self._spares.remove(gone)
        home = self._spare_home
        home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "shipyard.runtime", "--spare"]
        argv += ["--preload-file", str(self._imports_file)]
        while len(self._spares) < self.warm_spares:
            # A socket pair rather than a pipe: it carries descriptors (runtime/spare.py).
            channel, theirs = socket.socketpair()
            try:
                process = subprocess.Popen(
                    argv,
                    env=self._spare_environment(),
                    cwd=home,
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=functools.partial(die_with_parent, os.getpid()),
                )
            except OSError as exc:
                channel.close()
                log.warning("could not start a warm spare: %s", exc)
                return
            finally:
                theirs.close()
            if autogroup.leads_session(process.pid):  # one try: the spare waits out refusals
                autogroup.set_nice(process.pid, spare.WAITING_NICE, 0.0)
            self._spares.append(_Spare(process, channel))

    def close(self) -> None:
        """Stop the spares (instances are stopped by their fleets)."""
        if self.containers is not None:
            self.containers.close()
        spares, self._spares = self._spares, []
        for waiting in spares:
            waiting.channel.close()  # a spare reads EOF and exits
        for process in (s.process for s in spares):
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None

    def _empty_model_dir(self) -> Path:
        empty = self.models_dir / "_empty"
        empty.mkdir(parents=True, exist_ok=True)
        return empty

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        if isinstance(handle, ContainerInstance):
            assert self.containers is not None
            return await self.containers.stop(handle, timeout_s=timeout_s)
        assert isinstance(handle, LocalInstance)
        process = handle.process
        if process.poll() is None:
            if handle.sandboxed:
                _signal_inside(process.pid, signal.SIGTERM, group=True)
            else:
                _signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(process.wait), timeout_s)
            # The leader may end while its group lives on (a cmd: image's server that
            # ignores SIGTERM, under shipyard.launch's exit): it has the same time.
            while time.monotonic() < deadline and _group_lives(process.pid):
                await asyncio.sleep(0.05)
            _signal_group(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
        else:
            # The leader is gone; its session may still hold children.
            _signal_group(process.pid, signal.SIGKILL)
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
        for pgid in _groups_carrying(recorded):
            _signal_group(pgid, signal.SIGKILL)
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
        used = _tree_sum(handle, lambda p: float(p.memory_info().rss))
        return None if used is None else int(used)

    def cpu_seconds(self, handle: InstanceHandle) -> float | None:
        if isinstance(handle, ContainerInstance):
            assert self.containers is not None
            return self.containers.cpu_seconds(handle)
        return _tree_sum(handle, lambda p: p.cpu_times().user + p.cpu_times().system)

    # -- job runners ----------------------------------------------------------------------

    async def start_job(
        self,
        workdir: Path,
        *,
        s3_endpoint_url: str | None,
        s3_access: bool = True,
        runner: str = JOB_RUNNER,
    ) -> JobHandle:
        argv = [sys.executable, "-m", runner, str(workdir)]
        env = process_environment(self._environ, home=workdir, s3=self._s3 if s3_access else None)
        if FRAMEWORK_IMAGES_ENV in self._environ:  # the runner decides as the gateway did
            env[FRAMEWORK_IMAGES_ENV] = self._environ[FRAMEWORK_IMAGES_ENV]
        # A processing runner sandboxes its script itself, as a training image's runs
        # in its container: either way the runner is outside, holding file_roots.
        in_image = runner != JOB_RUNNER or self._in_image(workdir)
        if in_image and self.containers is not None:
            env.update(self.containers.engine.variables())  # the runner starts its container
        if s3_endpoint_url:
            argv += ["--s3-endpoint-url", s3_endpoint_url]
        # A training image's code runs in its container, which is its sandbox; the runner
        # beside it is shipyard's own, and talks to the engine, which no bwrap sandbox
        # shows. It enforces auth.file_roots itself where it opens files (storage's
        # Filesystems), as the gateway does, and reads what the container wrote through
        # no link (job_contract.open_beneath).
        sandboxed = self.sandbox is not None and not in_image
        if self.sandbox is not None and in_image:
            argv += ["--file-roots", json.dumps([str(r) for r in self.sandbox.file_roots])]
            # The gateway's home is no caller's, even under a root: nor is it the runner's.
            argv += ["--hidden", json.dumps([str(h) for h in self.sandbox.hidden])]
        granted: list[tuple[int, Path]] = []
        try:
            if self.sandbox is not None and sandboxed:
                env["TMPDIR"] = "/tmp"  # the gateway's may be a folder the sandbox does not show
                granted = self._grant_outputs(self.sandbox, workdir)
                # Not tied to the gateway: a job outlives it. Its runner's end ends the
                # sandbox, and with it a script the runner left running.
                argv = self.sandbox.wrap(
                    argv,
                    chdir=workdir,
                    writable=[workdir],
                    granted=granted,
                    die_with_parent=False,
                )
            with open_untrusted(workdir / "runner.log", append=True) as out:
                process = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # Its own session: the job outlives the gateway, and a signal to the
                    # gateway's group never reaches it.
                    start_new_session=True,
                    pass_fds=[fd for fd, _ in granted],
                )
        except OSError as exc:
            raise BackendError(f"Could not start the job runner: {exc}") from exc
        finally:
            for fd, _ in granted:
                os.close(fd)
        self._runners[process.pid] = process
        if sandboxed:
            try:
                _record_runner(workdir, process.pid)
            except OSError as exc:  # found again only while this gateway runs
                log.warning("could not record the bwrap of the runner in %s: %s", workdir, exc)
        log.info("started job runner pid %s in %s", process.pid, workdir)
        return _job_handle(process.pid, workdir, sandboxed=sandboxed)

    def _in_image(self, workdir: Path) -> bool:
        """Whether the job prepared in ``workdir`` runs in a training image (its runner
        runs the container; backends/containers.py TrainingContainer)."""
        if self.containers is None:
            return False
        try:
            spec = JobSpec.from_json((workdir / JOB_FILE).read_bytes())
        except (OSError, ValueError):
            return False
        return runtime_for(spec.image) == "docker"

    def _grant_outputs(self, sandbox: Sandbox, workdir: Path) -> list[tuple[int, Path]]:
        """The local folders a sandboxed job writes (``Sandbox.grant``), opened, with the
        path its runner writes them at: ``<S3OutputPath>/<job>/output``, where it puts
        ``model.tar.gz`` and ``output.tar.gz``, and its checkpoint location. Read from
        the ``job.json`` the gateway has just written, before the job's code runs.

        Raises:
            BackendError: one may not be granted (outside the roots, over the gateway's
                home); the message names it. Whatever was opened is closed.
        """
        spec = JobSpec.from_json((workdir / JOB_FILE).read_bytes())
        locations = [join_uri(spec.output_path, spec.name, "output")]
        if spec.checkpoint is not None:
            locations.append(spec.checkpoint.uri)
        granted: list[tuple[int, Path]] = []
        for uri in locations:
            path = local_location(uri)
            if path is None:  # S3
                continue
            path = Path(os.path.abspath(path))
            try:
                granted.append((sandbox.grant(path), path))
            except ValueError as exc:
                for fd, _ in granted:
                    os.close(fd)
                raise BackendError(f"The job may not write {uri}: {exc}") from None
        return granted

    def attach_job(self, ref: str) -> JobHandle:
        _job_parts(ref)  # refuse a ref that is not ours at once
        return JobHandle(ref)

    def find_job(self, workdir: Path) -> JobHandle | None:
        # A sandboxed runner writes the PID it has inside its sandbox: its bwrap is the
        # one recorded at its start, running or ended.
        recorded = _recorded_runner(workdir)
        if recorded is not None:
            return _job_handle(recorded[0], workdir, sandboxed=True)
        pid = _read_pid(workdir / RUNNER_PID_FILE)
        if pid is None:
            return None
        # Running or ended: one that ended while no gateway watched still has its status
        # lines to apply, and starting it again would repeat them.
        return _job_handle(pid, workdir)

    def job_running(self, handle: JobHandle) -> bool:
        pid, workdir, sandboxed = _job_parts(handle.ref)
        process = self._runners.get(pid)
        if process is not None:
            if process.poll() is None:
                # Ours and not ended. Its command line can't tell: it reads empty while
                # the process is still finishing its exec.
                return True
            del self._runners[pid]  # reaped: a zombie would still be listed
            return False
        if sandboxed:
            # The bwrap recorded at the start, if it still runs: any process of a
            # sandbox can take bwrap's name and a runner's command line, none the PID
            # and start time of one the gateway started.
            return _recorded_runner(workdir, alive=True) == (pid, True)
        # A runner started by an earlier gateway is found by its command line, which
        # names its working folder; that also guards against a reused PID.
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            return False
        return str(workdir) in cmdline

    def job_status(self, handle: JobHandle, *, skip: int) -> list[StatusLine]:
        _, workdir, _ = _job_parts(handle.ref)
        return read_status(workdir / STATUS_FILE, skip=skip)

    def signal_job(self, handle: JobHandle, sig: int) -> None:
        if self.job_running(handle):
            pid, _, sandboxed = _job_parts(handle.ref)
            if sandboxed:
                _signal_inside(pid, sig, group=False)
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill_job(self, handle: JobHandle) -> None:
        pid, workdir, sandboxed = _job_parts(handle.ref)
        if self.job_running(handle):
            _signal_group(pid, signal.SIGKILL)
        if self._in_image(workdir):
            assert self.containers is not None
            remove_job_container(self.containers.engine, workdir)  # it outlives its runner
            return
        if sandboxed:
            return  # the sandbox ended with its bwrap, and every process in it
        # The script leads its own session; once its runner is gone nobody else stops it.
        script = _read_pid(workdir / SCRIPT_PID_FILE)
        if script is None:
            return
        with contextlib.suppress(OSError, psutil.Error):
            # It runs in the job's folder: a reused PID would not. Compared as paths, so
            # attempt-10 is not inside attempt-1, and resolved, as the runner does (macOS's
            # /tmp is a link to /private/tmp).
            if Path(psutil.Process(script).cwd()).is_relative_to(workdir.resolve()):
                _signal_group(script, signal.SIGKILL)


def _job_handle(pid: int, workdir: Path, *, sandboxed: bool = False) -> JobHandle:
    return JobHandle(f"{_SANDBOXED if sandboxed else _LOCAL}:{pid}:{workdir}")


def _job_parts(ref: str) -> tuple[int, Path, bool]:
    """The PID and working folder in a local handle's ``ref``, and whether that PID is
    the bwrap of a sandboxed runner."""
    kind, _, rest = ref.partition(":")
    pid, _, workdir = rest.partition(":")
    if kind not in (_LOCAL, _SANDBOXED) or not pid.isdigit() or not workdir:
        raise ValueError(f"not a local job runner: {ref!r}")
    return int(pid), Path(workdir), kind == _SANDBOXED


def _runner_record(workdir: Path) -> Path:
    """Where a sandboxed runner's bwrap is recorded: beside its working folder, which
    the sandbox writes, in its job's folder, which no sandbox sees."""
    return workdir.parent / f"{workdir.name}.sandbox"


def _record_runner(workdir: Path, pid: int) -> None:
    """Record the bwrap ``pid`` the backend has just started for ``workdir``'s runner,
    with its start time, so a reused PID is not taken for it."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = None  # ended already: recorded all the same, as not running
    record = _runner_record(workdir)
    partial = record.with_name(f".{record.name}.partial")
    partial.write_text(json.dumps({"pid": pid, "started": started}))
    partial.replace(record)


def _recorded_runner(workdir: Path, *, alive: bool = False) -> tuple[int, bool] | None:
    """The PID of the bwrap recorded for ``workdir``'s runner, and (with ``alive``)
    whether that very process still runs; None when none was recorded."""
    try:
        record = json.loads(_runner_record(workdir).read_text())
        pid, started = int(record["pid"]), record["started"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not alive:
        return pid, False
    try:
        process = psutil.Process(pid)
        running = started is not None and process.create_time() == started
        return pid, running and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return pid, False


def _read_pid(path: Path) -> int | None:
    """The PID in a PID file a job's processes write; None when there is none to read."""
    try:
        with open_untrusted(path) as f:
            return int(f.read(32).strip())
    except (OSError, ValueError):
        return None


def _gateway_folder(path: Path) -> Path:
    """``path``, a folder inside a sandbox's writable one that only the gateway writes
    (bound read-only over it), made a real folder again if something replaced it."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(exist_ok=True)
    return path


def _start_instance(gateway_pid: int, cpu_nice: int) -> None:
    """In an instance's process, before exec: tied to the gateway, at its CPU priority.

    The instance leads a session of its own: its nice value ranks it only within that
    session's autogroup, so the group's is set too (shipyard/autogroup.py)."""
    die_with_parent(gateway_pid)
    if cpu_nice:
        os.nice(cpu_nice)
        autogroup.set_nice("self", cpu_nice, autogroup.BEFORE_EXEC_PATIENCE_S)


def die_with_parent(gateway_pid: int, sig: int = signal.SIGKILL) -> None:
    """In the child, before exec: the kernel sends it ``sig`` when the gateway dies.

    PR_SET_PDEATHSIG fires when the thread that forked exits, so instances are started
    from the event loop's thread (``start`` is a coroutine; never call it through
    ``to_thread``), which lives as long as the gateway. A gateway that died between the
    fork and here is not noticed by the kernel, so the child checks its parent itself.
    Linux only: elsewhere (macOS) there is no prctl, and ``stop_leftovers`` at the next
    start does the work.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != gateway_pid:
        os._exit(1)


def _groups_carrying(instances: Mapping[int, str]) -> set[int]:
    """Which of the process groups ``instances`` (group id to instance id) still live.

    A group lives while one of its processes does, and it is the instance's when that
    process has ``SHIPYARD_INSTANCE_ID=<id>`` in its environment (inherited from the
    leader, which may be gone): a reused PID is not mistaken for it. One pass over the
    process table, through psutil (Linux's /proc, macOS's sysctl).
    """
    found: set[int] = set()
    if not instances:
        return found
    for proc in psutil.process_iter():
        try:
            pgid = os.getpgid(proc.pid)
            if pgid not in instances or pgid in found:
                continue
            if proc.environ().get("SHIPYARD_INSTANCE_ID") == instances[pgid]:
                found.add(pgid)
        except (OSError, psutil.Error):
            continue
    return found


def _signal_inside(pid: int, sig: int, *, group: bool) -> None:
    """Send ``sig`` to the processes a sandbox's bwrap (``pid``) runs, not to bwrap.

    bwrap handles no signal: a SIGTERM kills it at once, and its end SIGKILLs the
    sandbox, so the process inside would never get to stop politely. Inside, bwrap's
    own init (its child) runs the command: ``group`` sends to every process of bwrap's
    group under that init (as ``killpg`` would, but for bwrap and its init), else to
    the command alone (as ``kill`` would).
    """
    try:
        inits = psutil.Process(pid).children()
        inside = [p for init in inits for p in init.children(recursive=group)]
    except psutil.Error:
        return
    for process in inside:
        with contextlib.suppress(OSError, psutil.Error):
            if not group or os.getpgid(process.pid) == pid:
                process.send_signal(sig)


def _group_lives(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` still runs. Zombies do not count: an
    orphan's waits for a parent that may not reap it (the init of some containers does not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == pgid:
                return True
    return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # The instance leads its own session (start_new_session), so its process group id is
    # its PID: this reaches the children it spawned and nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tree_sum(handle: InstanceHandle, measure: Callable[[psutil.Process], float]) -> float | None:
    """``measure`` added up over an instance's process and all it spawned; None when
    the instance is gone."""
    assert isinstance(handle, LocalInstance)
    try:
        leader = psutil.Process(handle.process.pid)
        processes = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):  # a child that just ended
            total += measure(process)
    return total
