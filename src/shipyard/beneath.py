"""Folders and files reached beneath a root, one component at a time, through no link.

A folder that code the gateway does not trust may write (a job's output folder under an
``auth.file_roots`` root, a training container's ``/opt/ml``) can hold a link at any
moment: a path checked and then opened, created, renamed or deleted by name may lead
somewhere else by then. Everything here starts from a root opened by the gateway (the
operator's folder: followed if it is a link) and opens each folder below it relative to
the one above, with ``O_NOFOLLOW``; a link, or a part that is no folder, anywhere below
the root stops the walk with :class:`~shipyard.errors.LinkRefused`. The file itself is
created, renamed and deleted relative to the folder opened, never by path. This module
is the one walk: the sandbox's grants (backends/sandbox.py), the job folder's reads
(job_contract.py) and every local write or delete made for a caller
(storage/filesystems.py) use it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from shipyard.errors import LinkRefused

log = logging.getLogger(__name__)

_PATH = getattr(os, "O_PATH", os.O_RDONLY)
"""Opens a folder as a place only (Linux's ``O_PATH``): enough to work relative to it,
and needing only the search permission a path through it needs, not read permission."""
_DIR = os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_folder(
    root: Path, parts: Sequence[str], *, create: bool = False, listed: bool = True
) -> int:
    """A descriptor of the folder ``root/parts[0]/parts[1]/...``, each part opened
    relative to the one above without following a link; ``create`` makes missing
    folders on the way. ``root`` itself is followed (it is the gateway's). The folders
    on the way are opened as places only (``O_PATH``), as a path goes through them;
    the last one for reading, unless not ``listed`` (a write, which only names files
    in it). The caller closes the descriptor.

    Raises:
        FileNotFoundError: a part is missing (without ``create``).
        LinkRefused: a part is a link or no folder.
        OSError: anything else the system refuses (a folder it may not make, say).
        ValueError: a part is empty, ``.``, ``..`` or holds a ``/``.
    """
    if any(part in ("", ".", "..") or "/" in part for part in parts):
        raise ValueError(f"not a path below its folder: {'/'.join(parts)!r}")
    last = (os.O_RDONLY if listed else _PATH) | _DIR
    fd = os.open(root, last if not parts else _PATH | _DIR)
    try:
        for depth, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            flags = last if depth == len(parts) - 1 else _PATH | _DIR
            try:
                below = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise _refused(root, parts[: depth + 1]) from None
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refused(root: Path, parts: Sequence[str]) -> LinkRefused:
    where = root.joinpath(*parts)
    return LinkRefused(
        errno.ELOOP,
        f"{where} is a link or no folder; a location is reached from its root ({root}) "
        "through folders only, never through a link",
    )


@dataclass(frozen=True, slots=True)
class Beneath:
    """A file named ``name`` in the folder ``folders`` below ``root``: where a write or
    delete goes, reached through no link below ``root``."""

    root: Path
    folders: tuple[str, ...]
    name: str

    def __post_init__(self) -> None:
        if self.name in ("", ".", "..") or "/" in self.name:
            raise ValueError(f"not a file name: {self.name!r}")

    def __str__(self) -> str:
        return str(self.root.joinpath(*self.folders, self.name))

    def unlink(self) -> None:
        """Remove the file (or a link in its place, not what it points to); nothing there
        is no error.

        Raises:
            IsADirectoryError: a folder. LinkRefused: a link or no folder above it.
            OSError: the system refused.
        """
        try:
            fd = open_folder(self.root, self.folders, listed=False)
        except FileNotFoundError:
            return
        try:
            os.unlink(self.name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def writer(self) -> AtomicWrite:
        """A write of the whole file (:class:`AtomicWrite`)."""
        return AtomicWrite(self)


class AtomicWrite:
    """A file written whole or not at all: a hidden sibling, ``.<name>.<random>.partial``,
    created (``O_EXCL``, no link followed) in the folder opened beneath the root, and
    renamed over the name in that same folder once complete.

    The folder is opened (and made, with the folders above it) by the first write or by
    commit, so a write that never starts leaves nothing. The sibling's name is unique, so
    two writers of one file never mix their bytes: the last to finish wins, whole. A lock
    orders abort() after a write still running in another thread (a cancelled task does
    not stop its thread), so nothing is created that abort() cannot see.
    """

    def __init__(self, target: Beneath) -> None:
        self.target = target
        self._partial = f".{target.name}.{secrets.token_hex(6)}.partial"
        self._folder: int | None = None
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self._done = False

    def __repr__(self) -> str:
        return f"AtomicWrite({str(self.target)!r})"

    def _opened(self) -> BinaryIO:
        if self._done:
            raise ValueError(f"the write of {self.target} has ended")
        if self._file is None:
            target = self.target
            self._folder = open_folder(target.root, target.folders, create=True, listed=False)
            fd = os.open(self._partial, _NEW_FILE, 0o666, dir_fd=self._folder)
            self._file = os.fdopen(fd, "wb")
        return self._file

    def write(self, chunk: bytes) -> None:
        with self._lock:
            self._opened().write(chunk)

    def commit(self) -> None:
        """Make the file visible, whole. Raises what the system refuses (the name is a
        folder: IsADirectoryError), the partial file then removed."""
        with self._lock:
            file = self._opened()
            file.flush()
            os.fsync(file.fileno())  # else a power cut could leave an empty file in place
            folder = self._folder
            try:
                os.replace(self._partial, self.target.name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                self._drop()
                raise
            self._close()

    def abort(self) -> None:
        """Drop what was written; the file stays as it was. Never raises."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._done:
            return
        if self._folder is not None:
            try:
                os.unlink(self._partial, dir_fd=self._folder)
            except FileNotFoundError:
                pass
            except OSError:
                # Left behind, hidden: never read as the file.
                log.warning("Could not remove %s", self._partial, exc_info=True)
        self._close()

    def _close(self) -> None:
        self._done = True
        if self._file is not None:
            self._file.close()
        if self._folder is not None:
            os.close(self._folder)
            self._folder = None
