"""ArtifactStore: bring a model's artifact (``ModelDataUrl``) into a local folder, safely.

A ``ModelDataUrl`` is a ``file://`` URI, a plain path or an ``s3://`` URI, and names either
a tar archive (SageMaker's ``model.tar.gz``; any single file is read as one) or a
directory / prefix whose tree is copied. Three guarantees:

- **Nothing is written outside the destination.** Archives go through the standard
  library's ``data`` extraction filter (PEP 706), which refuses members that would land
  outside, links that point outside, absolute links and device files; it strips a leading
  ``/`` from member names, as GNU tar does, so those land inside. Object keys under an
  S3 prefix are checked the same way, since S3 allows keys such as ``a/../../x``.
- **The destination is all or nothing.** Work happens in a hidden sibling folder that is
  renamed into place only once complete, so a failed fetch leaves no destination behind
  and a retry starts clean; a complete destination carries ``.shipyard-complete`` and is
  returned as is, without downloading again.
- **Every failure is an ArtifactError** whose message names the URI and what is wrong,
  because it is shown to users as the endpoint's ``FailureReason``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import lzma
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from logging import getLogger
from pathlib import Path
from typing import Any, BinaryIO

from botocore.exceptions import BotoCoreError

from shipyard.errors import ArtifactError, UnsupportedLocation
from shipyard.job_contract import open_beneath, open_folder_beneath
from shipyard.storage.filesystems import S3_SCHEME, Filesystems, s3_path

logger = getLogger(__name__)

COMPLETE_MARKER = ".shipyard-complete"
"""Written last inside a fetched model folder; its presence means the folder is whole."""

_READ_CHUNK_BYTES = 1 << 20

FileStamp = tuple[int, int]
"""A local file's ``(size, mtime_ns)``: what sync_up compares to tell a changed file."""


@dataclass(frozen=True, slots=True)
class _Words:
    """How messages name what is moved and where it goes: users read them verbatim."""

    data: str
    """e.g. ``model data``, in the middle of a sentence."""
    place: str
    """e.g. ``the model directory``."""

    @property
    def subject(self) -> str:
        return self.data[:1].upper() + self.data[1:]


_MODEL_WORDS = _Words("model data", "the model directory")
_CODE_WORDS = _Words("submit directory", "the code directory")
_OUTPUT_WORDS = _Words("output location", "the output location")


def join_uri(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended as path segments: ``join_uri("s3://b/out", "j")``."""
    return "/".join([uri.rstrip("/"), *(part.strip("/") for part in parts)])


class ArtifactStore:
    """Fetches model artifacts from local paths and S3 into local folders.

    Synchronous on purpose: the gateway calls it from a worker thread. Fetches of the same
    destination, from threads or processes, take turns on a lock file beside it: the
    first downloads, the others find the result complete.

    Args:
        s3_endpoint_url: an S3-compatible endpoint (MinIO, a test server) instead of AWS.
            Credentials and region come from the environment, as for any AWS client.
        filesystems: the storage layer to share with other stores, whose endpoint
            and ``file_roots`` then apply: every local URI this store reads or writes
            (never a destination folder it is given as a Path) is checked against
            them; built from ``s3_endpoint_url`` when not given.
    """

    def __init__(
        self, *, s3_endpoint_url: str | None = None, filesystems: Filesystems | None = None
    ) -> None:
        self._filesystems = filesystems or Filesystems(s3_endpoint_url=s3_endpoint_url)

    def __repr__(self) -> str:
        return f"ArtifactStore(s3_endpoint_url={self._filesystems.s3_endpoint_url!r})"

    def fetch_model(self, uri: str, dest: Path) -> Path:
        """Make ``dest`` hold the model's files named by ``uri`` and return ``dest``.

        A complete ``dest`` from an earlier fetch is returned without downloading again;
        anything else at ``dest`` is replaced. Fetches of one ``dest`` take turns (a lock
        file beside it), so concurrent callers download once and never see a half tree.
        ``dest`` is therefore a cache slot for one ``uri``: key it by model, whose
        ``ModelDataUrl`` never changes, since a complete ``dest`` is not checked again.

        Raises:
            ArtifactError: the model data is missing, unreadable, not a valid archive,
                empty, or would write outside ``dest``. ``dest`` does not exist afterwards.
        """
        return self._fetch_tree(uri, Path(dest), _MODEL_WORDS)

    def fetch_code(self, uri: str, dest: Path) -> Path:
        """Make ``dest`` hold a job's submit directory (``sagemaker_submit_directory``).

        The same as fetch_model, guarantees included (a tar archive is extracted through
        the same filter, a folder or prefix is copied), with messages that speak of the
        submit directory. ``dest`` ends up holding COMPLETE_MARKER too.

        Raises:
            ArtifactError: as fetch_model.
        """
        return self._fetch_tree(uri, Path(dest), _CODE_WORDS)

    def _fetch_tree(self, uri: str, dest: Path, words: _Words) -> Path:
        if _is_complete(dest):
            return dest
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _exclusive(dest.parent / f".{dest.name}.lock"):
                if not _is_complete(dest):  # else another caller fetched it while we waited
                    self._fetch_into(uri, dest, words)
        except OSError as exc:
            raise ArtifactError(f"Could not prepare {words.place} {dest} for {uri}: {exc}") from exc
        return dest

    def _fetch_into(self, uri: str, dest: Path, words: _Words) -> None:
        """Replace whatever is at ``dest`` with the model's files; the caller holds the lock."""
        logger.info("Fetching %s %s into %s", words.data, uri, dest)
        # A sibling of dest, so the final rename stays on one filesystem and is atomic.
        staging = dest.parent / f".{dest.name}.partial"
        _remove(dest)
        _remove(staging)  # left behind by a process that died mid-fetch
        tree = staging / "model"
        tree.mkdir(parents=True)
        try:
            with _translate_errors(uri, words):
                self._materialize(uri, tree, staging, words)
            if not any(tree.iterdir()):
                raise ArtifactError(f"{words.subject} {uri} is empty: it holds no files.")
            # Written last: a folder without it is never mistaken for a complete one.
            (tree / COMPLETE_MARKER).touch()
            tree.rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _materialize(self, uri: str, tree: Path, staging: Path, words: _Words) -> None:
        """Fill ``tree`` with the model's files; ``staging`` holds any downloaded archive."""
        if uri.startswith(S3_SCHEME):
            self._fetch_s3(uri, tree, staging, words)
            return
        source = self._local_path(uri, words)
        if source.is_dir():
            self._copy_tree(source, tree, uri, words)
        elif source.exists():
            _extract(source, uri, tree, words)
        else:
            raise FileNotFoundError(source)

    def _fetch_s3(self, uri: str, tree: Path, staging: Path, words: _Words) -> None:
        path = _s3_path(uri, words)
        fs = self._s3_filesystem()
        if fs.info(path)["type"] == "directory":
            _download_prefix(fs, path, uri, tree, words)
            return
        archive = staging / "archive"
        fs.get_file(path, str(archive))  # streamed to disk in chunks, never held in memory
        _extract(archive, uri, tree, words)

    def download(
        self, uri: str, dest: Path, *, what: str = "data", missing_ok: bool = False
    ) -> int:
        """Copy the file or every object under the prefix ``uri`` into ``dest``, unchanged.

        Nothing is extracted: a job's channel gets exactly the objects it names
        (SageMaker's S3Prefix in File mode), relative paths under the prefix kept, and a
        URI naming one file or object puts that file in ``dest`` under its own name. Keys
        that would land outside ``dest`` are refused, as in fetch_model. Not all or
        nothing: on failure ``dest`` may hold part of the data.

        Args:
            what: names the data in messages, e.g. ``input data of channel 'train'``.
            missing_ok: a missing path or an empty prefix copies nothing instead of
                failing, for a checkpoint prefix that no attempt has written yet.

        Returns:
            How many files were copied.

        Raises:
            ArtifactError: ``uri`` is missing (unless ``missing_ok``), unreadable or
                unsafe; the message names ``uri``.
        """
        dest = Path(dest)
        words = _Words(what, str(dest))
        with _translate_errors(uri, words):
            dest.mkdir(parents=True, exist_ok=True)
            try:
                return self._copy_into(uri, dest, words)
            except FileNotFoundError:
                if missing_ok:
                    return 0
                raise

    def _copy_into(self, uri: str, dest: Path, words: _Words) -> int:
        if uri.startswith(S3_SCHEME):
            path = _s3_path(uri, words)
            fs = self._s3_filesystem()
            if fs.info(path)["type"] == "directory":
                return _download_prefix(fs, path, uri, dest, words)
            fs.get_file(path, str(dest / path.rsplit("/", 1)[-1]))
            return 1
        source = self._local_path(uri, words)
        if source.is_dir():
            return self._copy_tree(source, dest, uri, words)
        shutil.copy2(source, dest / source.name)  # FileNotFoundError when it is missing
        return 1

    def upload_file(self, path: Path, uri: str) -> None:
        """Put the local file ``path`` at ``uri``: an S3 object, or a local file.

        A local destination's folders are created, and the file is written beside it and
        renamed into place, so a reader never sees half of it.

        Raises:
            ArtifactError: ``path`` is unreadable or ``uri`` unwritable; names both.
        """
        with _translate_upload_errors(Path(path), uri):
            self._put(Path(path), uri)

    def sync_up(
        self,
        local_dir: Path,
        uri: str,
        *,
        previous: Mapping[str, FileStamp] | None = None,
        root: Path | None = None,
    ) -> dict[str, FileStamp]:
        """Upload the files under ``local_dir`` that are new or changed since ``previous``.

        Pass the returned stamps as ``previous`` next time, so each sync sends only what
        changed (a job's checkpoints, every few seconds). Files deleted locally stay at
        ``uri``. A file replaced while it is being sent may arrive half written; its stamp
        then differs next time, so the next sync sends it again. A file that vanishes
        before it is sent (a writer's temporary file) is skipped.

        Only regular files are sent, read through no link (job_contract.py
        ``open_beneath``): ``local_dir`` may be written by code that is not trusted (a
        training container), which must not lead the sync out of it. ``root``: the
        trusted folder ``local_dir`` lies in (default ``local_dir`` itself); from it
        down, no link is followed, ``local_dir`` included.

        Raises:
            ArtifactError: an upload failed. Keep the old ``previous``: the next sync
                sends everything that did not get through.
        """
        local_dir = Path(local_dir)
        root = Path(root) if root is not None else local_dir
        below = local_dir.relative_to(root).as_posix()
        previous = previous or {}
        current = _stamps(root, below)
        for rel in sorted(current):
            if previous.get(rel) == current[rel]:
                continue
            path = local_dir / rel
            try:
                with _translate_upload_errors(path, join_uri(uri, rel)):
                    beneath = rel if below == "." else f"{below}/{rel}"
                    with open_beneath(root, beneath) as source:
                        self._put_stream(source, join_uri(uri, rel))
            except ArtifactError:
                if os.path.lexists(path) and not path.is_symlink():
                    raise
                del current[rel]  # gone, or a link now: not sent
        return current

    def _put_stream(self, source: BinaryIO, uri: str) -> None:
        if uri.startswith(S3_SCHEME):
            # Committed only once all of it is written: a failed copy must not replace
            # a good object with a truncated one (closing would commit what it has).
            out = self._s3_filesystem().open(_s3_path(uri, _OUTPUT_WORDS), "wb", autocommit=False)
            try:
                shutil.copyfileobj(source, out)
                out.close()
                out.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    out.discard()
                raise
            return
        try:
            out = self._filesystems.local_target(uri).writer()  # through no link
        except UnsupportedLocation as exc:
            raise ArtifactError(f"{_OUTPUT_WORDS.subject} {exc}") from None
        try:
            shutil.copyfileobj(source, out, _READ_CHUNK_BYTES)
            out.commit()
        except BaseException:
            out.abort()
            raise

    def _put(self, path: Path, uri: str) -> None:
        if uri.startswith(S3_SCHEME):
            self._s3_filesystem().put_file(str(path), _s3_path(uri, _OUTPUT_WORDS))
            return
        with open(path, "rb") as source:
            self._put_stream(source, uri)

    def _local_path(self, uri: str, words: _Words) -> Path:
        """The local path of ``uri``, refused outside ``file_roots`` (filesystems.py)."""
        try:
            return self._filesystems.local_file(uri)
        except UnsupportedLocation as exc:
            raise ArtifactError(f"{words.subject} {exc}") from None

    def _copy_tree(self, source: Path, dest: Path, uri: str, words: _Words) -> int:
        """Copy the folder ``source`` into ``dest``; return how many files were copied.

        Symlinks are followed and their content copied, so no link points out of
        ``dest``; a file a link leads to outside ``file_roots`` is refused, as its URI
        would be, and so is anything but a regular file.

        Each file is opened first and checked after: the file read is the file that
        was checked. A link checked by its path and then opened again could be switched
        in between, and a sandboxed job may do just that in its own output folder,
        which lies under a root, keeping a link there swapping between a harmless file
        and a secret until a copy reads the secret.

        A folder reached twice (a link to itself or to a folder above it, or two links to
        one folder) is refused: followed, such links copy without end until the disk is
        full.
        """
        copied = 0
        folders: set[tuple[int, int]] = set()

        def once(folder: str, names: list[str]) -> list[str]:
            found = os.stat(folder)
            if (found.st_dev, found.st_ino) in folders:
                raise ArtifactError(
                    f"{words.subject} {uri} is unsafe: the folder {folder} is reached twice "
                    "through links (a link loop, or two links to one folder)."
                )
            folders.add((found.st_dev, found.st_ino))
            return []

        def copy(src: str, dst: str) -> str:
            nonlocal copied
            try:
                source = self._filesystems.open_local(src)  # opened, then checked
            except (UnsupportedLocation, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno != errno.EINVAL:
                    raise  # not "no regular file": copytree's to collect
                raise ArtifactError(
                    f"{words.subject} {uri} is unsafe: {src} leads outside the folders "
                    "this gateway may read (auth.file_roots), or is no regular file."
                ) from None
            with source, open(dst, "wb") as out:
                opened = os.fstat(source.fileno())
                shutil.copyfileobj(source, out, _READ_CHUNK_BYTES)
            os.chmod(dst, stat.S_IMODE(opened.st_mode))
            os.utime(dst, ns=(opened.st_atime_ns, opened.st_mtime_ns))
            copied += 1
            return dst

        # copytree collects OSErrors and goes on; an ArtifactError stops it at once.
        shutil.copytree(source, dest, dirs_exist_ok=True, copy_function=copy, ignore=once)
        return copied

    def _s3_filesystem(self) -> Any:
        # No listings cache (filesystems.py): a retry after the user uploads the missing
        # model must see it.
        return self._filesystems.s3()


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path``, across threads and processes alike.

    ``flock`` locks belong to an open file, so two threads of one process exclude each
    other too. The lock file is left in place: deleting it would race with a waiter.
    """
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _is_complete(dest: Path) -> bool:
    return dest.is_dir() and not dest.is_symlink() and (dest / COMPLETE_MARKER).exists()


def _remove(path: Path) -> None:
    """Remove a leftover file, link or incomplete folder at ``path``, if any."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _s3_path(uri: str, words: _Words) -> str:
    """``bucket/key`` of an ``s3://`` URI, without a trailing slash."""
    try:
        return s3_path(uri)
    except UnsupportedLocation as exc:
        raise ArtifactError(f"{words.subject} {exc}") from None


def _download_prefix(fs: Any, prefix: str, uri: str, tree: Path, words: _Words) -> int:
    """Copy every object under ``prefix`` into ``tree``, refusing keys that escape it.

    Returns how many objects were copied.
    """
    keys: list[str] = []
    targets: list[str] = []
    root = os.path.realpath(tree)
    for key in fs.find(prefix):
        if key.endswith("/"):  # a "folder" marker object, not a file
            continue
        target = os.path.realpath(os.path.join(root, key.removeprefix(prefix + "/")))
        if os.path.commonpath([root, target]) != root or target == root:
            raise ArtifactError(
                f"{words.subject} {uri} is unsafe: object 's3://{key}' would be written "
                f"outside {words.place}."
            )
        os.makedirs(os.path.dirname(target), exist_ok=True)
        keys.append(key)
        targets.append(target)
    if keys:
        fs.get(keys, targets)  # lists are copied pairwise, concurrently
    return len(keys)


def _stamps(root: Path, below: str) -> dict[str, FileStamp]:
    """``(size, mtime_ns)`` of every regular file in the folder ``below`` of ``root``, by
    POSIX path relative to that folder. No link is followed, to the folder or in it:
    it is reached with ``open_folder_beneath`` and walked by ``os.fwalk``, which opens
    each folder it enters through no link."""
    stamps: dict[str, FileStamp] = {}
    try:
        top = open_folder_beneath(root, below)
    except FileNotFoundError:
        return stamps
    except OSError as exc:  # the folder is a link, or no folder
        raise ArtifactError(f"{below} cannot be read through no link: {exc}") from None
    try:
        for folder, _, files, folder_fd in os.fwalk(".", dir_fd=top):
            for name in files:
                try:
                    info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
                except FileNotFoundError:  # removed since it was listed
                    continue
                if stat.S_ISREG(info.st_mode):
                    rel = os.path.normpath(os.path.join(folder, name))
                    stamps[Path(rel).as_posix()] = (info.st_size, info.st_mtime_ns)
    finally:
        os.close(top)
    return stamps


def _extract(archive: Path, uri: str, tree: Path, words: _Words) -> None:
    """Extract ``archive`` into ``tree`` through the standard library's ``data`` filter,
    within a budget of bytes (_Budget)."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            tar.extractall(tree, filter=_Budget(archive, tree))
            # tarfile stops at the end-of-archive marker and never reads gzip's trailer;
            # reading on to the end makes gzip verify its CRC, catching corrupt downloads.
            while tar.fileobj.read(_READ_CHUNK_BYTES):
                pass
    except tarfile.FilterError as exc:
        refusal = _describe_refusal(exc, words)
        raise ArtifactError(f"{words.subject} {uri} is unsafe: {refusal}.") from exc
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        # A multi-line reason is tarfile's list of every compression it tried: noise here.
        reason = str(exc)
        detail = f" ({reason})" if reason and "\n" not in reason else ""
        raise ArtifactError(f"{words.subject} {uri} is not a valid tar archive{detail}.") from exc
    except OSError as exc:
        raise ArtifactError(f"{words.subject} {uri} could not be extracted: {exc}") from exc


_MAX_PATH_CHARS = 1024


class _Refused(tarfile.FilterError):
    """A member the ``data`` filter would allow but we refuse anyway (see _model_filter
    and _Budget)."""

    def __init__(self, tarinfo: tarfile.TarInfo, why: str) -> None:
        super().__init__(why)
        self.tarinfo = tarinfo
        self.why = why


def _model_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """The ``data`` filter, plus: no link climbs with ``..`` and no path is very long.

    The ``data`` filter of Python before 3.11.13/3.12.11 can be walked around by chains
    of symlinks through ``..`` whose resolved paths exceed PATH_MAX (CVE-2025-4517).
    Model archives have no need for such links, so refusing them closes that door on
    every interpreter we run on.
    """
    checked = tarfile.data_filter(member, path)
    if member.issym() or member.islnk():
        if ".." in Path(member.linkname).parts:
            raise _Refused(member, f"links to {member.linkname!r} through '..'")
    if len(member.name) > _MAX_PATH_CHARS or len(member.linkname) > _MAX_PATH_CHARS:
        raise _Refused(member, f"has a path longer than {_MAX_PATH_CHARS} characters")
    return checked


MAX_EXPANSION = 200
"""How many times its own size an archive may grow to when extracted, past a floor of
MIN_EXPANSION_BYTES: model weights compress little, so an archive that would grow more
is a bomb (2 MB of gzip making 2 GiB of zeros) meant to fill the disk."""
MIN_EXPANSION_BYTES = 1 << 30
DISK_RESERVE_BYTES = 100 << 20
"""What an extraction must leave free on the disk the home is on (the store lives there)."""
MAX_MEMBERS = 100_000
"""Entries an archive may hold: empty files and folders take no bytes of the budget but an
inode and a system call each, so an archive of millions of them (a few MB of gzip) would
exhaust the disk's inodes and hold an instance's start for minutes. A model folder, even a
sharded checkpoint with its tokenizer, holds hundreds."""


class _Budget:
    """The ``data`` filter of _model_filter, and the bytes an archive's members may
    take: at most MAX_EXPANSION times the archive (or MIN_EXPANSION_BYTES), and never so
    much that less than DISK_RESERVE_BYTES stays free, in at most MAX_MEMBERS entries.
    Checked on each member's declared size before it is written, so nothing past the
    budget reaches the disk."""

    def __init__(self, archive: Path, tree: Path) -> None:
        allowed = max(archive.stat().st_size * MAX_EXPANSION, MIN_EXPANSION_BYTES)
        tree.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(tree).free - DISK_RESERVE_BYTES
        self.left = min(allowed, max(free, 0))
        self.members = 0
        self.why = (
            f"more than {MAX_EXPANSION} times the archive's size"
            if allowed <= free
            else "more than the disk has free"
        )

    def __call__(self, member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        checked = _model_filter(member, path)
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise _Refused(member, f"is past the {MAX_MEMBERS} entries a model may hold")
        if member.isreg():
            self.left -= member.size
            if self.left < 0:
                raise _Refused(member, f"would make the model {self.why}")
        return checked


def _describe_refusal(exc: tarfile.FilterError, words: _Words) -> str:
    member = exc.tarinfo
    name = f"member {member.name!r}"
    if isinstance(exc, _Refused):
        return f"{name} {exc.why}"
    if isinstance(exc, tarfile.OutsideDestinationError):
        return f"{name} would be written outside {words.place}"
    if isinstance(exc, tarfile.LinkOutsideDestinationError):
        return f"{name} links to {member.linkname!r}, outside {words.place}"
    if isinstance(exc, tarfile.AbsoluteLinkError):
        return f"{name} links to the absolute path {member.linkname!r}"
    if isinstance(exc, tarfile.AbsolutePathError):
        return f"{name} has an absolute path"
    if isinstance(exc, tarfile.SpecialFileError):
        return f"{name} is a device, FIFO or other special file"
    return f"{name} was refused ({exc})"


@contextmanager
def _translate_errors(uri: str, words: _Words) -> Iterator[None]:
    """Turn the filesystem's and botocore's errors into ArtifactError, naming ``uri``."""
    try:
        yield
    except FileNotFoundError as exc:
        raise ArtifactError(f"Could not find {words.data} at {uri}.") from exc
    except PermissionError as exc:
        raise ArtifactError(f"Access to {words.data} at {uri} was denied: {exc}") from exc
    except (OSError, BotoCoreError) as exc:
        raise ArtifactError(f"Could not fetch {words.data} at {uri}: {exc}") from exc


@contextmanager
def _translate_upload_errors(path: Path, uri: str) -> Iterator[None]:
    """Turn the filesystem's and botocore's errors into ArtifactError, naming both ends."""
    try:
        yield
    except (OSError, BotoCoreError) as exc:
        raise ArtifactError(f"Could not upload {path} to {uri}: {exc}") from exc
