"""Where a URI points, and the one S3 filesystem: the layer under every storage module.

Model artifacts (artifacts.py) and single objects (objects.py) are read and written
through here, so a URI is parsed one way (``s3://bucket/key``, ``file:///abs/path``,
``file://localhost/...``, a plain path) and S3 is reached with one configuration: the
gateway's ``--s3-endpoint-url`` and credentials from the environment as for any AWS
client, no listings cache (an object written elsewhere must be seen at once), and one
filesystem shared by every worker thread (fsspec would cache one per thread, each with
its own connections; its synchronous calls all run on fsspec's one I/O loop, so sharing
is safe).

Local locations stay ``pathlib`` paths rather than fsspec's local filesystem: the stores'
guarantees rest on what only the operating system gives directly, a write renamed into
place atomically (a sibling file renamed over it, in a folder held open), ``flock`` on a
lock file beside a fetched folder, and the standard library's tar extraction filter over
real paths.

Errors are ``UnsupportedLocation`` with a message that names the URI and what to write
instead; each store prefixes it with its own subject ("Model data ...").

**The one guard on local files** (``auth.file_roots``; SECURITY.md states the rule). A
``Filesystems`` built with ``file_roots`` refuses, with ``OutsideFileRoots``, every local
path a store opens, lists or writes for a URI that is not under one of them:
``local_file`` is the only way the stores turn a URI into a local path. The check runs
on the path the store is about to open, parsed by ``local_path`` below, the one parser
of locations (the early checks of the control plane, host_access.py, call it too): ``FILE:///x``, a
leading space or a tab in the scheme are read as the opener reads them, because they
*are* the opener's reading. So a location reached by any route (a manifest's prefix and
keys, ``..`` included; an output key; a capture destination; an async input or output;
a multi-model ``TargetModel``) is checked where it is opened, without a check of its
own. The guard applies to URIs only, which callers name: the folders a store is given
as ``Path`` (a fetch's destination, the gateway's home, its caches and logs) are the
gateway's own and are never checked.

**Checked, then opened through no link.** A check names a path; a link swapped in
between the check and the open would lead elsewhere, and code the gateway runs for a
caller can make one: a sandboxed job writes its own output folder, under a root, and a
later call's output may lie below it. So a read is checked again once open
(``open_local``: the file held is the file checked), and every local write or delete
made for a caller (transform and async outputs and failures, capture files, uploads of
a job's model and checkpoints, async output deletes) goes to ``local_target``: the
folder is resolved once, at the check, and then reached from its root one folder at a
time without following a link (beneath.py), the file created, renamed and deleted
relative to the folder held. A link made below the root after the check makes the write
fail (LinkRefused, naming the link) instead of leading it out. Without ``file_roots``
(no ``auth:``) the same walk starts at ``/``: links that exist when the write begins are
the user's and are followed, as the user's shell would; one swapped in after that is
refused all the same.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit
from urllib.request import url2pathname

import fsspec.core

from shipyard.beneath import Beneath
from shipyard.errors import OutsideFileRoots, UnsupportedLocation, UnsupportedScheme

S3_SCHEME = "s3://"


def local_path(uri: str) -> Path:
    """The local path of a ``file://`` URI or a plain path: the one reading of a location.

    ``urlsplit`` reads the scheme as a browser would (case folded, leading whitespace
    and control characters dropped, tabs and newlines removed), so ``FILE:///x`` and
    ``" file:///x"`` both name ``/x``. Every store opens what this returns, and the
    checks of ``file_roots`` check what it returns; nothing else parses a location.
    """
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UnsupportedLocation(
                f"{uri} is not a local file URI; write file:///absolute/path."
            )
        return Path(url2pathname(parts.path))
    if parts.scheme:
        raise UnsupportedScheme(uri, parts.scheme)
    return Path(uri)


def join_location(prefix: str, key: str) -> str:
    """``<prefix>/<key>``: where object ``key`` lies under ``prefix`` (an S3 prefix, a
    ``file://`` URI or a path), the one writing of a location from a name.

    ``key`` is data (an S3 key, a file name, a relative path of them), never read as
    part of a URI: under a ``file://`` prefix it is percent-encoded, so that ``%``, ``#``
    and ``?`` stay characters of a name (:func:`local_path` would read ``%2F`` as ``/``
    and ``#`` as the start of a fragment, cutting what follows). A key with a ``.`` or
    ``..`` part is refused (UnsupportedLocation): it would name something outside the
    prefix.

    ``join_location("s3://b/out", "x.out")`` and ``join_location("s3://b/out/", "x.out")``
    are both ``s3://b/out/x.out``; ``join_location("file:///o", "a#1")`` is
    ``file:///o/a%231``.
    """
    key = key.lstrip("/")
    if any(part in (".", "..") for part in key.split("/")):
        raise UnsupportedLocation(
            f"{key[:200]!r} is no name under {prefix[:200]}: a '.' or '..' part would leave it."
        )
    if urlsplit(prefix).scheme == "file":
        key = quote(key, safe="/")
    return prefix + key if prefix.endswith("/") else f"{prefix}/{key}"


def local_location(uri: str) -> Path | None:
    """The local path a store would open for ``uri``; None when it opens none.

    An ``s3://`` URI, another scheme or a ``file://`` URI naming another host open no
    local file (the stores refuse the last two), so there is nothing to check there.
    """
    if uri.startswith(S3_SCHEME):
        return None
    try:
        return local_path(uri)
    except UnsupportedLocation:
        return None


class FileRoots:
    """The folders (``auth.file_roots``) that local locations named by callers must lie
    under; see the module docstring for where it is checked.

    A path is resolved before it is compared: ``..`` and symbolic links are followed
    (``os.path.realpath``; for a path that does not exist yet, from its deepest existing
    parent), so neither leads out. No roots means no local location at all. ``hidden``
    folders (the gateway's home) are never a caller's, even under a root: the sandbox
    hides them from models, and the gateway must not copy them in for one either.
    """

    def __init__(
        self,
        roots: Iterable[str | os.PathLike[str]],
        hidden: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        self.roots = tuple(Path(os.path.realpath(root)) for root in roots)
        self.hidden = tuple(Path(os.path.realpath(folder)) for folder in hidden)

    def __repr__(self) -> str:
        return f"FileRoots({[str(root) for root in self.roots]!r})"

    def check(self, path: Path, uri: str) -> Path:
        """``path`` (what ``uri`` opens), or OutsideFileRoots naming ``uri`` when it
        resolves outside every root."""
        if "\x00" in str(path):
            raise OutsideFileRoots(f"{uri[:200]!r}: a path may not contain a NUL character.")
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(folder) for folder in self.hidden):
            raise OutsideFileRoots(
                f"{uri[:200]!r} is inside the gateway's home, which no caller may name, "
                "even under auth.file_roots."
            )
        if not any(real == root or real.is_relative_to(root) for root in self.roots):
            roots = ", ".join(str(root) for root in self.roots) or "none"
            raise OutsideFileRoots(
                f"{uri[:200]!r} is outside the folders this gateway may read and write "
                f"(auth.file_roots: {roots})."
            )
        return path

    def root_of(self, folder: Path, uri: str) -> Path:
        """The root that the resolved ``folder`` lies in (the deepest, when roots nest),
        or OutsideFileRoots naming ``uri`` when it lies in none, or in a hidden folder."""
        self.check(folder, uri)
        inside = [r for r in self.roots if folder.is_relative_to(r)]
        return max(inside, key=lambda root: len(root.parts))

    def check_uri(self, uri: str) -> None:
        """Refuse ``uri`` when it names a local path outside the roots (OutsideFileRoots);
        a URI that opens no local file passes."""
        path = local_location(uri)
        if path is not None:
            self.check(path, uri)


def s3_path(uri: str, *, object_key: bool = False) -> str:
    """``bucket/key`` of an ``s3://`` URI, without a trailing slash.

    ``object_key``: the URI must name an object (a key), not only a bucket.
    """
    path = uri.removeprefix(S3_SCHEME).rstrip("/")
    bucket, _, key = path.partition("/")
    if object_key and (not bucket or not key):
        raise UnsupportedLocation(f"{uri} names no object: write s3://bucket/key.")
    if not bucket:
        raise UnsupportedLocation(f"{uri} names no bucket.")
    return path


class Filesystems:
    """The filesystem behind ``s3://`` URIs: built on first use, then shared.

    One per store unless a store is given one; the gateway gives every store the same,
    so they share S3's configuration and connections. Safe to use from any thread.

    Args:
        s3_endpoint_url: an S3-compatible endpoint (MinIO, a test server) instead of AWS.
        file_roots: the folders local URIs must lie under (the module docstring);
            None, without ``auth:``, means anywhere.
    """

    def __init__(
        self, *, s3_endpoint_url: str | None = None, file_roots: FileRoots | None = None
    ) -> None:
        self.s3_endpoint_url = s3_endpoint_url
        self.file_roots = file_roots
        self._s3: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"Filesystems(s3_endpoint_url={self.s3_endpoint_url!r}, file_roots={self.file_roots!r})"
        )

    def local_file(self, uri: str) -> Path:
        """The local path of ``uri`` (``local_path``), checked against ``file_roots``.

        Raises:
            UnsupportedLocation: ``uri`` names no local path; OutsideFileRoots, one of
                them, when it resolves outside the roots.
        """
        path = local_path(uri)
        if self.file_roots is not None:
            self.file_roots.check(path, uri)
        return path

    def local_target(self, uri: str) -> Beneath:
        """Where a local write or delete for ``uri`` goes: its name in its folder, reached
        from a root through no link (the module docstring; ``Beneath.writer`` and
        ``Beneath.unlink`` do the rest).

        The folder is resolved now (links followed, ``..`` undone) and checked against
        ``file_roots`` as ``local_file`` checks ``uri``; the root is the one it lies in,
        or ``/`` without ``file_roots``.

        Raises:
            UnsupportedLocation: as ``local_file``, or ``uri`` names no file (a root, or
                a path ending in ``..``); OutsideFileRoots, one of them, when the file or
                its folder resolves outside the roots.
        """
        path = self.local_file(uri)
        if path.name in ("", ".", ".."):
            raise UnsupportedLocation(f"{uri[:200]} names no file.")
        folder = Path(os.path.realpath(path.parent))
        roots = self.file_roots
        root = Path(folder.anchor) if roots is None else roots.root_of(folder, uri)
        return Beneath(root, folder.relative_to(root).parts, path.name)

    def open_local(self, uri: str) -> BinaryIO:
        """``uri``'s local file (``local_file``) opened for reading, and checked again once
        open: a regular file, the very one its resolved path names, under the roots.

        A path checked and then opened could be switched in between, and a sandboxed job
        writes under a root (its output folder), where it can keep a link swapping
        between a harmless file and a secret; what is read here is what was checked.

        Raises:
            IsADirectoryError: a folder. OSError: nothing there, or no regular file.
            UnsupportedLocation: as ``local_file``, and OutsideFileRoots when the file
                opened is not the one its path now names.
        """
        path = self.local_file(uri)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no wait
        file = os.fdopen(fd, "rb")
        try:
            opened = os.fstat(fd)
            if stat.S_ISDIR(opened.st_mode):
                raise IsADirectoryError(errno.EISDIR, "a folder", str(path))
            if not stat.S_ISREG(opened.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            if self.file_roots is not None:
                real = Path(os.path.realpath(path))
                try:
                    named = os.stat(real)
                except OSError:
                    named = None
                if named is None or (named.st_dev, named.st_ino) != (
                    opened.st_dev,
                    opened.st_ino,
                ):
                    raise OutsideFileRoots(f"{uri[:200]!r} changed while it was opened.")
                self.file_roots.check(real, uri)
        except BaseException:
            file.close()
            raise
        return file

    def allows(self, path: Path) -> bool:
        """Whether the local ``path`` lies under ``file_roots`` (a file found inside a
        folder the store was asked to copy)."""
        if self.file_roots is None:
            return True
        try:
            self.file_roots.check(path, str(path))
        except OutsideFileRoots:
            return False
        return True

    def s3(self) -> Any:
        """The one S3 filesystem (an ``s3fs.S3FileSystem``), built on first use."""
        with self._lock:
            if self._s3 is None:
                endpoint = self.s3_endpoint_url
                fs, _ = fsspec.core.url_to_fs(
                    S3_SCHEME,
                    client_kwargs={"endpoint_url": endpoint} if endpoint else {},
                    use_listings_cache=False,
                    # Else fsspec hands back its per-thread instance (module docstring).
                    skip_instance_cache=True,
                )
                self._s3 = fs
            return self._s3
