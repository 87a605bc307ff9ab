"""launch.py: a framework model's submit directory and its opt-in requirements."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shipyard import launch


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel, built by hand: pip installs it without any index."""
    path = folder / "shipyard_demo_pkg-0.1-py3-none-any.whl"
    info = "shipyard_demo_pkg-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("shipyard_demo_pkg/__init__.py", "ANSWER = 42\n")
        wheel.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: shipyard-demo-pkg\nVersion: 0.1\n"
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_the_models_own_code_folder_is_not_fetched(tmp_path: Path) -> None:
    assert launch.code_folder("/opt/ml/model/code", tmp_path) is None
    assert launch.code_folder(None, tmp_path) is None


def test_a_submit_directory_folder_is_fetched_into_the_cache(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "inference.py").write_text("x = 1\n")
    fetched = launch.code_folder(source.as_uri(), tmp_path / "cache")
    assert fetched is not None and (fetched / "inference.py").read_text() == "x = 1\n"
    assert fetched.parent == tmp_path / "cache"


@pytest.mark.processes  # pip, and an interpreter that imports what it installed
def test_requirements_are_installed_beside_the_code_once(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text(f"{_wheel(tmp_path).as_uri()}\n")
    target = launch.install_requirements(code)
    assert target is not None and (target / "shipyard_demo_pkg" / "__init__.py").exists()
    answer = subprocess.run(
        [sys.executable, "-c", "import shipyard_demo_pkg; print(shipyard_demo_pkg.ANSWER)"],
        env={"PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert answer.stdout.strip() == "42"
    (target / "shipyard_demo_pkg" / "__init__.py").write_text("ANSWER = 0\n")
    assert launch.install_requirements(code) == target  # done once: not installed again
    assert (target / "shipyard_demo_pkg" / "__init__.py").read_text() == "ANSWER = 0\n"


def test_no_requirements_file_installs_nothing(tmp_path: Path) -> None:
    assert launch.install_requirements(tmp_path) is None
