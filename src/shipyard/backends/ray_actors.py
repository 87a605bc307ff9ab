"""What the Ray backend runs on a cluster's nodes: one actor per instance or job runner.

Each actor starts its process on the node Ray placed it on, in a folder of that node's,
with the node's own plain environment (PATH, PYTHONPATH: the node's Python and shipyard,
not the gateway's) plus what the gateway sends: the model's Environment and, for a
process that reads ``s3://``, the gateway's S3 access. Its process dies with it; the
actors are detached, so both outlive the gateway that started them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ray
import ray.util

from shipyard import autogroup
from shipyard.backends.base import token_pipe
from shipyard.backends.environment import process_environment
from shipyard.contract import ADAPTERS_TOKEN_FD_ENV
from shipyard.job_contract import JOB_FILE, LOG_FILE, SCRIPT_PID_FILE, STATUS_FILE

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class Command:
    """What an instance runs, as the gateway says it; the node fills in its own paths."""

    instance_id: str
    kind: str
    """``python`` (the built-in runtime) or ``cmd`` (a user's server)."""
    shell: str | None
    """A ``cmd:`` image's command."""
    model_url: str | None
    own_folder: bool
    """Whether the instance gets a folder of its own as model directory (multi-model)."""
    environment: dict[str, str]
    cpu_nice: int
    adapters_token: str | None = None
    """A component's copy's (InstanceSpec.adapters_token): handed to the built-in runtime
    through a pipe, not its environment."""


def _node_root() -> Path:
    """This node's folder for instances and jobs: per node, as nodes of a test cluster
    may share one machine's temporary folder."""
    node = ray.get_runtime_context().get_node_id()[:12]
    return Path(tempfile.gettempdir()) / "shipyard-ray" / node


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _start_child(actor_pid: int, cpu_nice: int) -> None:
    """In the instance's process, before exec: it dies with its actor (the kernel sends
    SIGKILL when the thread that forked it, the actor's event loop, ends), and runs at
    the node's normal CPU priority plus ``cpu_nice``, not at the one Ray gives its
    workers (``RAY_worker_niceness``, 15), which would leave an instance only the CPU
    that everything else on its node leaves."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != actor_pid:
        os._exit(1)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, cpu_nice)
    except PermissionError:  # raising priority needs CAP_SYS_NICE: lower it at least
        if cpu_nice:
            os.nice(cpu_nice)
    if cpu_nice:  # its own session's group, which its nice value ranks it within
        autogroup.set_nice("self", cpu_nice, autogroup.BEFORE_EXEC_PATIENCE_S)


def _signal_group(pid: int, sig: int) -> None:
    # The process leads its own session: this reaches what it spawned and nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 2048))
            text = f.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("; last log lines: " + " | ".join(text)) if text else ""


class InstanceActor:
    """One instance's process on the node Ray placed this actor on (async actor: its
    methods run on one event loop, so ``wait`` never blocks ``stop``)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.error_file: Path | None = None
        self.log_path: Path | None = None
        self.log_start = 0
        self.address: tuple[str, int] | None = None

    async def start(self, command: Command) -> tuple[str, int, int]:
        """Start the instance; its node's address, its port and its PID."""
        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        port = _free_port(host)
        root = _node_root()
        run = root / "run"
        home = run / "home" / command.instance_id
        home.mkdir(parents=True, exist_ok=True)
        self.error_file = run / f"{command.instance_id}.error"
        self.error_file.unlink(missing_ok=True)
        self.log_path = root / "logs" / f"{command.instance_id}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = process_environment(os.environ, home=home)
        env.update(command.environment)
        env["SAGEMAKER_BIND_TO_PORT"] = str(port)
        if command.own_folder:
            folder = root / "instances" / command.instance_id
            folder.mkdir(parents=True, exist_ok=True)
            where = ["--model-dir", str(folder)]
            env["SM_MODEL_DIR"] = str(folder)
        elif command.model_url:
            where = ["--model-cache", str(root / "models"), "--model-url", command.model_url]
        else:
            empty = root / "models" / "_empty"
            empty.mkdir(parents=True, exist_ok=True)
            where = ["--model-dir", str(empty)]
        token = token_pipe(command.adapters_token) if command.adapters_token else None
        if command.kind == "python":
            argv = [sys.executable, "-m", "shipyard.runtime", "--host", host, "--port", str(port)]
            argv += [*where, "--error-file", str(self.error_file)]
            if token is not None:
                argv += ["--adapters-token-fd", str(token)]
        else:
            argv = [sys.executable, "-m", "shipyard.launch", *where]
            argv += ["--error-file", str(self.error_file), "--", "/bin/sh", "-c"]
            argv.append(command.shell or "")
            if token is not None:
                env[ADAPTERS_TOKEN_FD_ENV] = str(token)
        try:
            with open(self.log_path, "ab") as out:
                self.process = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=home,
                    pass_fds=() if token is None else (token,),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=functools.partial(_start_child, os.getpid(), command.cpu_nice),
                )
        finally:
            if token is not None:
                os.close(token)
        self.address = (host, port)
        return host, port, self.process.pid

    def where(self) -> tuple[str, int, int] | None:
        """What ``start`` answered, while the process runs; None once it has ended (a
        gateway adopting the instance asks)."""
        if self.process is None or self.address is None or self.process.poll() is not None:
            return None
        return (*self.address, self.process.pid)

    async def wait(self) -> str:
        """Once the process has ended: why, as the local backend says it."""
        assert self.process is not None and self.error_file and self.log_path
        code = await asyncio.to_thread(self.process.wait)
        with contextlib.suppress(OSError):
            text = self.error_file.read_text().strip()
            if text:
                return text
        return f"the process exited with code {code}{_tail(self.log_path)}"

    async def stop(self, timeout_s: float) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(process.wait), timeout_s)
            except TimeoutError:
                pass
        _signal_group(process.pid, signal.SIGKILL)  # the leader, or what it left behind

    def read_log(self, offset: int) -> bytes:
        """What this process has logged past ``offset`` (at most 1 MiB); an earlier
        process of the instance on this node logged before it, in the same file."""
        if self.log_path is None:
            return b""
        return _read_from(self.log_path, self.log_start + offset)

    def memory_bytes(self) -> int | None:
        import psutil

        if self.process is None:
            return None
        try:
            leader = psutil.Process(self.process.pid)
            processes = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total


class JobActor:
    """One job runner on its node, in a copy of the job's folder there (detached: the
    job outlives the gateway that started it)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None

    def start(
        self, name: str, job_json: str, argv: list[str], env: dict[str, str]
    ) -> tuple[str, int]:
        """Start the runner; its node's address and its PID."""
        self.workdir = _node_root() / "jobs" / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / JOB_FILE).write_text(job_json)
        environment = process_environment(os.environ, home=self.workdir)
        environment.update(env)
        with open(self.workdir / "runner.log", "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "shipyard.jobs.runner", str(self.workdir), *argv],
                cwd=self.workdir,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(_start_child, os.getpid(), 0),
            )
        return ray.util.get_node_ip_address(), self.process.pid  # type: ignore[no-untyped-call]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def read(self, status_from: int, log_from: int) -> tuple[bytes, bytes]:
        """What the runner appended to its status lines and log past those offsets."""
        assert self.workdir is not None
        return (
            _read_from(self.workdir / STATUS_FILE, status_from),
            _read_from(self.workdir / LOG_FILE, log_from),
        )

    def signal(self, sig: int) -> None:
        if self.running():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL the runner and its script (each leads its own session)."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGKILL)
        assert self.workdir is not None
        with contextlib.suppress(OSError, ValueError):
            _signal_group(int((self.workdir / SCRIPT_PID_FILE).read_text().strip()), signal.SIGKILL)


def _read_from(path: Path, offset: int, limit: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except OSError:
        return b""
