"""The runner beside a training container holds its own writes to ``auth.file_roots``
as the gateway does: the gateway's home is refused even when it lies under a root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard.errors import OutsideFileRoots
from shipyard.jobs.runner import _arguments, _file_roots
from shipyard.storage.filesystems import Filesystems


def test_the_runner_refuses_the_gateways_home_under_a_file_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    home = root / "home"  # the gateway's home, inside the operator's file root
    (home / "run").mkdir(parents=True)
    (root / "out").mkdir()
    # A link that exists when the upload starts, from the output folder into the home.
    (root / "out" / "job").symlink_to(home / "run")
    args = _arguments(
        [
            str(tmp_path / "work"),
            "--file-roots",
            json.dumps([str(root)]),
            "--hidden",
            json.dumps([str(home)]),
        ]
    )
    roots = _file_roots(args)
    assert roots is not None and roots.hidden == (home.resolve(),)
    fs = Filesystems(file_roots=roots)

    with pytest.raises(OutsideFileRoots, match="inside the gateway's home"):
        fs.local_target(f"file://{root}/out/job/model.tar.gz")
    with pytest.raises(OutsideFileRoots, match="inside the gateway's home"):
        fs.local_target(f"file://{home}/shipyard.db")
    # Elsewhere under the root is written as before.
    assert fs.local_target(f"file://{root}/out/other/model.tar.gz") is not None


def test_a_runner_without_file_roots_is_held_by_its_sandbox_not_by_roots() -> None:
    assert _file_roots(_arguments(["/tmp/work"])) is None
