"""The local backend's view of processes it did not start itself, found through psutil.

A gateway that restarts finds its job runners and its instances' leftovers again from
what it recorded (a handle's ``ref``, a PID file), and must not mistake a process that
merely got a recorded PID for one of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from shipyard.backends.base import JobHandle
from shipyard.backends.local import LocalBackend

pytestmark = pytest.mark.processes  # starts instances and job runners

SLEEP = "import time; time.sleep(60)"

Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts sleeping processes, each leading its own session; kills them all by PID."""
    started: list[subprocess.Popen[bytes]] = []

    def create(
        *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-c", SLEEP, *args],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        started.append(process)
        return process

    yield create
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def wait_exited(process: subprocess.Popen[bytes], timeout_s: float = 10) -> int | None:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def untouched(process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` was not killed: it still dies of the SIGTERM sent now (once
    SIGKILLed, a process reports that whatever it is sent afterwards)."""
    process.terminate()
    return wait_exited(process) == -signal.SIGTERM


def ended(process: psutil.Process, timeout_s: float = 10) -> bool:
    """Whether ``process`` (not our child: its exit code is not ours to read) ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_restarted_gateway_finds_a_runner_by_its_ref_alone(tmp_path: Path, start: Start) -> None:
    """The runner was started by an earlier gateway: this backend never saw it start, and
    knows it from the ref the store kept."""
    workdir = tmp_path / "jobs" / "j" / "attempt-1"
    workdir.mkdir(parents=True)
    runner = start(str(workdir))
    backend = LocalBackend(run_dir=tmp_path / "run")
    handle = backend.attach_job(f"local:{runner.pid}:{workdir}")
    deadline = time.monotonic() + 10
    while not backend.job_running(handle) and time.monotonic() < deadline:
        time.sleep(0.05)  # its command line reads empty until its exec is done
    assert backend.job_running(handle)

    backend.signal_job(handle, signal.SIGTERM)
    assert wait_exited(runner) == -signal.SIGTERM
    assert not backend.job_running(handle)


def test_a_reused_pid_is_not_taken_for_the_runner(tmp_path: Path, start: Start) -> None:
    """The recorded PID now belongs to a process of another job's folder."""
    other = start(str(tmp_path / "jobs" / "other" / "attempt-1"))
    backend = LocalBackend(run_dir=tmp_path / "run")
    handle = backend.attach_job(f"local:{other.pid}:{tmp_path / 'jobs' / 'j' / 'attempt-1'}")
    assert not backend.job_running(handle)
    backend.signal_job(handle, signal.SIGTERM)
    backend.kill_job(handle)
    assert untouched(other)


def test_a_ref_from_another_backend_is_refused(tmp_path: Path) -> None:
    backend = LocalBackend(run_dir=tmp_path / "run")
    for ref in ("ray:actor-1", "local:x:/tmp/j", "local:12:"):
        with pytest.raises(ValueError, match="not a local job runner"):
            backend.attach_job(ref)


def test_killing_a_job_stops_its_script_but_not_a_process_that_reused_its_pid(
    tmp_path: Path, start: Start
) -> None:
    workdir = tmp_path / "jobs" / "j" / "attempt-1"
    code = workdir / "ml" / "code"
    code.mkdir(parents=True)
    runner = start(str(workdir))
    script = start(cwd=code)
    (workdir / "script.pid").write_text(f"{script.pid}\n")
    backend = LocalBackend(run_dir=tmp_path / "run")
    handle = JobHandle(f"local:{runner.pid}:{workdir}")
    backend.kill_job(handle)
    assert wait_exited(runner) == -signal.SIGKILL
    assert wait_exited(script) == -signal.SIGKILL

    # Another attempt's folder only shares a prefix with this one's.
    elsewhere = workdir.parent / "attempt-10"
    elsewhere.mkdir()
    stranger = start(cwd=elsewhere)
    (workdir / "script.pid").write_text(f"{stranger.pid}\n")
    backend.kill_job(handle)
    assert untouched(stranger)


def test_leftover_instances_are_found_by_their_pid_file_and_instance_id(
    tmp_path: Path, start: Start
) -> None:
    """What an earlier gateway recorded in ``<run_dir>/<id>.pid`` is stopped with its
    whole group, even once its leader is gone, unless the process with that PID is not
    that instance."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    forked = tmp_path / "forked.pid"
    leader = subprocess.Popen(
        ["/bin/sh", "-c", f'{sys.executable} -c "{SLEEP}" & echo $! > {forked}'],
        env={**os.environ, "SHIPYARD_INSTANCE_ID": "i-1"},
        start_new_session=True,
    )
    leader.wait()
    child = psutil.Process(int(forked.read_text()))
    (run_dir / "i-1.pid").write_text(str(leader.pid))
    stranger = start(env={"SHIPYARD_INSTANCE_ID": "i-9"})
    (run_dir / "i-2.pid").write_text(str(stranger.pid))
    try:
        assert LocalBackend(run_dir=run_dir).stop_leftovers() == [leader.pid]
        assert ended(child)
        assert untouched(stranger)
        assert list(run_dir.glob("*.pid")) == []
    finally:
        if child.is_running():
            child.kill()
