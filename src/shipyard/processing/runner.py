"""``python -m shipyard.processing.runner WORKDIR``: run one processing job, start to end.

The runner reads ``processing.json`` (spec.py), lays out ``WORKDIR/ml``, fetches the
inputs to their LocalPaths, runs the job's command seeing that folder at ``/opt/ml``
(so a script that hard-codes ``/opt/ml/processing/input`` runs unchanged), uploads the
outputs once the command has exited 0, and reports every step in ``status.jsonl``, as
the training runner does (job_contract.py): it runs in its own session and outlives a
gateway restart.

The command runs in a private mount namespace made by bubblewrap
(backends/sandbox.py): with ``--file-roots`` (``auth:`` and its sandbox), in the
gateway's sandbox with ``/opt/ml`` added; without, seeing the host as the gateway's
user does. No ``bwrap`` fails the job, saying so. The runner itself stays outside: it
fetches and uploads with ``auth.file_roots`` enforced (storage's Filesystems) and
reads what the job wrote through no link.

Guarantees: exactly one ``final`` status line, then exit 0, whatever happened to the
job. A stop (SIGTERM to the runner) or ``MaxRuntimeInSeconds`` sends SIGTERM to the
command's process group, SIGKILL after ``stop_grace_s``, and ends ``Stopped`` as soon as
its processes are gone; Failed and Stopped jobs upload nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from shipyard.backends.process_groups import group_lives
from shipyard.backends.sandbox import Sandbox, with_opt_ml
from shipyard.errors import ArtifactError, ClientError, SandboxUnavailable
from shipyard.job_contract import (
    LOG_FILE,
    RUNNER_PID_FILE,
    SCRIPT_PID_FILE,
    STATUS_FILE,
    Outcome,
    StatusLine,
    append_status,
    open_beneath,
)
from shipyard.jobs.runner import lock_pid_file
from shipyard.jobs.script_io import JobLog
from shipyard.processing.spec import (
    EXIT_MESSAGE_BYTES,
    MESSAGE_FILE,
    PROCESSING_FILE,
    Input,
    ProcessingSpec,
    below_opt_ml,
)
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.filesystems import FileRoots, Filesystems

log = logging.getLogger(__name__)

POLL_PERIOD_S = 0.1
STDERR_TAIL_LINES = 20
READER_JOIN_TIMEOUT_S = 5.0
FAILURE_REASON_MAX_CHARS = 1024


@dataclass(frozen=True, slots=True)
class _Run:
    exit_code: int
    halted: str | None
    """``stop`` or ``max_runtime`` when the runner ended the command, else None."""
    stderr_tail: list[str]


class ProcessingRunner:
    """Runs the job prepared in ``workdir``, from ``processing.json`` to the final line."""

    def __init__(
        self,
        workdir: Path,
        *,
        store: ArtifactStore,
        job_log: JobLog,
        stop: threading.Event,
        sandbox: Callable[[], Sandbox] | None = None,
        environ: Mapping[str, str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.workdir = workdir
        self.root = workdir / "ml"
        """The job's ``/opt/ml``."""
        self._store = store
        self._log = job_log
        self._stop = stop
        self._sandbox = sandbox
        """Builds the gateway's sandbox (``auth:``); None: the host as it is."""
        self._environ = environ
        self._clock = clock

    def __repr__(self) -> str:
        return f"ProcessingRunner(workdir={str(self.workdir)!r})"

    def run(self) -> Outcome:
        """Run the job and write its final status line; never raises for the job's sake."""
        self._status("Starting", "Preparing the instances for processing")
        try:
            outcome = self._run()
        except Exception as exc:  # the gateway must see an end, whatever went wrong here
            log.exception("the processing runner failed in %s", self.workdir)
            outcome = _failed(f"InternalServerError: {type(exc).__name__}: {exc}")
        if outcome.failure_reason:
            self._log.note(f"Failure reason: {outcome.failure_reason}")
        self._status(outcome.status, f"Processing job {outcome.status.lower()}", final=outcome)
        return outcome

    def _run(self) -> Outcome:
        try:
            spec = ProcessingSpec.from_json((self.workdir / PROCESSING_FILE).read_bytes())
        except (OSError, ValueError) as exc:
            return _failed(f"ClientError: Could not read the job's {PROCESSING_FILE}: {exc}")
        try:
            self._status("Downloading", "Downloading input data")
            self._prepare(spec)
            if self._halt_reason(spec) is not None:
                return Outcome(status="Stopped")
            argv = self._argv(spec)
            self._status("Processing", "Processing in progress")
            run = self._execute(spec, argv)
        except (ArtifactError, ClientError, OSError, SandboxUnavailable) as exc:
            return _failed(f"ClientError: {exc}")
        if run.halted is not None:
            return Outcome(status="Stopped", exit_code=run.exit_code)
        if run.exit_code != 0:
            failed = _failed(_failure_reason(run), exit_code=run.exit_code)
            return replace(failed, model_artifacts=self._exit_message())
        self._status("Uploading", "Uploading output data")
        try:
            self._upload(spec)
        except (ArtifactError, OSError) as exc:
            return _failed(f"ClientError: {exc}", exit_code=0)
        return Outcome(status="Completed", model_artifacts=self._exit_message(), exit_code=0)

    def _prepare(self, spec: ProcessingSpec) -> None:
        """Make the tree, write the job's config, fetch its inputs."""
        config = self.root / "config"
        for folder in (config, self.root / "output"):
            folder.mkdir(parents=True, exist_ok=True)
        for output in spec.outputs:
            self._local(output.local_path).mkdir(parents=True, exist_ok=True)
        (config / "processingjobconfig.json").write_text(json.dumps(spec.config, indent=1))
        for item in spec.inputs:
            count = self._fetch(item)
            self._log.note(f"Input '{item.name}': {count} file(s) from {item.uri}")

    def _fetch(self, item: Input) -> int:
        dest = self._local(item.local_path)
        what = f"input '{item.name}'"
        if item.data_type != "ManifestFile":
            return self._store.download(item.uri, dest, what=what, missing_ok=item.missing_ok)
        staging = self.workdir / "manifest" / item.name
        self._store.download(item.uri, staging, what=f"the manifest of {what}")
        manifest = next(p for p in staging.iterdir() if p.is_file())
        entries = json.loads(manifest.read_text())
        if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
            raise ClientError(f"The manifest of {what} is not [{{'prefix': p}}, key, ...].")
        prefix = str(entries[0].get("prefix", ""))
        count = 0
        for key in entries[1:]:
            relative = below_opt_ml(f"{item.local_path}/{key}")
            if relative is None:
                raise ClientError(f"The manifest of {what} names {key!r}, outside its path.")
            target = self.root / relative
            self._store.download(prefix + str(key), target.parent, what=what)
            count += 1
        return count

    def _local(self, local_path: str) -> Path:
        relative = below_opt_ml(local_path)
        if relative is None:  # the gateway refused it already; a hand-made file is not run
            raise ClientError(f"LocalPath {local_path} is not under /opt/ml/processing/.")
        return self.root / relative

    def _argv(self, spec: ProcessingSpec) -> list[str]:
        if self._sandbox is not None:
            return self._sandbox().wrap(
                spec.command, chdir=Path("/"), opt_ml=self.root, die_with_parent=False
            )
        bwrap = shutil.which("bwrap", path=self._environ.get("PATH") or os.defpath)
        if bwrap is None:
            raise ClientError(
                "a processing job sees its files at /opt/ml through bubblewrap, and bwrap "
                "is not installed on the gateway's host (apt-get install bubblewrap)"
            )
        return with_opt_ml(bwrap, spec.command, opt_ml=self.root, chdir=Path("/"))

    def _execute(self, spec: ProcessingSpec, argv: list[str]) -> _Run:
        """Run the command to its end, or stop it; leave nothing of it running."""
        process = subprocess.Popen(
            argv,
            cwd=self.root,
            env=dict(spec.environment),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its group is its PID: a stop reaches all of it
        )
        assert process.stdout is not None and process.stderr is not None
        partial = self.workdir / f".{SCRIPT_PID_FILE}"
        partial.write_text(f"{process.pid}\n")
        partial.replace(self.workdir / SCRIPT_PID_FILE)
        self._log.note(f"Started the job (pid {process.pid}): {' '.join(spec.command)}")
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        readers = [self._log.follow(process.stdout), self._log.follow(process.stderr, tail)]
        try:
            halted = self._supervise(process, spec)
        finally:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
            for reader in readers:
                reader.join(READER_JOIN_TIMEOUT_S)
            (self.workdir / SCRIPT_PID_FILE).unlink(missing_ok=True)
        self._log.note(f"The job's command exited with code {process.returncode}")
        return _Run(process.returncode, halted, list(tail))

    def _supervise(self, process: subprocess.Popen[bytes], spec: ProcessingSpec) -> str | None:
        while True:
            try:
                process.wait(timeout=POLL_PERIOD_S)
                return None
            except subprocess.TimeoutExpired:
                pass
            halted = self._halt_reason(spec)
            if halted is None:
                continue
            why = "MaxRuntimeInSeconds reached" if halted == "max_runtime" else "asked to stop"
            self._status("Stopping", f"Stopping the processing job: {why}")
            self._end(process, spec.stop_grace_s)
            return halted

    def _end(self, process: subprocess.Popen[bytes], grace_s: float) -> None:
        """SIGTERM to the group; SIGKILL once ``grace_s`` has passed with any of it left.

        bwrap dies of the SIGTERM at once, so the group, not bwrap, says when the job's
        own processes have ended."""
        self._log.note(f"Sending SIGTERM to the job; SIGKILL after {grace_s:g} s")
        _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            process.poll()  # reaped, or bwrap's zombie would count as the group's
            if not group_lives(process.pid):
                return
            time.sleep(POLL_PERIOD_S)
        self._log.note(f"The job still ran after {grace_s:g} s; sending SIGKILL")
        _signal_group(process.pid, signal.SIGKILL)

    def _halt_reason(self, spec: ProcessingSpec) -> str | None:
        if self._stop.is_set():
            return "stop"
        if spec.max_runtime_s is not None and self._clock() >= spec.started_at + spec.max_runtime_s:
            return "max_runtime"
        return None

    def _upload(self, spec: ProcessingSpec) -> None:
        for output in spec.outputs:
            folder = self._local(output.local_path)
            # Through no link: the job wrote this folder, and a link there must not
            # send a file of the host.
            sent = self._store.sync_up(folder, output.uri, root=self.root)
            self._log.note(f"Output '{output.name}': {len(sent)} file(s) to {output.uri}")

    def _exit_message(self) -> str | None:
        with contextlib.suppress(OSError, ValueError), open_beneath(self.root, MESSAGE_FILE) as f:
            return f.read(EXIT_MESSAGE_BYTES).decode(errors="replace")
        return None

    def _status(self, secondary: str, message: str, *, final: Outcome | None = None) -> None:
        line = StatusLine(secondary=secondary, time=self._clock(), message=message, final=final)
        append_status(self.workdir / STATUS_FILE, line)
        self._log.note(message)


def _failed(reason: str, *, exit_code: int | None = None) -> Outcome:
    return Outcome(
        status="Failed", failure_reason=reason[:FAILURE_REASON_MAX_CHARS], exit_code=exit_code
    )


def _failure_reason(run: _Run) -> str:
    """``AlgorithmError: ExitCode <n>`` and stderr's tail, trimmed from its start."""
    head = f"AlgorithmError: ExitCode {run.exit_code}"
    tail = "\n".join(run.stderr_tail).strip()
    if not tail:
        return head
    room = FAILURE_REASON_MAX_CHARS - len(head) - 2
    if len(tail) > room:
        tail = "..." + tail[len(tail) - room + 3 :]
    return f"{head}: {tail}"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shipyard.processing.runner")
    parser.add_argument("workdir", type=Path, help="the job's folder, with processing.json")
    parser.add_argument("--s3-endpoint-url", help="an S3-compatible endpoint instead of AWS")
    parser.add_argument(
        "--file-roots",
        type=json.loads,
        help="auth.file_roots as a JSON list: the job runs in the gateway's sandbox, and "
        "the runner's own opens outside them are refused",
    )
    parser.add_argument(
        "--hidden", type=json.loads, default=[], help="folders never shown nor opened"
    )
    return parser.parse_args(argv)


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
    environ = dict(os.environ)
    roots = None if args.file_roots is None else FileRoots(args.file_roots, hidden=args.hidden)
    sandbox = None
    if args.file_roots is not None:

        def sandbox() -> Sandbox:
            return Sandbox.create(
                file_roots=[Path(r) for r in args.file_roots],
                hidden=[Path(h) for h in args.hidden],
                environ=environ,
            )

    with pid_file, contextlib.closing(JobLog(workdir / LOG_FILE)) as job_log:
        store = ArtifactStore(
            filesystems=Filesystems(s3_endpoint_url=args.s3_endpoint_url, file_roots=roots)
        )
        ProcessingRunner(
            workdir, store=store, job_log=job_log, stop=stop, sandbox=sandbox, environ=environ
        ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
