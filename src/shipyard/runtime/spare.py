"""Warm spares: runtime processes started ahead of need, with the model's imports done.

A cold start of a built-in instance is mostly Python importing the model's libraries
(numpy, scipy and scikit-learn take over a second here; bench/serverless_cold_start.py).
A spare is ``python -m shipyard.runtime --spare --preload-file F``: it imports the runtime
and every module named in F, then blocks reading one line of JSON from stdin, the work
the backend gives it when an instance must start::

    {"argv": [...], "environ": {...}, "cwd": "...", "log": "path" | null}

The backend's stdin for it is one end of a socket pair, and the instance's Unix socket,
bound by the backend, arrives with the work as a descriptor (``SCM_RIGHTS``): the spare
serves it as a fresh instance would with ``--unix-socket-fd``.

It then becomes that instance: the environment, working folder and output are the
instance's, and it runs ``main(argv)`` as a fresh process would. What it cannot take on
is what was decided at import: variables read by a library when it was imported (e.g.
``OMP_NUM_THREADS`` for numpy's thread pool) keep the spare's values, so an instance
that sets such a variable otherwise is started fresh (``can_become``). The backend only
uses spares for instances that ask for it (serverless ones, a transform job's).

The preload file is learned: an instance started with ``SHIPYARD_IMPORTS_FILE`` set adds
the modules it imported while loading its model to that file (see ``record_imports``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from shipyard import autogroup, heap

IMPORTS_FILE = "SHIPYARD_IMPORTS_FILE"
_MAX_MODULES = 5000
_LOOK_AGAIN_S = 0.5
"""How often a waiting spare looks for modules added to its preload file."""

# Variables read when the interpreter starts or a library is imported (thread pools,
# allocators, devices, hashing), by name prefix. A spare that imported with other values
# cannot take them on, so an instance that sets them otherwise starts fresh.
_READ_AT_IMPORT = (
    "OMP_", "MKL_", "OPENBLAS_", "GOTO", "BLIS_", "VECLIB_", "NUMEXPR_", "KMP_", "MALLOC_",
    "LD_", "PYTHON", "CUDA_", "NVIDIA_", "TF_", "TORCH", "PYTORCH_", "JAX_", "XLA_", "HF_",
    "TRANSFORMERS_", "TOKENIZERS_", "NUMBA_", "NUMPY_", "SCIPY_", "SKLEARN_",
)  # fmt: skip
_TAKEN_ON = frozenset({"PYTHONPATH"})
"""Read at import, but taken on by ``wait_for_work`` (put on ``sys.path``)."""


def can_become(spare_environ: Mapping[str, str], environ: Mapping[str, str]) -> bool:
    """Whether a spare started with ``spare_environ`` can become an instance run with
    ``environ``: every variable read at import must have the spare's value."""
    names = {
        name
        for name in (*spare_environ, *environ)
        if name.startswith(_READ_AT_IMPORT) and name not in _TAKEN_ON
    }
    return all(spare_environ.get(name) == environ.get(name) for name in names)


def preload(path: Path | None) -> None:
    """Import every module listed in ``path``; ones that fail to import are skipped.

    Then what they made is collected and frozen (:func:`heap.settle`), as the instance
    does once its model is loaded: done here, while the spare waits, that collection
    walks only what the model added, where it walked every module imported too (0.13 s
    of a warm start with scikit-learn's, measured).
    """
    if path is None:
        return
    with contextlib.suppress(OSError):
        for name in path.read_text().split():
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    heap.settle()


def wait_for_work(preload_file: Path | None = None) -> list[str]:
    """Import what ``preload_file`` lists, then block until the backend sends the
    instance to become; its runtime argv.

    While it waits, and once more when the work comes, it imports what instances have
    added to the file since: the first instance of a model records its imports only once
    its model is loaded, which may be after this spare started.
    """
    share = _CpuShare()
    seen = _mtime(preload_file)
    preload(preload_file)
    while not select.select([sys.stdin], [], [], _LOOK_AGAIN_S)[0]:
        seen = _preload_if_changed(preload_file, seen)
    line, fds = _read_work()
    if not line:
        raise SystemExit(0)  # the backend closed the pipe: not needed after all
    work = json.loads(line)
    share.take(int(work.get("nice", 0)))
    _preload_if_changed(preload_file, seen)
    os.chdir(work["cwd"])
    os.environ.clear()
    os.environ.update(work["environ"])
    for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    _redirect(work.get("log"))
    if share.missed is not None:
        print(f"shipyard: the instance's CPU priority could not be set to nice {share.missed}"
              f" (it is {autogroup.nice()})", file=sys.stderr)  # fmt: skip
    argv = list(work["argv"])
    if fds:
        argv += ["--unix-socket-fd", str(fds[0])]
    for extra in fds[1:]:
        os.close(extra)
    return argv


WAITING_NICE = 19
"""A waiting spare's autogroup nice value: the lowest priority (see _CpuShare)."""


class _CpuShare:
    """A spare's share of the CPU: the least while it waits, the instance's once it has
    work.

    A spare imports for a second or more of CPU, often just after an instance took the
    spare before it, beside that instance's work; at the lowest priority it takes little
    from processes that want the CPU. The priority is its session's autogroup nice value
    (:mod:`shipyard.autogroup`): the backend sets it to :data:`WAITING_NICE` when it
    starts the spare and to the instance's value when it sends the work, each with one
    try, as its event loop cannot wait out the kernel's refusals. The spare waits them
    out: it lowers itself if the backend could not, and a thread watching its stdin puts
    it back to 0 as soon as work comes, whatever import it is in. Once the work is read,
    the instance's own value (``nice`` in the work) is set, however long the kernel takes.
    """

    _LOWER_PATIENCE_S = 1.0
    _TAKE_PATIENCE_S = 30.0
    _WATCH_S = 0.1

    def __init__(self) -> None:
        self.missed: int | None = None
        """The value the instance was to run at but could not be set to; None: set."""
        self._lock = threading.Lock()
        # A group shared with other processes (no session of its own) is not ours.
        now = autogroup.nice() if autogroup.leads_session(os.getpid()) else None
        self._ours = now is not None
        self._waiting = self._ours and (
            now == WAITING_NICE or autogroup.set_nice("self", WAITING_NICE, self._LOWER_PATIENCE_S)
        )
        if self._waiting:
            threading.Thread(target=self._watch, name="spare-share", daemon=True).start()

    def _watch(self) -> None:
        """Back to 0 once stdin has something to read (the work, or the backend's end),
        unless the work has been taken already (:meth:`take` set its own value)."""
        while self._waiting:
            if select.select([0], [], [], self._WATCH_S)[0]:
                with self._lock:
                    if self._waiting:
                        self._waiting = False
                        self._set(0)
                return

    def take(self, value: int) -> None:
        """Set the group to the instance's ``value``, however long the kernel takes."""
        with self._lock:
            self._waiting = False
            if not self._set(value):
                self.missed = value

    def _set(self, value: int) -> bool:
        """Set the group to ``value`` unless it is there (the backend may have set it)."""
        if not self._ours or autogroup.nice() in (None, value):
            return True
        return autogroup.set_nice("self", value, self._TAKE_PATIENCE_S)


def _read_work() -> tuple[bytes, list[int]]:
    """The work line on stdin, and the descriptors that came with it (none on a pipe)."""
    fd = os.dup(0)
    try:
        channel = socket.socket(fileno=fd)
    except OSError:  # not a socket: a pipe, which carries no descriptors
        os.close(fd)
        return sys.stdin.buffer.readline(), []
    with channel:
        data, fds, _, _ = socket.recv_fds(channel, 1 << 16, 4)
        parts = [data]
        while data and not data.endswith(b"\n"):
            data = channel.recv(1 << 16)
            parts.append(data)
    return b"".join(parts), fds


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


def _preload_if_changed(path: Path | None, seen: float | None) -> float | None:
    now = _mtime(path)
    if now != seen:
        preload(path)
    return now


def _redirect(log: str | None) -> None:
    """Point stdin at /dev/null and stdout/stderr at the instance's log."""
    null = os.open(os.devnull, os.O_RDWR)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else null
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in {null, out}:
        os.close(fd)


def _installed_modules(known: set[str]) -> set[str]:
    """The imported modules that come with Python or from installed packages, but for
    those in ``known`` (already recorded: each module's path is resolved, a few system
    calls per folder in it, and a model's libraries import a thousand or more, which
    took an instance 0.15 s of its start, between its model loaded and its first
    answer).

    The model's own code is left out: a spare must not hold a module of the same name
    from somewhere else when the instance imports the model's ``inference.py``.
    """
    roots = tuple(
        str(Path(p).resolve())
        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path}
        if p and ("site-packages" in p or p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    )
    names = set()
    for name, module in list(sys.modules.items()):
        if name.startswith("_") or name == "__main__" or name in known:
            continue
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if origin in ("built-in", "frozen") or (
            origin and str(Path(origin).resolve()).startswith(roots)
        ):
            names.add(name)
    return names


def record_imports(environ: dict[str, str] | os._Environ[str]) -> None:
    """Add the modules imported so far to the file ``SHIPYARD_IMPORTS_FILE`` names.

    Called once the model is loaded, so the list is what the next instance of a model
    like it will import. The file is a union over instances (capped), written whole to a
    temporary file and renamed, so a spare never reads half of it.
    """
    target = environ.get(IMPORTS_FILE)
    if not target:
        return
    path = Path(target)
    with contextlib.suppress(OSError):
        known = set(path.read_text().split()) if path.exists() else set()
        room = _MAX_MODULES - len(known)
        if room <= 0:
            return  # full: what is known stays, and nothing is resolved or written
        found = _installed_modules(known)
        if not found:
            return
        # Only what fits is added: a file cut back to the cap after the union would find
        # the names cut as new on every start, and write the file each time.
        names = known | set(sorted(found)[:room])
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text("\n".join(sorted(names)) + "\n")
        tmp.replace(path)
