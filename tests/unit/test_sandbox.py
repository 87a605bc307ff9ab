"""The local backend with a sandbox: what a process inside sees, and how the backend
still stops, watches and cleans up after it when the process it holds is ``bwrap``.

Real bubblewrap, real processes; skipped where bwrap is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from shipyard.backends.base import InstanceSpec
from shipyard.backends.local import LocalBackend, LocalInstance
from shipyard.backends.local_jobs import _record_runner
from shipyard.backends.sandbox import TMP_BYTES, Sandbox
from shipyard.errors import BackendError, SandboxUnavailable
from shipyard.job_contract import Checkpoint, JobSpec
from shipyard.routing.model_agent import MODELS_FOLDER
from tests.conftest import wait_until

pytestmark = [
    pytest.mark.skipif(
        shutil.which("bwrap") is None,
        reason="bubblewrap (bwrap) is not installed; make install-dev installs it",
    ),
    pytest.mark.processes,  # starts sandboxed instances and job runners
]


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    (tmp_path / "root").mkdir()
    (tmp_path / "home" / "shared").mkdir(parents=True)
    roots = [tmp_path / "root", tmp_path, tmp_path / "home" / "shared"]
    return Sandbox.create(file_roots=roots, hidden=[tmp_path / "home"], environ=os.environ)


@pytest.fixture
def backend(tmp_path: Path, sandbox: Sandbox) -> Iterator[LocalBackend]:
    backend = LocalBackend(run_dir=tmp_path / "home" / "run", sandbox=sandbox)
    yield backend
    backend.close()


def run(sandbox: Sandbox, script: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    argv = sandbox.wrap(["/bin/sh", "-c", script], chdir=Path("/"), **kwargs)  # type: ignore[arg-type]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def in_group(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (a zombie bwrap waiting for init is dead)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except (OSError, psutil.Error):
            continue
    return found


def test_the_home_is_hidden_even_under_a_root_but_a_process_gets_its_own_folders(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    home = tmp_path / "home"
    (home / "mine").mkdir(parents=True)
    (home / "store.db").write_text("secret")
    (tmp_path / "root" / "data.txt").write_text("granted\n")
    (home / "shared" / "data.txt").write_text("also granted\n")
    done = run(
        sandbox,
        f"cat {tmp_path}/root/data.txt {home}/shared/data.txt; cat {home}/store.db; "
        f"echo made > {home}/mine/out; touch /usr/x; id -u",
        writable=[home / "mine"],
    )
    assert "granted" in done.stdout
    assert "also granted" in done.stdout, "a root inside the home is shown all the same"
    assert "secret" not in done.stdout
    assert (home / "mine" / "out").read_text() == "made\n"
    assert "Read-only file system" in done.stderr
    assert done.stdout.split()[-1] == "65534"


def test_a_sandbox_that_cannot_run_says_how_to_turn_it_off(tmp_path: Path) -> None:
    broken = Sandbox(bwrap="/bin/false", python=(), file_roots=(), hidden=())
    with pytest.raises(SandboxUnavailable, match="auth.sandbox: false"):
        broken.check()
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox.create(file_roots=[], hidden=[], environ={"PATH": str(tmp_path)})


def test_a_sandboxed_instance_is_watched_and_stopped_politely(backend: LocalBackend) -> None:
    """stop() sends SIGTERM to the process inside (bwrap would die of it at once, and
    SIGKILL the sandbox), so a server's handler runs; nothing of it is left."""
    trap = "trap 'echo stopped; exit 0' TERM; while :; do sleep 0.05; done"
    log = backend.run_dir.parent / "i-1.log"

    async def main() -> None:
        handle = await backend.start(InstanceSpec("i-1", f"cmd:{trap}", log_path=log))
        assert isinstance(handle, LocalInstance) and handle.sandboxed
        assert psutil.Process(handle.process.pid).name() == "bwrap"
        assert backend.exit_reason(handle) is None
        assert (backend.memory_bytes(handle) or 0) > 0
        await asyncio.sleep(0.5)  # the shell has set its trap
        await backend.stop(handle, timeout_s=10)
        assert handle.process.returncode == 0
        # bwrap exits as its init reports the code, a moment before that init is gone.
        wait_until(lambda: in_group(handle.process.pid) == [], "the sandbox's end", 5)

    asyncio.run(main())
    assert "stopped" in log.read_text().splitlines()  # its handler ran
    assert not (backend.run_dir / "home" / "i-1").exists()  # and its $HOME went with it


def test_a_sandboxed_instance_reports_its_exit(backend: LocalBackend) -> None:
    async def main() -> None:
        handle = await backend.start(InstanceSpec("i-2", "cmd:exit 3"))
        assert isinstance(handle, LocalInstance)
        await asyncio.to_thread(handle.process.wait, 10)
        assert backend.exit_reason(handle) == "the process exited with code 3"
        await backend.stop(handle)

    asyncio.run(main())


def test_a_model_that_cannot_be_fetched_fails_the_start(backend: LocalBackend) -> None:
    spec = InstanceSpec("i-3", "shipyard/python", model_url="file:///nowhere/model.tar.gz")
    with pytest.raises(BackendError, match="i-3 failed to start: ArtifactError"):
        asyncio.run(backend.start(spec))


def test_an_earlier_gateways_sandboxed_instance_is_stopped_whole(backend: LocalBackend) -> None:
    handle = asyncio.run(backend.start(InstanceSpec("i-4", "cmd:sleep 60 & sleep 60")))
    assert isinstance(handle, LocalInstance)
    pgid = handle.process.pid
    assert LocalBackend(run_dir=backend.run_dir).stop_leftovers() == [pgid]
    handle.process.wait(10)
    wait_until(lambda: in_group(pgid) == [], "the sandbox's end", 5)


def test_a_sandboxed_runner_is_found_watched_and_signalled_through_its_bwrap(
    tmp_path: Path, sandbox: Sandbox, backend: LocalBackend
) -> None:
    """The runner writes the PID it has inside its sandbox; a restarted gateway finds the
    bwrap running it by the record its start left instead, and a stop reaches the runner."""
    workdir = tmp_path / "home" / "jobs" / "j" / "attempt-1"
    workdir.mkdir(parents=True)
    (workdir / "runner.pid").write_text("2\n")
    # A stand-in with the runner's command line: it sleeps, and dies of SIGTERM.
    process = _stand_in(sandbox, workdir)
    try:
        _record_runner(workdir, process.pid)
        wait_until(lambda: _inside(process.pid), "the runner inside bwrap's init", 5)
        handle = LocalBackend(run_dir=backend.run_dir, sandbox=sandbox).find_job(workdir)
        assert handle is not None and handle.ref == f"local-sandboxed:{process.pid}:{workdir}"
        assert backend.job_running(handle)
        backend.signal_job(handle, signal.SIGTERM)
        # bwrap was not signalled itself: it ends with the code of the runner it ran.
        assert process.wait(10) == 128 + signal.SIGTERM
        assert not backend.job_running(handle)
    finally:
        _end(process)


def test_a_process_that_takes_bwraps_name_and_a_runners_command_line_is_not_the_runner(
    tmp_path: Path, sandbox: Sandbox, backend: LocalBackend
) -> None:
    """Any process may call itself bwrap and name a job's folder in its arguments (one
    started inside another job's sandbox, say): the backend trusts only the bwrap it
    recorded at the start, by PID and start time."""
    workdir = tmp_path / "home" / "jobs" / "j" / "attempt-1"
    workdir.mkdir(parents=True)
    (workdir / "runner.pid").write_text("2\n")
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.symlink_to(sys.executable)
    script = "import time; time.sleep(60)"
    forged = subprocess.Popen(
        [str(fake), "-c", script, "shipyard.jobs.runner", str(workdir)], start_new_session=True
    )
    try:
        wait_until(lambda: psutil.Process(forged.pid).name() == "bwrap", "the forged name", 5)
        handle = backend.find_job(workdir)
        assert handle is None or not handle.ref.startswith("local-sandboxed:")
        # Recorded, but with another start time (a PID reused since): not running.
        record = workdir.parent / "attempt-1.sandbox"
        record.write_text(json.dumps({"pid": forged.pid, "started": 1.0}))
        handle = backend.find_job(workdir)
        assert handle is not None and handle.ref == f"local-sandboxed:{forged.pid}:{workdir}"
        assert not backend.job_running(handle)
        backend.kill_job(handle)
        assert forged.poll() is None, "a process that is not the runner is not killed"
    finally:
        _end(forged)


def test_roots_are_read_only_and_a_read_only_folder_stays_so_inside_a_writable_one(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """Every root is read-only in every sandbox (one model must not overwrite another's
    files, nor a virtual environment or stack file that lies under a root); and a bind
    that comes later wins, so a read-only folder inside a writable one stays read-only."""
    root = tmp_path / "root"
    (root / "models").mkdir()
    (root / "models" / "theirs.txt").write_text("theirs\n")
    (root / "mine" / "kept").mkdir(parents=True)
    done = run(
        sandbox,
        f"echo mine > {root}/models/theirs.txt; touch {root}/new; "
        f"echo ok > {root}/mine/out && echo wrote; touch {root}/mine/kept/x",
        writable=[root / "mine"],
        readonly=[root / "mine" / "kept"],
    )
    assert "wrote" in done.stdout, done.stderr
    assert (root / "models" / "theirs.txt").read_text() == "theirs\n"
    assert not (root / "new").exists()
    assert not (root / "mine" / "kept" / "x").exists()
    assert done.stderr.count("Read-only file system") == 3, done.stderr


def test_a_granted_folder_is_made_under_a_root_and_written_and_nothing_else_is(
    tmp_path: Path,
) -> None:
    root, home = tmp_path / "root", tmp_path / "root" / "home"
    (home / "store").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    sandbox = Sandbox.create(file_roots=[root], hidden=[home], environ=os.environ)
    out = root / "out" / "job" / "output"
    fd = sandbox.grant(out)
    try:
        argv = sandbox.wrap(
            ["/bin/sh", "-c", f"echo model > {out}/model.tar.gz; touch {root}/out/x"],
            chdir=Path("/"),
            granted=[(fd, out)],
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, pass_fds=[fd])
    finally:
        os.close(fd)
    assert (out / "model.tar.gz").read_text() == "model\n"
    assert not (root / "out" / "x").exists(), "only the granted folder is writable"
    for refused, why in [
        (tmp_path / "outside" / "x", "outside auth.file_roots"),
        (root / "link" / "x", "outside auth.file_roots"),
        (root, "overlaps"),  # it holds the gateway's home
        (home / "store", "overlaps"),
    ]:
        with pytest.raises(ValueError, match=why):
            sandbox.grant(refused)
    assert not (tmp_path / "outside" / "x").exists()
    assert done.returncode != 0 and "Read-only file system" in done.stderr


def test_a_job_may_not_be_granted_the_gateways_home(tmp_path: Path, backend: LocalBackend) -> None:
    workdir = tmp_path / "home" / "jobs" / "j" / "attempt-1"
    workdir.mkdir(parents=True)
    spec = JobSpec(
        name="j",
        arn="arn:aws:sagemaker:us-east-1:123456789012:training-job/j",
        image="shipyard/python",
        output_path=(tmp_path / "root" / "out").as_uri(),
        started_at=0.0,
        checkpoint=Checkpoint(uri=str(tmp_path / "home" / "run")),
    )
    (workdir / "job.json").write_text(spec.to_json())
    with pytest.raises(BackendError, match="may not write .*overlaps"):
        asyncio.run(backend.start_job(workdir, s3_endpoint_url=None))
    assert not (workdir / "runner.log").exists(), "no runner was started"


def test_a_multi_model_server_cannot_replace_the_folder_the_gateway_fetches_into(
    tmp_path: Path, backend: LocalBackend
) -> None:
    """A cmd: multi-model server's own folder is writable, but the gateway fetches its
    models into ``.models`` there and deletes them (routing/model_agent.py): a link put
    in its place would lead the gateway's writes out, so it is read-only inside."""
    scratch = tmp_path / "home" / "instances" / "i-6"
    scratch.mkdir(parents=True)
    target = tmp_path / "home" / "elsewhere"
    target.mkdir()
    script = (
        f"mv {MODELS_FOLDER} moved; rm -rf {MODELS_FOLDER}; ln -s {target} {MODELS_FOLDER}; "
        f"touch {MODELS_FOLDER}/planted; echo done > $HOME/done; sleep 60"
    )

    async def main() -> None:
        handle = await backend.start(InstanceSpec("i-6", f"cmd:{script}", workdir=scratch))
        done = backend.run_dir / "home" / "i-6" / "done"
        await asyncio.to_thread(wait_until, done.exists, "the server's attempts", 10)
        await backend.stop(handle)

    asyncio.run(main())
    models = scratch / MODELS_FOLDER
    assert models.is_dir() and not models.is_symlink()
    assert list(models.iterdir()) == []
    assert list(target.iterdir()) == []


def _stand_in(sandbox: Sandbox, workdir: Path) -> subprocess.Popen[bytes]:
    """A sandboxed process with a runner's command line: it sleeps, and dies of SIGTERM."""
    script = "import time; time.sleep(60)"
    argv = [sys.executable, "-c", script, "shipyard.jobs.runner", str(workdir)]
    wrapped = sandbox.wrap(argv, chdir=workdir, writable=[workdir], die_with_parent=False)
    return subprocess.Popen(wrapped, start_new_session=True)


def _inside(pid: int) -> list[psutil.Process]:
    """The processes bwrap ``pid``'s init runs (none until the command has started)."""
    return [child for init in psutil.Process(pid).children() for child in init.children()]


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_sandbox_on_bubblewrap_0_8_bounds_tmp_and_refuses_nested_namespaces(
    sandbox: Sandbox,
) -> None:
    """A tmpfs is memory no process's size shows; a nested user namespace is kernel
    surface. Where bubblewrap can (0.8), both are fenced."""
    version = subprocess.run([sandbox.bwrap, "--version"], capture_output=True, text=True)
    if tuple(int(n) for n in version.stdout.split()[-1].split(".")[:2]) < (0, 8):
        assert not sandbox.hardened  # an older one runs without both, as it can
        return
    assert sandbox.hardened
    size = run(sandbox, "df -B1 --output=size /tmp | tail -1")
    assert size.returncode == 0 and int(size.stdout) == TMP_BYTES, size
    nested = run(sandbox, "unshare --user true")
    assert nested.returncode != 0, nested
