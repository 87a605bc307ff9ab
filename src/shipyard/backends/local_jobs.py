"""Job runners as local processes: the local backend's jobs (backends/local.py).

Each job's runner (``shipyard.jobs.runner``) is a process in a session of its own: the
job outlives the gateway, and a later gateway finds it again by its working folder.

With a :class:`~shipyard.backends.sandbox.Sandbox` (``auth.sandbox``), a runner is
started through ``bwrap``, which is then the process its handle names. A sandboxed
runner writes its own folder, so nothing there is read through a link or from a FIFO
(job_contract.py ``open_untrusted``), and what must be trusted is kept outside it: the
runner's bwrap is recorded beside its working folder (``<attempt>.sandbox``, its PID and
start time), never found by a name or a command line, which any process can take.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil

from shipyard.backends.base import FRAMEWORK_IMAGES_ENV, JOB_RUNNER, JobHandle, runtime_for
from shipyard.backends.containers import ContainerBackend, remove_job_container
from shipyard.backends.environment import process_environment
from shipyard.backends.process_groups import signal_group, signal_inside
from shipyard.backends.sandbox import Sandbox
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
from shipyard.storage.artifacts import join_uri
from shipyard.storage.filesystems import local_location

log = logging.getLogger(__name__)

_LOCAL = "local"
_SANDBOXED = "local-sandboxed"
"""The kinds of job handle: a runner's PID, or the PID of the bwrap running it."""


class LocalJobs:
    """Runs each job's runner as a local process, in a sandbox with ``sandbox``."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str],
        s3: Mapping[str, str],
        sandbox: Sandbox | None = None,
        containers: ContainerBackend | None = None,
    ) -> None:
        self._environ = environ
        """The gateway's environment: runners get only what environment.py picks."""
        self._s3 = s3
        """The S3 access handed to runners that use s3:// (``s3_variables``)."""
        self.sandbox = sandbox
        self.containers = containers
        """Runs the jobs whose image is a container image (backends/containers.py)."""
        self._runners: dict[int, subprocess.Popen[bytes]] = {}

    def __repr__(self) -> str:
        return f"LocalJobs(runners={len(self._runners)}, sandbox={self.sandbox!r})"

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
                signal_inside(pid, sig, group=False)
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill_job(self, handle: JobHandle) -> None:
        pid, workdir, sandboxed = _job_parts(handle.ref)
        if self.job_running(handle):
            signal_group(pid, signal.SIGKILL)
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
                signal_group(script, signal.SIGKILL)


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
