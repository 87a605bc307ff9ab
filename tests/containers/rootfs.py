"""The container tests' base root filesystem: Debian bookworm with Python, made once with
``debootstrap`` and cached between runs (under ``$XDG_CACHE_HOME/shipyard-tests``).

    python -m tests.containers.rootfs

``make test`` runs this before the tests: debootstrap takes minutes on a slow machine,
more than a test's timeout, so the tests' fixture (conftest.py) should find it made. It
prints why it could not make it (no debootstrap, no mirror), and exits 0 either way: the
tests skip with the same reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shipyard-tests"
ROOTFS = CACHE / "rootfs-bookworm-python3.tar"
MIRROR = "http://deb.debian.org/debian"


def make() -> Path | str:
    """The root filesystem as a tar file, made once (under a lock, so parallel runs make
    it once); or why it could not be made."""
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "rootfs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ROOTFS.exists():
            return ROOTFS
        target = CACHE / "rootfs.partial"
        _remove(target)
        made = subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3", "bookworm", target, MIRROR],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            _remove(target)
            said = (made.stdout + made.stderr)[-500:]
            return f"debootstrap could not make the base image: {said}"
        partial = ROOTFS.with_suffix(".partial.tar")
        subprocess.run(["tar", "-C", target, "-cf", partial, "."], check=True)
        partial.replace(ROOTFS)
        _remove(target)
        return ROOTFS


def _remove(target: Path) -> None:
    """Remove a debootstrap folder, unmounting first what a debootstrap stopped halfway
    left mounted in it (its ``proc``): otherwise the folder cannot be removed, and the
    next debootstrap fails on it."""
    inside = str(target) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(inside)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    shutil.rmtree(target, ignore_errors=True)


def main() -> None:
    made = make()
    if isinstance(made, Path):
        print(f"container tests' base image: {made}")
    else:
        print(f"container tests' base image not made ({made}): those tests will skip")
    sys.exit(0)


if __name__ == "__main__":
    main()
