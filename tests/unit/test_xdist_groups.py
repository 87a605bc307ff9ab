"""The suite's scheduling holds: under ``make test``'s options, a module's tests share
one xdist worker, and so do the tests of one ``xdist_group`` across modules.

pytest 9.2 silently undid xdist's groups (pytest-xdist#1386): every module-scoped
gateway and the container engine were started once per worker instead of once. This
runs a scratch suite of three modules the way ``make test`` runs ours, with this
suite's own grouping (tests/scheduling.py), and counts where each module's fixture was
built.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # a pytest run of its own, on three workers

ROOT = Path(__file__).resolve().parents[2]

MODULE = """
import os
import pytest
{mark}

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILDS"], "a") as out:
        out.write(f"{name} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")

@pytest.mark.parametrize("n", range(6))
def test_one(built, n):
    pass
"""


def test_a_module_and_a_group_each_build_their_fixture_once(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    group = 'pytestmark = pytest.mark.xdist_group("shared")'
    for name, mark in (("alone", ""), ("first", group), ("second", group)):
        (suite / f"test_{name}.py").write_text(MODULE.format(mark=mark, name=name))
    builds = tmp_path / "builds"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.scheduling",
    ]
    argv += ["-n", "3"]
    argv += ["--dist", "loadgroup", "--no-loadscope-reorder", str(suite)]
    run = subprocess.run(
        argv,
        cwd=suite,
        env={"BUILDS": str(builds), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    built = [line.split() for line in builds.read_text().splitlines()]
    by_module: dict[str, list[str]] = {}
    for module, worker in built:
        by_module.setdefault(module, []).append(worker)
    # Each module's fixture once (all its tests on one worker, back to back), and the
    # two modules of the group on the same worker.
    assert {m: len(w) for m, w in by_module.items()} == {"alone": 1, "first": 1, "second": 1}
    assert by_module["first"] == by_module["second"], built
