"""``python -m shipyard.jobs.runner WORKDIR``: run one attempt of one job, start to end.

The runner reads ``job.json``, lays out ``WORKDIR/ml`` as SageMaker's ``/opt/ml``, brings
in the code, channels and checkpoints, runs the script, uploads ``model.tar.gz`` and
``output.tar.gz``, and reports every step in ``status.jsonl`` (see job_contract.py). It
runs in its own session and talks to the gateway only through that folder and signals,
so it outlives a gateway restart.

Guarantees and failure modes:

- The status file always ends with exactly one ``final`` line and the runner exits 0,
  whatever happened to the job; a bug in the runner ends as ``Failed`` with an
  ``InternalServerError`` reason rather than a missing end. Only losing the runner
  itself (SIGKILL, a reboot) leaves no final line: the gateway sees the runner gone, and
  the script, which leads its own session, still runs; ``script.pid`` names it.
- SIGTERM stops the job as StopTrainingJob does: SIGTERM to the script's process group,
  SIGKILL after ``stop_grace_s``, then whatever the script saved is uploaded.
- A failed script uploads ``output.tar.gz`` (its ``output/data``) but no model, best
  effort: a failed upload then is only logged, since the job has already failed. A failed
  upload after a Completed or stopped script fails the job with a ClientError.
- Checkpoints are synced up while the script runs; a failed sync is logged and retried
  at the next period, never failing the job.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shipyard.backends.base import runtime_for
from shipyard.backends.containers import Engine, TrainingContainer, TrainingEnd
from shipyard.errors import ArtifactError, BackendError, ClientError
from shipyard.job_contract import (
    JOB_FILE,
    LOG_FILE,
    RUNNER_PID_FILE,
    SCRIPT_PID_FILE,
    STATUS_FILE,
    JobSpec,
    Outcome,
    StatusLine,
    append_status,
)
from shipyard.jobs.layout import (
    FAILURE_REASON_MAX_CHARS,
    Layout,
    failure_reason,
    pack,
    prepare,
    script_argv,
    script_environment,
)
from shipyard.jobs.script_io import CheckpointSync, JobLog
from shipyard.storage.artifacts import ArtifactStore, join_uri
from shipyard.storage.filesystems import FileRoots, Filesystems

log = logging.getLogger(__name__)

CHECKPOINT_SYNC_PERIOD_S = 5.0
"""How often the checkpoint folder is synced up while the script runs."""
POLL_PERIOD_S = 0.1
STDERR_TAIL_LINES = 20
READER_JOIN_TIMEOUT_S = 5.0

CODE_SEEN = json.dumps("/opt/ml/code")
"""sagemaker_submit_directory as a training image's toolkit reads it (JSON-encoded, as
the sagemaker SDK sends hyperparameters): the code the runner fetched into /opt/ml/code."""
ENGINE_PATIENCE_S = 60.0
"""How long a training container's engine may not answer before its instance counts as
lost (the engine restarting, say)."""
CONTAINER_POLL_PERIOD_S = 0.25
"""How often a training container's state is read from the engine."""

STOP = "stop"
MAX_RUNTIME = "max_runtime"


class InstanceLost(Exception):
    """The job's instance was lost (its container killed from outside): the attempt
    ends with no final status line, for the gateway to retry or fail it."""


@dataclass(frozen=True, slots=True)
class _End:
    """The last status line: its SecondaryStatus, message and the job's outcome."""

    secondary: str
    message: str
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class _ScriptRun:
    exit_code: int
    halted: str | None
    """STOP or MAX_RUNTIME when the runner ended the script, else None."""
    stderr_tail: list[str]


class Runner:
    """Runs the job in one working folder, from ``job.json`` to the final status line.

    ``stop`` is set by the signal handler; ``inherited_env`` is passed on to the script.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        store: ArtifactStore,
        job_log: JobLog,
        inherited_env: Mapping[str, str],
        stop: threading.Event,
        checkpoint_sync_period_s: float = CHECKPOINT_SYNC_PERIOD_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.workdir = workdir
        self._store = store
        self._log = job_log
        self._inherited_env = inherited_env
        self._stop = stop
        self._checkpoint_sync_period_s = checkpoint_sync_period_s
        self._clock = clock

    def __repr__(self) -> str:
        return f"Runner(workdir={str(self.workdir)!r})"

    def run(self) -> Outcome:
        """Run the job and write its final status line; never raises for the job's sake."""
        self._status("Starting", "Preparing the instances for training")
        try:
            end = self._run()
        except InstanceLost as exc:
            self._log.note(f"The instance was lost: {exc}; the attempt ends without an outcome")
            return Outcome(status="Failed", failure_reason=str(exc))
        except Exception as exc:  # the gateway must see an end, whatever went wrong here
            log.exception("the job runner failed in %s", self.workdir)
            end = _failed(f"InternalServerError: {type(exc).__name__}: {exc}")
        if end.outcome.failure_reason:
            self._log.note(f"Failure reason: {end.outcome.failure_reason}")
        self._status(end.secondary, end.message, final=end.outcome)
        return end.outcome

    def _run(self) -> _End:
        try:
            spec = JobSpec.from_json((self.workdir / JOB_FILE).read_bytes())
        except (OSError, ValueError) as exc:
            return _failed(f"ClientError: Could not read the job's {JOB_FILE}: {exc}")
        layout = Layout.for_job(self.workdir, spec)
        try:
            self._status("Downloading", "Downloading input data")
            self._download(spec, layout)
            in_image = runtime_for(spec.image) == "docker"
            argv = [] if in_image else script_argv(spec, layout)
            halted = self._halt_reason(spec)
            if halted is not None:
                self._status("Stopping", _STOPPING_MESSAGES[halted])
                return _stopped(halted, model_artifacts=None, exit_code=None)
            if in_image:
                run = self._train_in_image(spec, layout)
            else:
                run = self._train(spec, layout, argv)
        except (ArtifactError, ClientError, OSError) as exc:
            return _failed(f"ClientError: {exc}")
        except BackendError as exc:
            return _failed(f"ClientError: {exc}")
        return self._conclude(spec, layout, run)

    def _download(self, spec: JobSpec, layout: Layout) -> None:
        prepare(layout, spec)
        if not layout.checkpoint_mapped and spec.checkpoint:
            self._log.note(
                f"Checkpoint local path {spec.checkpoint.local_path} is not under /opt/ml; "
                f"using {layout.checkpoints}"
            )
        if spec.submit_directory:
            self._log.note(f"Fetching the submit directory {spec.submit_directory}")
            self._store.fetch_code(spec.submit_directory, layout.code_dir)
        for channel in spec.channels:
            if channel.data_type != "S3Prefix":
                raise ClientError(
                    f"Channel '{channel.name}' has S3DataType {channel.data_type}; "
                    "only S3Prefix is supported."
                )
            what = f"input data of channel '{channel.name}'"
            count = self._store.download(channel.uri, layout.channel_dir(channel.name), what=what)
            self._log.note(f"Channel '{channel.name}': {count} file(s) from {channel.uri}")
        if spec.checkpoint:
            uri = spec.checkpoint.uri
            count = self._store.download(
                uri, layout.checkpoints, what="checkpoint data", missing_ok=True
            )
            self._log.note(f"Restored {count} checkpoint file(s) from {uri}")

    def _train(self, spec: JobSpec, layout: Layout, argv: list[str]) -> _ScriptRun:
        """Run the script to its end, or stop it; leave nothing of it running."""
        self._status("Training", "Training image download completed. Training in progress.")
        process = self._start_script(spec, layout, argv)
        assert process.stdout is not None and process.stderr is not None
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        readers = [self._log.follow(process.stdout), self._log.follow(process.stderr, tail)]
        sync = self._checkpoint_sync(spec, layout)
        try:
            halted = self._supervise(process, spec)
        finally:
            _signal_group(process.pid, signal.SIGKILL)  # whatever it left running
            process.wait()
            for reader in readers:
                reader.join(READER_JOIN_TIMEOUT_S)
            (self.workdir / SCRIPT_PID_FILE).unlink(missing_ok=True)
            if sync is not None:
                sync.finish()
        self._log.note(f"The script exited with code {process.returncode}")
        return _ScriptRun(process.returncode, halted, list(tail))

    def _train_in_image(self, spec: JobSpec, layout: Layout) -> _ScriptRun:
        """Run the training image to its end, or stop it (backends/containers.py).

        Its output is the job's log. A container killed from outside is a lost instance,
        not a failed algorithm: ``InstanceLost`` leaves the attempt without an outcome, as
        a lost runner does, for the gateway to retry it from its checkpoints where the
        job's RetryStrategy allows (jobs/supervisor.py)."""
        self._status("Training", "Training image download completed. Training in progress.")
        if spec.submit_directory:
            # A framework image's toolkit fetches sagemaker_submit_directory itself: the
            # code is fetched already, where the container sees it (a location of the
            # caller's is no use inside the container).
            hyperparameters = {**spec.hyperparameters, "sagemaker_submit_directory": CODE_SEEN}
            (layout.config_dir / "hyperparameters.json").write_text(
                json.dumps(hyperparameters, indent=1)
            )
        container = TrainingContainer(Engine(self._inherited_env), self.workdir)
        container.start(
            spec,
            layout.root,
            # A LocalPath outside /opt/ml: the container writes there, the runner syncs this.
            checkpoints=None if layout.checkpoint_mapped else layout.checkpoints,
            pull=self._inherited_env.get("SHIPYARD_IMAGE_PULL", "missing"),
        )
        self._log.note(f"Started the training container {container.name} ({spec.image})")
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        reader = threading.Thread(
            target=self._pump, args=(container, tail), name="job-log", daemon=True
        )
        reader.start()
        sync = self._checkpoint_sync(spec, layout)
        halted = None
        unanswered: list[float] = []  # since when the engine has not answered, if it has not
        try:
            while (end := self._end_of(container, unanswered)) is None:
                halted = halted or self._halt_reason(spec)
                if halted is not None and not container.stopping:
                    container.stopping = True
                    self._status("Stopping", _STOPPING_MESSAGES[halted])
                    self._log.note(f"Stopping the container; SIGKILL after {spec.stop_grace_s:g} s")
                    threading.Thread(
                        target=container.stop, args=(spec.stop_grace_s,), daemon=True
                    ).start()
                time.sleep(CONTAINER_POLL_PERIOD_S)
        finally:
            try:
                reader.join(READER_JOIN_TIMEOUT_S)
                if sync is not None:
                    sync.finish()
            finally:
                container.remove()  # whatever happened: nobody else would
        self._log.note(f"The training container exited with code {end.exit_code}")
        if end.lost and halted is None:
            raise InstanceLost(f"the training container was killed (exit code {end.exit_code})")
        if end.reason is not None:
            tail.append(end.reason)
        return _ScriptRun(end.exit_code, halted, list(tail))

    def _end_of(self, container: TrainingContainer, unanswered: list[float]) -> TrainingEnd | None:
        """The container's end; None while it runs, or while its engine does not answer
        (``unanswered`` keeps since when) for up to ENGINE_PATIENCE_S, after which the
        instance is lost."""
        try:
            end = container.end()
        except BackendError as exc:
            if not unanswered:
                self._log.note(f"The container's state cannot be read: {exc}")
                unanswered.append(time.monotonic())
            if time.monotonic() - unanswered[0] > ENGINE_PATIENCE_S:
                raise InstanceLost(
                    f"the engine did not answer for {ENGINE_PATIENCE_S:g} s"
                ) from None
            return None
        unanswered.clear()
        return end

    def _pump(self, container: TrainingContainer, tail: deque[str]) -> None:
        with contextlib.suppress(Exception):  # the container was removed, the engine left
            for line in container.output():
                self._log.write(line)
                tail.append(line)

    def _checkpoint_sync(self, spec: JobSpec, layout: Layout) -> CheckpointSync | None:
        """The sync of the job's checkpoints while it runs, if it has a CheckpointConfig."""
        if not spec.checkpoint:
            return None
        return CheckpointSync(
            self._store,
            layout.checkpoints,
            spec.checkpoint.uri,
            period_s=self._checkpoint_sync_period_s,
            job_log=self._log,
            root=layout.root,
        )

    def _start_script(
        self, spec: JobSpec, layout: Layout, argv: list[str]
    ) -> subprocess.Popen[bytes]:
        env = script_environment(
            spec, layout, inherited=self._inherited_env, num_cpus=os.cpu_count() or 1
        )
        process = subprocess.Popen(
            argv,
            cwd=layout.code_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its process group is its PID: a stop reaches it all
        )
        # Replaced whole, so the gateway never reads a half-written PID.
        partial = self.workdir / f".{SCRIPT_PID_FILE}"
        partial.write_text(f"{process.pid}\n")
        partial.replace(self.workdir / SCRIPT_PID_FILE)
        self._log.note(f"Started the script (pid {process.pid}): {' '.join(argv)}")
        return process

    def _supervise(self, process: subprocess.Popen[bytes], spec: JobSpec) -> str | None:
        """Wait for the script; stop it on a stop request or at the max runtime."""
        while True:
            try:
                process.wait(timeout=POLL_PERIOD_S)
                return None
            except subprocess.TimeoutExpired:
                pass
            halted = self._halt_reason(spec)
            if halted is not None:
                self._status("Stopping", _STOPPING_MESSAGES[halted])
                self._end_script(process, spec.stop_grace_s)
                return halted

    def _end_script(self, process: subprocess.Popen[bytes], grace_s: float) -> None:
        self._log.note(f"Sending SIGTERM to the script; SIGKILL after {grace_s:g} s")
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._log.note(f"The script still ran after {grace_s:g} s; sending SIGKILL")
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()

    def _halt_reason(self, spec: JobSpec) -> str | None:
        if self._stop.is_set():
            return STOP
        if spec.max_runtime_s is not None:
            if self._clock() >= spec.started_at + spec.max_runtime_s:
                return MAX_RUNTIME
        return None

    def _conclude(self, spec: JobSpec, layout: Layout, run: _ScriptRun) -> _End:
        if run.halted is None and run.exit_code != 0:
            reason = failure_reason(layout, run.exit_code, run.stderr_tail)
            try:
                self._upload(spec, layout, with_model=False)
            except (ArtifactError, OSError) as exc:
                self._log.note(f"Could not upload the output data: {exc}")
            return _failed(reason, exit_code=run.exit_code)
        self._status("Uploading", "Uploading generated training model")
        try:
            model_artifacts = self._upload(spec, layout, with_model=True)
        except (ArtifactError, OSError) as exc:
            return _failed(f"ClientError: {exc}", exit_code=run.exit_code)
        if run.halted is not None:
            return _stopped(run.halted, model_artifacts=model_artifacts, exit_code=run.exit_code)
        return _End(
            "Completed",
            "Training job completed",
            Outcome(status="Completed", model_artifacts=model_artifacts, exit_code=0),
        )

    def _upload(self, spec: JobSpec, layout: Layout, *, with_model: bool) -> str:
        """Pack and upload the output (and model) archives; return the model's URI."""
        destination = join_uri(spec.output_path, spec.name, "output")
        archives = {"output.tar.gz": layout.output_data_dir}
        if with_model:
            archives = {"model.tar.gz": layout.model_dir, **archives}
        packed = self.workdir / "upload"
        packed.mkdir(exist_ok=True)
        for name, folder in archives.items():
            pack(folder, packed / name)
            self._store.upload_file(packed / name, join_uri(destination, name))
            self._log.note(f"Uploaded {join_uri(destination, name)}")
        return join_uri(destination, "model.tar.gz")

    def _status(self, secondary: str, message: str, *, final: Outcome | None = None) -> None:
        line = StatusLine(secondary=secondary, time=self._clock(), message=message, final=final)
        append_status(self.workdir / STATUS_FILE, line)
        self._log.note(message)


_STOPPING_MESSAGES = {
    STOP: "Stopping the training job",
    MAX_RUNTIME: "Stopping the training job: MaxRuntimeInSeconds reached",
}


def _failed(reason: str, *, exit_code: int | None = None) -> _End:
    outcome = Outcome(
        status="Failed", failure_reason=reason[:FAILURE_REASON_MAX_CHARS], exit_code=exit_code
    )
    return _End("Failed", "Training job failed", outcome)


def _stopped(halted: str, *, model_artifacts: str | None, exit_code: int | None) -> _End:
    outcome = Outcome(status="Stopped", model_artifacts=model_artifacts, exit_code=exit_code)
    if halted == MAX_RUNTIME:
        return _End("MaxRuntimeExceeded", "Job stopped because max run time was reached", outcome)
    return _End("Stopped", "Training job stopped", outcome)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # The script leads its own session, so its process group id is its PID.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def lock_pid_file(path: Path) -> IO[str]:
    """Write our PID to ``path`` and hold an exclusive ``flock`` on it while we live.

    The lock keeps a second runner out of the folder, and the kernel releases it however
    the runner dies. Raises BlockingIOError when another runner holds it.
    """
    pid_file = open(path, "a+")
    try:
        fcntl.flock(pid_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid_file.close()
        raise
    pid_file.truncate(0)
    pid_file.write(f"{os.getpid()}\n")
    pid_file.flush()
    return pid_file


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shipyard.jobs.runner")
    parser.add_argument("workdir", type=Path, help="the job's working folder, with job.json")
    parser.add_argument("--s3-endpoint-url", help="an S3-compatible endpoint instead of AWS")
    parser.add_argument("--checkpoint-sync-period-s", type=float, default=CHECKPOINT_SYNC_PERIOD_S)
    parser.add_argument(
        "--file-roots",
        type=json.loads,
        help="auth.file_roots as a JSON list: local locations outside them are refused "
        "(a runner started outside a sandbox, beside a training container)",
    )
    parser.add_argument(
        "--hidden",
        type=json.loads,
        default=[],
        help="with --file-roots, folders refused even under a root (the gateway's home) "
        "as a JSON list",
    )
    return parser.parse_args(argv)


def _file_roots(args: argparse.Namespace) -> FileRoots | None:
    """The roots the runner's own opens are held to, with the gateway's hidden folders
    refused under them, as the gateway refuses them; None: not held (a sandbox is)."""
    if args.file_roots is None:
        return None
    return FileRoots(args.file_roots, hidden=args.hidden)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exits 0 once the final status line is written."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # first, so no stop request is lost
        signal.signal(sig, lambda _sig, _frame: stop.set())
    args = _arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    workdir: Path = args.workdir.resolve()
    try:
        pid_file = lock_pid_file(workdir / RUNNER_PID_FILE)
    except OSError as exc:
        log.error("Cannot run the job in %s: %s", workdir, exc)
        return 2
    with pid_file, contextlib.closing(JobLog(workdir / LOG_FILE)) as job_log:
        Runner(
            workdir,
            store=ArtifactStore(
                filesystems=Filesystems(
                    s3_endpoint_url=args.s3_endpoint_url,
                    file_roots=_file_roots(args),
                )
            ),
            job_log=job_log,
            inherited_env=dict(os.environ),
            stop=stop,
            checkpoint_sync_period_s=args.checkpoint_sync_period_s,
        ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
