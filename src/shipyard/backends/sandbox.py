"""Bubblewrap sandboxes for the instance and job processes of the local backend.

With ``auth:`` (and ``auth.sandbox``, its default there), a model's or a job's code is
arbitrary code run for a caller who may hold nothing more than one narrow key. It stays
allowed, but it runs under bubblewrap (``bwrap``, Debian's ``bubblewrap``), so it cannot
reach what the gateway holds (DESIGN 2.9). :class:`Sandbox` is the one place that says
what a sandboxed process sees; the backend only names the few folders of each process.

What a sandboxed process gets:

- its own user namespace, in which it is uid and gid 65534 (``nobody``) with no
  capabilities, its own PID namespace (it sees its own processes only, under a fresh
  ``/proc``), its own IPC and UTS namespaces;
- a root built from nothing: ``/usr`` (and ``/bin``, ``/lib``… as the host has them)
  read-only, the few files of ``/etc`` that programs read to run and to reach the network
  (never ``shadow``, ``ssl/private`` or the rest), a minimal ``/dev``, the CPU topology
  of ``/sys``, and a private ``/tmp`` in memory; the root itself is read-only;
- the Python installation the gateway runs (its prefixes, and shipyard's source tree
  when it is installed editable) and the folders of its ``PYTHONPATH``, read-only;
- every ``auth.file_roots`` folder, read-write: a call that names a location under a
  root was granted it, and a process may read its data there or write its output
  there (a transform's or a job's). A root is the operator's promise that what lies
  under it may be shared by every model and job of the gateway;
- what the backend names for the process: its model folder read-only, its own home,
  error file and working folder read-write.

What it never gets: the gateway's home (its store, logs, keys folder, other instances'
folders; masked even when a root contains it), the gateway's environment (the backend
hands each process its own, backends/environment.py), the host's ``/proc``.

What it does not guarantee:

- The network is shared: the process binds its port on 127.0.0.1 and reaches S3, so it
  also reaches every service the host listens on, a database that trusts local
  connections included. Keep those behind passwords.
- uid 65534 inside is the gateway's own uid outside: on whatever it can see, the kernel
  lets it do what the gateway's user may. The mounts are the fence, not the uid.
- No seccomp filter, and nested user namespaces stay allowed (``--disable-userns`` needs
  bubblewrap 0.8 and a kernel that honours it): the kernel is the attack surface, as for
  any unprivileged process. No limits on memory, CPU or the size of ``/tmp`` (memory).
- Only the local backend: the Ray backend runs its processes on the cluster's nodes as
  Ray starts them, unsandboxed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534
"""The uid and gid a sandboxed process has inside (``nobody``)."""
MODEL_DIR = Path("/opt/ml/model")
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


class SandboxUnavailable(ValueError):
    """The gateway was told to sandbox (``auth.sandbox``) and cannot: bubblewrap is
    missing or cannot make a sandbox here. Raised at start; the message says what to do."""


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
    """Read-write in every sandbox: ``auth.file_roots``."""
    hidden: tuple[Path, ...]
    """Never visible, even under a root: the gateway's home."""

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
        sandbox.check()
        return sandbox

    def check(self) -> None:
        """Run Python in a sandbox once; raise SandboxUnavailable saying why it failed."""
        argv = self.wrap([sys.executable, "-c", ""], chdir=Path("/"))
        try:
            done = subprocess.run(
                argv,
                env={"PATH": os.defpath},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_TRIAL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            failure = str(exc)
        else:
            if done.returncode == 0:
                return
            failure = (done.stderr or done.stdout).decode(errors="replace").strip()
            failure = failure or f"exit code {done.returncode}"
        raise SandboxUnavailable(
            f"auth.sandbox: bubblewrap ({self.bwrap}) cannot run a sandbox here: {failure}. "
            "It needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
            "and user.max_user_namespaces > 0; inside a container, one allowed to create "
            "them); or set auth.sandbox: false in the stack file"
        )

    def wrap(
        self,
        argv: Sequence[str],
        *,
        chdir: Path,
        readonly: Iterable[Path] = (),
        writable: Iterable[Path] = (),
        model: Path | None = None,
        die_with_parent: bool = True,
    ) -> list[str]:
        """The command that runs ``argv`` in a sandbox, in the folder ``chdir``.

        ``readonly`` and ``writable`` folders and files are seen at their own paths,
        after the roots and the masking of the gateway's home, so they may lie inside
        the home; they must exist, except ``readonly`` ones, which are skipped when
        missing. ``model``: a folder seen read-only at ``/opt/ml/model``.
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
        if die_with_parent:
            args.append("--die-with-parent")
        args += _system()
        bound = [("--ro-bind-try", p) for p in self.python]
        bound += [("--bind-try", p) for p in self.file_roots]
        for option, path in bound:
            args += [option, str(path), str(path)]
        masked = [h for h in self.hidden if any(_inside(h, p) for _, p in bound)]
        for path in masked:
            args += ["--tmpfs", str(path)]
        for option, path in bound:  # one strictly inside the home is granted all the same
            if any(_inside(path, m) and not _inside(m, path) for m in masked):
                args += [option, str(path), str(path)]
        for path in readonly:
            args += ["--ro-bind-try", str(path), str(path)]
        if model is not None:
            args += ["--ro-bind", str(model), str(MODEL_DIR)]
        for path in writable:
            args += ["--bind", str(path), str(path)]
        args += ["--remount-ro", "/", "--chdir", str(chdir), "--", *argv]
        return args


def _system() -> list[str]:
    """The read-only system every sandbox starts from, as this host lays it out."""
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
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
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
