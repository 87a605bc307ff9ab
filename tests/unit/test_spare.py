"""Warm spares: which instances a spare can become (variables read at import must match),
what it preloads, and the imports instances record for the next spares."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from shipyard.runtime import spare
from shipyard.runtime.spare import IMPORTS_FILE, can_become, record_imports

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


@pytest.mark.skipif(
    not Path("/proc/self/autogroup").exists(), reason="the kernel has no autogroups"
)
def test_a_spare_given_work_while_it_imports_takes_its_full_share_back_before_the_rest() -> None:
    # A spare in a session of its own lowers its group's priority; work on its stdin
    # between two imports brings it back at once, not once every import is done.
    code = (
        "import sys, time\n"
        "from shipyard.runtime.spare import _CpuShare\n"
        "def nice(): return open('/proc/self/autogroup').read().split()[-1]\n"
        "share = _CpuShare()\n"
        "print(share.lowered, nice(), flush=True)\n"
        "deadline = time.monotonic() + 30\n"
        "while share.lowered and time.monotonic() < deadline:\n"
        "    share.restore_if_asked()\n"
        "    time.sleep(0.01)\n"
        "print(share.lowered, nice(), flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().split() == [b"True", b"19"]
        child.stdin.write(b'{"argv": []}\n')
        child.stdin.flush()
        assert child.stdout.readline().split() == [b"False", b"0"]
    finally:
        child.kill()
        child.wait()
