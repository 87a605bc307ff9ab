"""Bubblewrap sandboxes for the instance and job processes of the local backend.

With ``auth:`` (and ``auth.sandbox``, its default there), a model's or a job's code is
arbitrary code run for a caller who may hold nothing more than one narrow key. It stays
allowed, but it runs under bubblewrap (``bwrap``, Debian's ``bubblewrap``), so it cannot
reach what the gateway holds (SECURITY.md, "Model code runs in a sandbox").
:class:`Sandbox` is the one place that says what a sandboxed process sees; the backend
only names the few folders of each process.

What a sandboxed process gets:

- its own user namespace, in which it is uid and gid 65534 (``nobody``) with no
  capabilities, its own PID namespace (it sees its own processes only, under a fresh
  ``/proc``), its own IPC and UTS namespaces;
- a root built from nothing: ``/usr`` (and ``/bin``, ``/lib``… as the host has them)
  read-only, the few files of ``/etc`` that programs read to run and to reach the network
  (never ``shadow``, ``ssl/private`` or the rest), a minimal ``/dev``, the CPU topology
  of ``/sys``, and a private ``/tmp`` in memory; the root itself is read-only;
- every ``auth.file_roots`` folder, read-only: a call that names a location under a
  root was granted it, and a process may read its data there. A root is the
  operator's promise that what lies under it may be read by every model and job of
  the gateway;
- the Python installation the gateway runs (its prefixes, and shipyard's source tree
  when it is installed editable) and the folders of its ``PYTHONPATH``, read-only;
- what the backend names for the process: its model folder read-only, its own home,
  error file and working folder read-write, and, for a job, the local locations its
  call named for it to write (its output and checkpoint folders, under a root:
  :meth:`Sandbox.grant`), read-write.

What it never gets: a write to a root outside the folders granted to it (another
team's models, data, captures and outputs; the stack file or a virtual environment
that lies under a root), the gateway's home (its store, logs, keys folder, other
instances' folders; masked even when a root contains it), the gateway's environment
(the backend hands each process its own, backends/environment.py), the host's
``/proc``. An instance writes no root at all: transform and async outputs and captured
data are written by the gateway, not by the model.

The binds are made in an order where the later one wins: the roots, then the folders
granted and the process's own writable folders, then the read-only ones (the Python
installation, shipyard's source, what the backend names read-only), then the masks over
the gateway's home and, again, whatever of the above lies inside it; the model last. So
a read-only folder inside a writable one stays read-only, and a root or a grant that
contains the Python installation does not make it writable.

What it does not guarantee:

- The network is shared: the process binds its port on 127.0.0.1 and reaches S3, so it
  also reaches every service the host listens on, a database that trusts local
  connections included. Keep those behind passwords.
- uid 65534 inside is the gateway's own uid outside: on whatever it can see, the kernel
  lets it do what the gateway's user may. The mounts are the fence, not the uid.
- No seccomp filter: the kernel is the attack surface, as for any unprivileged process.
  Nested user namespaces are refused and ``/tmp`` (memory) is bounded to TMP_BYTES only
  with bubblewrap 0.8 or later (``--disable-userns``, ``--size``; an older one runs
  without both, with a warning). No limits on memory, CPU or processes beyond what the
  memory check and the host give.
- Only the local backend: the Ray backend runs its processes on the cluster's nodes as
  Ray starts them, unsandboxed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shipyard.beneath import open_folder
from shipyard.errors import SandboxUnavailable

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
"""The uid and gid a sandboxed process has inside (``nobody``)."""
MODEL_DIR = Path("/opt/ml/model")
OPT_ML = Path("/opt/ml")
"""Where a processing job's script finds its tree (``processing/runner.py``)."""
"""Where a sandboxed instance finds its model folder, as on SageMaker."""

_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top folders that are links into ``/usr`` on a merged-usr host, folders elsewhere."""
_ETC = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "gai.conf",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pki/ca-trust/extracted",
    "pki/tls/certs",
    "protocols",
    "resolv.conf",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
)
"""What of ``/etc`` a process reads to run, resolve names and trust TLS: nothing secret."""
_TRIAL_TIMEOUT_S = 30.0
TMP_BYTES = 2 << 30
"""The size of a sandbox's ``/tmp``: a tmpfs is memory that no process's resident size
shows, so unbounded a model could fill the host's memory past every memory check."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How the local backend wraps a process in bubblewrap; see the module.

    Built once at start with :meth:`create`, which tries it; :meth:`wrap` then turns
    a command into the ``bwrap`` command that runs it sandboxed.
    """

    bwrap: str
    """The bubblewrap program."""
    python: tuple[Path, ...]
    """Read-only in every sandbox: the Python installation and shipyard's source."""
    file_roots: tuple[Path, ...]
    """Read-only in every sandbox: ``auth.file_roots``; a process writes only in the
    folders under them granted to it (:meth:`grant`)."""
    hidden: tuple[Path, ...]
    """Never visible, even under a root: the gateway's home."""
    hardened: bool = True
    """Nested user namespaces refused and ``/tmp`` bounded (TMP_BYTES): bubblewrap 0.8's
    ``--disable-userns`` and ``--size``, used where the trial run shows they work."""

    def __repr__(self) -> str:
        roots = [str(r) for r in self.file_roots]
        return f"Sandbox(bwrap={self.bwrap!r}, file_roots={roots}, uid={SANDBOX_UID})"

    @classmethod
    def create(
        cls, *, file_roots: Iterable[Path], hidden: Iterable[Path], environ: Mapping[str, str]
    ) -> Sandbox:
        """The gateway's sandbox, once a trial run of Python inside it has worked.

        Raises:
            SandboxUnavailable: no ``bwrap`` on the gateway's PATH, or the trial failed
                (user namespaces turned off, most often); the message says what to
                install or how to turn the sandbox off.
        """
        bwrap = shutil.which("bwrap", path=environ.get("PATH") or os.defpath)
        if bwrap is None:
            raise SandboxUnavailable(
                "auth.sandbox: instances and jobs run under bubblewrap, and bwrap is not "
                "installed; install it (apt-get install bubblewrap, dnf install bubblewrap) "
                "or set auth.sandbox: false in the stack file"
            )
        sandbox = cls(
            bwrap=bwrap,
            python=_python_installation(environ),
            file_roots=tuple(Path(r) for r in file_roots),
            hidden=tuple(Path(h) for h in hidden),
        )
        try:
            sandbox.check()
        except SandboxUnavailable:
            # An older bubblewrap (or a kernel that refuses --disable-userns): the same
            # fence without those two, if that runs.
            sandbox = dataclasses.replace(sandbox, hardened=False)
            sandbox.check()
            log.warning(
                "auth.sandbox: %s cannot refuse nested user namespaces or bound /tmp "
                "(bubblewrap 0.8 can); sandboxes run without both",
                bwrap,
            )
        return sandbox

    def check(self) -> None:
        """Run Python in a sandbox once, granted a folder as a job is (``--bind-fd``,
        bubblewrap 0.5 and later); raise SandboxUnavailable saying why it failed."""
        with tempfile.TemporaryDirectory() as trial:
            fd = os.open(trial, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            argv = self.wrap([sys.executable, "-c", ""], chdir=Path("/"), granted=[(fd, trial)])
            try:
                done = subprocess.run(
                    argv,
                    env={"PATH": os.defpath},
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=_TRIAL_TIMEOUT_S,
                    check=False,
                    pass_fds=(fd,),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                failure = str(exc)
            else:
                if done.returncode == 0:
                    return
                failure = (done.stderr or done.stdout).decode(errors="replace").strip()
                failure = failure or f"exit code {done.returncode}"
            finally:
                os.close(fd)
        raise SandboxUnavailable(
            f"auth.sandbox: bubblewrap ({self.bwrap}) cannot run a sandbox here: {failure}. "
            "It needs bubblewrap 0.5 or later and unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; "
            "inside a container, one allowed to create them); or set auth.sandbox: false "
            "in the stack file"
        )

    def grant(self, path: Path) -> int:
        """An open descriptor of the folder ``path``, made if missing, for a process to
        write (``wrap``'s ``granted``): a job's local output or checkpoint location.

        The folder must lie under a root, and neither lie inside nor contain the
        gateway's home or the Python installation. It is reached from its root one
        folder at a time without following a link, and a sandbox binds the folder
        opened, not a path, so a link or a rename made by another process (a job
        writing its own granted folder, which a later path goes through) between this
        check and the sandbox's start cannot lead elsewhere. The caller closes it.

        Raises:
            ValueError: the folder may not be granted, or cannot be made or opened;
                the message says why.
        """
        real = Path(os.path.realpath(path))
        roots = [Path(os.path.realpath(r)) for r in self.file_roots]
        root = next((r for r in roots if real.is_relative_to(r)), None)
        if root is None:
            raise ValueError(f"{path} is outside auth.file_roots")
        try:
            fd = open_folder(root, real.relative_to(root).parts, create=True)
        except OSError as exc:
            raise ValueError(f"{path} cannot be made or opened without a link: {exc}") from exc
        try:
            # Where the folder opened is (the kernel's word for it): checked, not assumed.
            self._check_grant(Path(os.readlink(f"/proc/self/fd/{fd}")), path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_grant(self, real: Path, path: Path) -> None:
        for kept in [*self.hidden, *self.python]:
            kept = Path(os.path.realpath(kept))
            if real.is_relative_to(kept) or kept.is_relative_to(real):
                raise ValueError(
                    f"{path} overlaps {kept}, which a sandboxed process never writes "
                    "(the gateway's home or its Python installation)"
                )

    def wrap(
        self,
        argv: Sequence[str],
        *,
        chdir: Path,
        readonly: Iterable[Path] = (),
        writable: Iterable[Path] = (),
        granted: Iterable[tuple[int, str | Path]] = (),
        model: Path | None = None,
        opt_ml: Path | None = None,
        die_with_parent: bool = True,
    ) -> list[str]:
        """The command that runs ``argv`` in a sandbox, in the folder ``chdir``.

        ``writable`` folders and files (the backend's own for the process) and
        ``readonly`` ones are seen at their own paths, in the order of the module's
        docstring, so they may lie inside the gateway's home, and a read-only one inside
        a writable one stays read-only; ``writable`` ones must exist, ``readonly`` ones
        are skipped when missing. ``granted``: (descriptor from :meth:`grant`, path the
        process sees it at), read-write; pass the descriptors to the child
        (``pass_fds``). ``model``: a folder seen read-only at ``/opt/ml/model``.
        ``opt_ml``: a folder seen read-write at ``/opt/ml`` (a processing job's tree).
        ``die_with_parent``: the sandbox is SIGKILLed when the process that started
        ``bwrap`` ends (an instance, which never outlives its gateway; not a job).

        The sandbox's processes are in the process group of ``bwrap`` (no
        ``--new-session``: the backend starts it in a session of its own, without a
        terminal, so there is none to reach), so a SIGKILL to that group ends them. A
        SIGTERM to ``bwrap`` itself kills it at once (it handles no signal) and, with
        ``die_with_parent``, SIGKILLs the sandbox: send polite signals to the processes
        inside instead (the backend does).
        """
        args = [self.bwrap, "--unshare-user", "--uid", str(SANDBOX_UID)]
        args += ["--gid", str(SANDBOX_UID), "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        args += ["--cap-drop", "ALL"]
        if self.hardened:
            args += ["--disable-userns"]
        if die_with_parent:
            args.append("--die-with-parent")
        args += _system(TMP_BYTES if self.hardened else None)
        args += _binds(("--ro-bind-try", p) for p in self.file_roots)
        for fd, path in granted:
            args += ["--bind-fd", str(fd), str(path)]
        bound = [("--bind", p) for p in writable]
        bound += [("--ro-bind-try", p) for p in [*self.python, *readonly]]
        args += _binds(bound)
        every = [*self.file_roots, *(p for _, p in bound)]
        masked = [h for h in self.hidden if any(_inside(h, p) for p in every)]
        for path in masked:
            args += ["--tmpfs", str(path)]
        # What lies inside the home is bound again over the mask, in the same order: a
        # root the operator put there, the process's own folders.
        inside = [("--ro-bind-try", p) for p in self.file_roots] + bound
        args += _binds(
            (option, path)
            for option, path in inside
            if any(_inside(path, m) and not _inside(m, path) for m in masked)
        )
        if model is not None:
            args += ["--ro-bind", str(model), str(MODEL_DIR)]
        if opt_ml is not None:
            args += ["--bind", str(opt_ml), str(OPT_ML)]
        args += ["--remount-ro", "/", "--chdir", str(chdir), "--", *argv]
        return args


def with_opt_ml(bwrap: str, argv: Sequence[str], *, opt_ml: Path, chdir: Path) -> list[str]:
    """The command that runs ``argv`` seeing the folder ``opt_ml`` at ``/opt/ml`` and the
    rest of the host as the gateway's user does: a processing job's script without
    ``auth:`` (with it, :meth:`Sandbox.wrap`'s ``opt_ml``).

    A private mount namespace (bubblewrap, in a user namespace when the gateway is not
    root): the host's root bound as it is, ``/opt`` replaced by a folder in memory holding
    the host's own ``/opt`` entries again and ``opt_ml``, so nothing on the host is
    changed. Its processes stay in bwrap's process group, and no process of the
    namespace outlives a SIGKILL to it.
    """
    args = [bwrap, "--dev-bind", "/", "/", "--tmpfs", str(OPT_ML.parent)]
    host_opt = OPT_ML.parent
    if host_opt.is_dir():
        for entry in sorted(host_opt.iterdir()):
            if entry.name != OPT_ML.name:
                args += ["--dev-bind", str(entry), str(entry)]
    args += ["--bind", str(opt_ml), str(OPT_ML), "--chdir", str(chdir), "--", *argv]
    return args


def _binds(binds: Iterable[tuple[str, Path]]) -> list[str]:
    args: list[str] = []
    for option, path in binds:
        args += [option, str(path), str(path)]
    return args


def _system(tmp_bytes: int | None) -> list[str]:
    """The read-only system every sandbox starts from, as this host lays it out, with a
    ``/tmp`` of its own (of ``tmp_bytes`` at most, where given)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_LINKS:
        path = Path("/", name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in _ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    args += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if tmp_bytes is not None:
        args += ["--size", str(tmp_bytes)]
    args += ["--tmpfs", "/tmp"]
    return args


def _python_installation(environ: Mapping[str, str]) -> tuple[Path, ...]:
    """The folders Python and shipyard run from: the prefixes, the folder shipyard is
    imported from when that is a source tree (an editable install) rather than the
    prefix's site-packages, and the gateway's ``PYTHONPATH``, which processes inherit
    (backends/environment.py; a caller's own is refused under ``auth:``). Folders under
    ``/usr`` or under another one are left out."""
    import shipyard

    source = Path(shipyard.__file__).resolve().parent.parent
    candidates = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), source}
    entries = environ.get("PYTHONPATH", "").split(os.pathsep)
    candidates |= {Path(e) for e in entries if e and os.path.isabs(e)}
    # Each as given and resolved: a process reaches it by the first, its links by the other.
    paths = sorted({p.resolve() for p in candidates} | candidates, key=lambda p: len(p.parts))
    found: list[Path] = []
    for path in paths:
        if path != Path("/") and not any(path.is_relative_to(f) for f in [Path("/usr"), *found]):
            found.append(path)
    return tuple(found)


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it, links resolved."""
    return path.resolve().is_relative_to(folder.resolve())
