"""A gateway's start: ``shipyard serve`` launched -> first 200 from ``/healthz``.

    .venv/bin/python bench/gateway_start.py            # N=7 rounds, this tree only
    REF=4a70ec3 .venv/bin/python bench/gateway_start.py  # and a reference commit, interleaved
    RESTART=1 .venv/bin/python bench/gateway_start.py    # a second start on the same home

Each round starts a gateway on a fresh home (an empty SQLite store, as every test's
gateway and a first ``make run`` have), waits for ``/healthz``, reads the process's CPU
time (user + system, every thread) from ``/proc`` and stops it by its PID. With ``REF``
the commit is checked out in a temporary worktree and run by the same interpreter with
its ``src`` first on ``PYTHONPATH`` (this venv's editable install is a plain path entry,
so the reference's modules win), the two alternating round by round.

CPU time is the figure to compare: the suite starts hundreds of gateways on two cores,
and a busy machine stretches the wall time of each start but not its CPU.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    ServerProcess,
    cpu_probe_ms,
    cpu_seconds,
    entry,
    free_port,
    http_status,
    table,
)

ROOT = Path(__file__).resolve().parent.parent


def one_start(src: Path | None) -> tuple[float, float]:
    """(wall s, CPU s) from launch to the first good /healthz (polled every 10 ms); with
    ``RESTART=1``, of a second start on the home the first one made."""
    home = Path(tempfile.mkdtemp(prefix="gw-start-"))
    try:
        if os.environ.get("RESTART") == "1":
            _start(src, home)
        return _start(src, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _start(src: Path | None, home: Path) -> tuple[float, float]:
    url = f"http://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "shipyard", "serve", "--port", url.rsplit(":", 1)[1]]
    argv += ["--home", str(home / "home")]
    env = {} if src is None else {"PYTHONPATH": str(src)}
    started = time.monotonic()
    gateway = ServerProcess.start("gateway", argv, home / "gateway.log", env)
    try:
        while http_status(url + "/healthz") != 200:
            if not gateway.alive():
                raise RuntimeError(f"gateway exited early:\n{gateway.log_tail()}")
            time.sleep(0.01)
        return time.monotonic() - started, cpu_seconds(gateway.process.pid)
    finally:
        gateway.stop()


def main() -> int:
    rounds = int(os.environ.get("N", "7"))
    ref = os.environ.get("REF")
    trees: dict[str, Path | None] = {"this tree": None}
    worktree = None
    if ref:
        worktree = Path(tempfile.mkdtemp(prefix="gw-start-ref-")) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(worktree), ref],
            check=True,
        )
        trees = {ref: worktree / "src", "this tree": None}
    probe_before = cpu_probe_ms()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    try:
        for src in trees.values():
            one_start(src)  # warm the page cache and the bytecode of each tree
        for _ in range(rounds):
            for name, src in trees.items():
                samples[name].append(one_start(src))
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                check=False,
            )
    probe_after = cpu_probe_ms()
    base = statistics.median(c for _, c in samples[next(iter(trees))])
    rows = []
    for name, runs in samples.items():
        cpu = statistics.median(c for _, c in runs)
        wall = statistics.median(w for w, _ in runs)
        rows.append(
            [
                name,
                f"{wall:.2f}",
                f"{cpu:.2f}",
                f"{min(c for _, c in runs):.2f}-{max(c for _, c in runs):.2f}",
                f"{cpu / base:.2f}",
            ]
        )
    kind = " (restarts on a home a first start made)" if os.environ.get("RESTART") == "1" else ""
    probes = f"CPU probe {probe_before:.1f} ms before / {probe_after:.1f} ms after"
    print(f"{rounds} rounds{kind}, {probes}")
    print(table(["tree", "wall s (median)", "CPU s (median)", "CPU s range", "CPU vs first"], rows))
    return 0


if __name__ == "__main__":
    entry(main)
