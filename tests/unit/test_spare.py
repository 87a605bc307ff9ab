"""Warm spares: which instances a spare can become (variables read at import must match),
what it preloads, and the imports instances record for the next spares."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shipyard import autogroup
from shipyard.backends.process_groups import start_instance
from shipyard.runtime import spare
from shipyard.runtime.spare import IMPORTS_FILE, can_become, record_imports
from tests.conftest import needs_autogroups, wait_until

pytestmark = pytest.mark.processes  # starts spare runtimes that become instances

SPARE = {"PATH": "/usr/bin", "HOME": "/run/home/_spare", "OMP_NUM_THREADS": "2"}


def test_variables_read_later_are_taken_on() -> None:
    instance = {**SPARE, "HOME": "/run/home/i-1", "GREETING": "hi", "SAGEMAKER_BATCH": "true"}
    assert can_become(SPARE, instance)


def test_a_variable_read_at_import_must_keep_the_spares_value() -> None:
    assert not can_become(SPARE, {**SPARE, "OMP_NUM_THREADS": "1"})
    assert not can_become(SPARE, {k: v for k, v in SPARE.items() if k != "OMP_NUM_THREADS"})
    assert not can_become(SPARE, {**SPARE, "PYTHONHASHSEED": "0"})
    assert not can_become(SPARE, {**SPARE, "TORCH_HOME": "/models"})


def test_pythonpath_is_taken_on() -> None:
    assert can_become(SPARE, {**SPARE, "PYTHONPATH": "/opt/ml/model/code"})


def test_preloading_freezes_what_the_imports_made(tmp_path: Path) -> None:
    # In a process of its own: freezing the test process's heap would outlive the test.
    listed = tmp_path / "imports"
    listed.write_text("fractions\nno.such.module\n")
    probe = (
        "import gc, sys; from pathlib import Path; from shipyard.runtime import spare; "
        "assert 'fractions' not in sys.modules; "
        f"spare.preload(Path({str(listed)!r})); "
        "print('fractions' in sys.modules, gc.get_freeze_count() > 0, gc.isenabled())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True", "True"]


def test_imports_recorded_are_added_to_those_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "code" / "shipyard_test_own_code.py"  # a model's own module
    own.parent.mkdir()
    own.write_text("VALUE = 1\n")
    spec = importlib.util.spec_from_file_location("shipyard_test_own_code", own)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "shipyard_test_own_code", module)
    # A test process may hold more modules than an instance's cap (see the test below).
    monkeypatch.setattr(spare, "_MAX_MODULES", len(sys.modules) + 10)
    recorded = tmp_path / "imports"
    recorded.write_text("recorded.by.an.earlier.instance\njson\n")
    record_imports({IMPORTS_FILE: str(recorded)})
    names = recorded.read_text().split()
    assert names == sorted(names)
    assert "recorded.by.an.earlier.instance" in names  # a union: what was known stays
    assert {"json", "collections", "pytest"} <= set(names)  # the standard library, installed
    assert "shipyard_test_own_code" not in names  # the model's own code is never preloaded
    before = recorded.stat().st_mtime_ns
    record_imports({IMPORTS_FILE: str(recorded)})
    assert recorded.stat().st_mtime_ns == before  # nothing new: not written again


def test_a_full_file_keeps_what_it_knows_and_is_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare, "_MAX_MODULES", 3)
    recorded = tmp_path / "imports"
    recorded.write_text("recorded.by.an.earlier.instance\n")
    record_imports({IMPORTS_FILE: str(recorded)})
    names = recorded.read_text().split()
    assert len(names) == 3 and "recorded.by.an.earlier.instance" in names  # filled to the cap
    before = recorded.stat().st_mtime_ns
    record_imports({IMPORTS_FILE: str(recorded)})  # other modules are new, but none fit
    assert recorded.stat().st_mtime_ns == before
    assert recorded.read_text().split() == names


@needs_autogroups
def test_a_spare_given_work_inside_a_long_import_takes_its_share_back_before_it_ends(
    tmp_path: Path,
) -> None:
    # The spare preloads a module that takes seconds to import; the work comes in the
    # middle of it, and the group is back at nice 0 while that import still runs.
    started, done = tmp_path / "started", tmp_path / "done"
    (tmp_path / "slow_import.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(6)\n"
        f"pathlib.Path({str(done)!r}).touch()\n"
    )
    imports = tmp_path / "imports.txt"
    imports.write_text("slow_import\n")
    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-m", "shipyard.runtime", "--spare", "--preload-file", str(imports)],
        stdin=theirs.fileno(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
        start_new_session=True,
    )
    theirs.close()
    try:
        wait_until(started.exists, "the slow import begun")
        wait_until(lambda: autogroup.nice(child.pid) == spare.WAITING_NICE, "the spare lowered")
        work = {"argv": ["--port", "0"], "environ": {}, "cwd": str(tmp_path), "log": None}
        ours.sendall(json.dumps(work).encode() + b"\n")
        wait_until(lambda: autogroup.nice(child.pid) == 0, "the spare's share back", 3)
        assert not done.exists()  # still inside the import
    finally:
        ours.close()
        child.kill()
        child.wait()


@needs_autogroups
def test_an_instance_started_lower_has_its_session_group_lowered() -> None:
    # Its own nice value would rank it only among its session's processes.
    child = subprocess.run(
        ["cat", "/proc/self/autogroup"],
        start_new_session=True,
        preexec_fn=functools.partial(start_instance, os.getpid(), 10),
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.split()[-2:] == ["nice", "10"]


def test_a_refused_change_is_tried_again_until_its_patience_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The kernel refuses a change within 0.1 s of another (EAGAIN), host-wide.
    writes: list[bytes] = []
    refusals = iter([True, True, False])

    def write(fd: int, data: bytes) -> int:
        writes.append(data)
        if next(refusals, False):
            raise BlockingIOError
        return len(data)

    real_open = os.open
    monkeypatch.setattr(autogroup.os, "open", lambda path, flags: real_open(os.devnull, flags))
    monkeypatch.setattr(autogroup.os, "write", write)
    assert autogroup.set_nice("self", 19, 5.0)
    assert writes == [b"19"] * 3
    writes.clear()
    refusals = iter([True] * 1000)
    before = time.monotonic()
    assert not autogroup.set_nice(1234, 0, 0.0)  # one try, and no wait
    assert writes == [b"0"] and time.monotonic() - before < 0.005
