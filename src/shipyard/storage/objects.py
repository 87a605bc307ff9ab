"""ObjectStore: read and write single objects by URI, streaming, with bounded memory.

Asynchronous inference reads a request's input (up to 1 GB) from object storage and writes
the instance's answer back; neither is ever held whole in the gateway. A URI is
``s3://bucket/key``, ``file:///abs/path`` or a plain path, absolute or relative.

Guarantees:

- **The event loop never blocks on storage.** fsspec and the filesystem are synchronous,
  so every call that may wait runs in a worker thread (``asyncio.to_thread``). The
  synchronous methods (size, exists, read_bytes, delete) are for callers that are in a
  thread already, or wrap them in one.
- **Memory is bounded.** Reads come in chunks; an S3 write holds one part (8 MiB) and an
  S3 read one read-ahead block (8 MiB) at a time.
- **A write is whole or absent.** A local file is written to a hidden sibling and renamed
  into place once complete; an S3 object appears only when its single put or multipart
  upload completes, and a failed write aborts the upload instead. A retried write
  replaces the object whole. A process killed mid-write can leave a hidden
  ``.<name>.<random>.partial`` sibling behind, never a partial object.
- **A local write or delete follows no link below its root.** Its folder is reached
  from the root it was checked under one folder at a time, and the file is created,
  renamed and removed relative to that folder (Filesystems.local_target): a folder
  turned into a link after the check fails the write instead of leading it elsewhere.

Errors, translated here from the filesystem's, s3fs's and botocore's and chained with
``from exc``::

    Exception
     ├── NoSuchObject       a read names nothing
     └── ObjectStoreError   anything else: unreadable, unwritable, a folder, an
                            unsupported URI, a local path outside auth.file_roots,
                            larger than allowed
"""

from __future__ import annotations

import asyncio
import logging
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from shipyard.beneath import AtomicWrite, Beneath
from shipyard.errors import NoSuchObject, ObjectStoreError, UnsupportedLocation, UnsupportedScheme
from shipyard.storage.filesystems import S3_SCHEME, Filesystems, join_location, s3_path

logger = logging.getLogger(__name__)

_S3_PART_BYTES = 8 << 20
"""Bytes an S3 write buffers before sending them as one part (S3's minimum is 5 MiB)."""
_S3_READ_AHEAD_BYTES = 8 << 20
"""Bytes an S3 read fetches per request beyond what was asked, to need few requests."""
_WRITE_BATCH_BYTES = 1 << 20
"""Small chunks are gathered to about this size before each hop to a worker thread."""


class _NotAnObject(ObjectStoreError):
    """The URI names a folder (or S3 prefix), not an object."""


class _Sink(Protocol):
    """Where one write goes until commit() makes it visible or abort() drops it."""

    def write(self, chunk: bytes) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


class ObjectStore:
    """Reads and writes objects named by URI on local disk and S3, streaming.

    Args:
        s3_endpoint_url: an S3-compatible endpoint (MinIO, a test server) instead of AWS.
            Credentials and region come from the environment, as for any AWS client.
        filesystems: the storage layer to share with other stores, whose endpoint
            and ``file_roots`` then apply (every local URI this store reads, lists,
            writes or deletes is checked against them); built from ``s3_endpoint_url``
            when not given.
    """

    def __init__(
        self, *, s3_endpoint_url: str | None = None, filesystems: Filesystems | None = None
    ) -> None:
        self._filesystems = filesystems or Filesystems(s3_endpoint_url=s3_endpoint_url)

    def __repr__(self) -> str:
        return f"ObjectStore(s3_endpoint_url={self._filesystems.s3_endpoint_url!r})"

    def size(self, uri: str) -> int:
        """The object's size in bytes.

        Raises:
            NoSuchObject: nothing is at ``uri``.
            ObjectStoreError: ``uri`` names a folder, or storage could not be asked.
        """
        with _translate(uri, "read"):
            if uri.startswith(S3_SCHEME):
                info = self._s3().info(_s3_path(uri))
                if info["type"] != "file":
                    raise _NotAnObject(_folder_message(uri))
                return int(info["size"])
            status = self._local_path(uri).stat()
            if not stat.S_ISREG(status.st_mode):
                raise _NotAnObject(_folder_message(uri))
            return status.st_size

    def exists(self, uri: str) -> bool:
        """Whether ``uri`` names an object (a folder is none).

        Raises:
            ObjectStoreError: storage could not be asked.
        """
        try:
            self.size(uri)
        except (NoSuchObject, _NotAnObject):
            return False
        return True

    async def read_chunks(self, uri: str, *, chunk_bytes: int = 1 << 20) -> AsyncIterator[bytes]:
        """Yield the object's bytes in chunks of ``chunk_bytes`` (the last may be shorter).

        Nothing is opened until the first chunk is asked for; closing the iterator early
        closes the object. Two versions are never mixed: a local file replaced during
        the read (as write() replaces it) is read as it was, and an S3 object replaced
        during the read fails it with ObjectStoreError.

        Raises:
            NoSuchObject: nothing is at ``uri``.
            ObjectStoreError: it is a folder or could not be read.
        """
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
        file = await asyncio.to_thread(self._open_read, uri)
        try:
            while chunk := await asyncio.to_thread(_read, file, uri, chunk_bytes):
                yield chunk
        finally:
            file.close()  # read-only: drops a buffer or a descriptor, never waits on I/O

    def read_bytes(self, uri: str, *, limit: int) -> bytes:
        """The whole object, for small ones only.

        Raises:
            NoSuchObject: nothing is at ``uri``.
            ObjectStoreError: it is larger than ``limit`` bytes (nothing more than
                ``limit + 1`` bytes is read to find out), a folder, or unreadable.
        """
        with _translate(uri, "read"):
            with self._open_read(uri, read_ahead=False) as file:
                data: bytes = file.read(limit + 1)
        if len(data) > limit:
            raise ObjectStoreError(f"{uri} is larger than the {limit} bytes allowed here.")
        return data

    async def write(self, uri: str, chunks: AsyncIterator[bytes]) -> int:
        """Write the object at ``uri`` from ``chunks``; return how many bytes it holds.

        Whole or nothing (see the module docstring): an exception from ``chunks``, a
        storage failure or cancellation before the end leaves no object at ``uri``
        (an earlier object there stays as it was) and no temporary file. Cancelled while
        committing, the object may still appear, whole. Folders above a local path are
        created.

        Raises:
            ObjectStoreError: storage refused or failed; whatever ``chunks`` raises
                propagates unchanged.
        """
        sink = await asyncio.to_thread(self._open_sink, uri)
        written = 0
        try:
            async for batch in _batched(chunks, _WRITE_BATCH_BYTES):
                await asyncio.to_thread(sink.write, batch)
                written += len(batch)
            await asyncio.to_thread(sink.commit)
        except BaseException:
            # Runs to its end in its thread even if this task is cancelled again.
            await asyncio.to_thread(sink.abort)
            raise
        return written

    async def write_bytes(self, uri: str, data: bytes) -> None:
        """Write ``data`` as the object at ``uri``, whole or nothing, as write() does."""
        await self.write(uri, _single(data))

    def delete(self, uri: str) -> None:
        """Remove the object at ``uri``; nothing there is no error (as S3's DeleteObject).

        Raises:
            ObjectStoreError: it is a folder, or storage refused or failed.
        """
        with _translate(uri, "delete"):
            if uri.startswith(S3_SCHEME):
                self._s3().rm_file(_s3_path(uri))
            else:
                self._local_target(uri).unlink()

    def list_prefix(self, prefix: str) -> list[tuple[str, str]]:
        """Every object whose key starts with ``prefix``, as (URI, key relative to the
        prefix's folder), sorted by URI: S3Prefix's meaning.

        ``s3://b/in/`` and ``s3://b/in/da`` both list ``s3://b/in/data.csv``, relative
        ``data.csv``; objects in folders below keep their subfolders (``a/x.csv``). For a
        local prefix the same holds over files (a folder lists everything under it).

        Raises:
            ObjectStoreError: storage could not be asked.
        """
        with _translate(prefix, "list"):
            if prefix.startswith(S3_SCHEME):
                path = prefix.removeprefix(S3_SCHEME)
                path = path if "/" in path else path + "/"
                folder_path = path[: path.rfind("/") + 1]
                found = self._s3().find(folder_path.rstrip("/"))
                uris = [S3_SCHEME + key for key in found if key.startswith(path)]
                folder = S3_SCHEME + folder_path
            else:
                local = self._local_path(prefix)
                base = local if local.is_dir() else local.parent
                files = [
                    p for p in base.rglob("*") if p.is_file() and str(p).startswith(str(local))
                ]
                # Keys as names, not as parts of URIs: `a b.csv`, not `a%20b.csv`.
                return sorted((p.as_uri(), p.relative_to(base).as_posix()) for p in files)
        return sorted((uri, uri.removeprefix(folder)) for uri in uris)

    def join(self, prefix: str, key: str) -> str:
        """``<prefix>/<key>`` for S3 prefixes, file:// URIs and paths alike, ``key`` taken
        as a name (filesystems.join_location); ObjectStoreError for a key that would
        leave the prefix."""
        try:
            return join_location(prefix, key)
        except UnsupportedLocation as exc:
            raise ObjectStoreError(str(exc)) from None

    def _open_read(self, uri: str, *, read_ahead: bool = True) -> Any:
        with _translate(uri, "read"):
            if not uri.startswith(S3_SCHEME):
                return self._open_local(uri)  # the caller closes it
            file = self._s3().open(
                _s3_path(uri),
                "rb",
                block_size=_S3_READ_AHEAD_BYTES,
                cache_type="readahead" if read_ahead else "none",
            )
            if file.details.get("type") != "file":
                file.close()
                raise _NotAnObject(_folder_message(uri))
            return file

    def _open_sink(self, uri: str) -> _Sink:
        with _translate(uri, "write"):
            if uri.startswith(S3_SCHEME):
                return _S3Sink(uri, self._s3().open(_s3_path(uri), "wb", block_size=_S3_PART_BYTES))
            return _LocalSink(uri, self._local_target(uri).writer())

    def _s3(self) -> Any:
        return self._filesystems.s3()

    def _open_local(self, uri: str) -> BinaryIO:
        """``uri``'s local file, opened and then checked (Filesystems.open_local)."""
        with _located(uri):
            return self._filesystems.open_local(uri)

    def _local_target(self, uri: str) -> Beneath:
        """Where a local write or delete for ``uri`` goes, reached through no link below
        its root (Filesystems.local_target)."""
        with _located(uri):
            return self._filesystems.local_target(uri)

    def _local_path(self, uri: str) -> Path:
        """The local path of ``uri``, refused outside ``file_roots`` (filesystems.py)."""
        with _located(uri):
            return self._filesystems.local_file(uri)


@contextmanager
def _located(uri: str) -> Iterator[None]:
    """A location refused (another scheme, outside the roots) as this store's error."""
    try:
        yield
    except UnsupportedScheme as exc:
        # This store's own wording, older than the shared layer's ("or a local path").
        raise ObjectStoreError(
            f"{uri} has the unsupported scheme '{exc.scheme}'; use s3://, file:// or a path."
        ) from None
    except UnsupportedLocation as exc:
        raise ObjectStoreError(str(exc)) from None


class _LocalSink:
    """A local write (beneath.py's AtomicWrite: a hidden sibling file in the folder held
    open beneath its root, renamed over the target when complete), its errors this
    store's."""

    def __init__(self, uri: str, write: AtomicWrite) -> None:
        self._uri = uri
        self._write = write

    def write(self, chunk: bytes) -> None:
        with _translate(self._uri, "write"):
            self._write.write(chunk)

    def commit(self) -> None:
        with _translate(self._uri, "write"):
            self._write.commit()

    def abort(self) -> None:
        self._write.abort()


class _S3Sink:
    """An S3 write through s3fs's file object: one put, or a multipart upload.

    Never used as a context manager and never left to the garbage collector while open:
    s3fs *completes* the upload on close, so an error would publish a truncated object.
    abort() discards instead, and marks the file closed so its ``__del__`` cannot
    complete it later.
    """

    def __init__(self, uri: str, file: Any) -> None:
        self._uri = uri
        self._file = file
        self._lock = threading.Lock()
        self._done = False

    def write(self, chunk: bytes) -> None:
        with self._lock, _translate(self._uri, "write"):
            self._file.write(chunk)  # sends a part whenever 8 MiB are buffered

    def commit(self) -> None:
        with self._lock, _translate(self._uri, "write"):
            self._file.close()  # the single put, or completing the multipart upload
            self._done = True

    def abort(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                self._file.discard()  # aborts a multipart upload; nothing was put yet
            except Exception:
                # The incomplete upload stays invisible; a bucket lifecycle rule ends it.
                logger.warning("Could not abort the upload to %s", self._uri, exc_info=True)
            finally:
                self._file.closed = True


def _read(file: Any, uri: str, size: int) -> bytes:
    with _translate(uri, "read"):
        data: bytes = file.read(size)
        return data


async def _batched(chunks: AsyncIterator[bytes], at_least: int) -> AsyncIterator[bytes]:
    """``chunks`` gathered into pieces of at least ``at_least`` bytes (the last may be less).

    Network reads arrive in pieces of a few KB; one thread hop per piece would cost more
    than the write. Holds at most ``at_least`` plus one chunk.
    """
    pending: list[bytes] = []
    size = 0
    async for chunk in chunks:
        if len(chunk) >= at_least and not pending:
            yield chunk
            continue
        pending.append(chunk)
        size += len(chunk)
        if size >= at_least:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


async def _single(data: bytes) -> AsyncIterator[bytes]:
    yield data


@contextmanager
def _translate(uri: str, action: str) -> Iterator[None]:
    """Turn the filesystem's, s3fs's and botocore's errors into ours, naming ``uri``.

    A missing file or key is NoSuchObject only when reading: a write or delete that
    finds nothing (a missing bucket) has failed, not found an answer.
    """
    try:
        yield
    except FileNotFoundError as exc:
        if action == "read":
            raise NoSuchObject(f"Could not find {uri}.") from exc
        raise ObjectStoreError(f"Could not {action} {uri}: {_cause(exc)}") from exc
    except IsADirectoryError as exc:
        raise _NotAnObject(_folder_message(uri)) from exc
    except PermissionError as exc:
        raise ObjectStoreError(f"Access to {uri} was denied: {_cause(exc)}") from exc
    except (OSError, BotoCoreError, ClientError) as exc:
        raise ObjectStoreError(f"Could not {action} {uri}: {_cause(exc)}") from exc


def _cause(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _folder_message(uri: str) -> str:
    return f"{uri} names a folder, not an object."


def _s3_path(uri: str) -> str:
    """``bucket/key`` of an ``s3://`` URI, refusing one that names no key."""
    try:
        return s3_path(uri, object_key=True)
    except UnsupportedLocation as exc:
        raise ObjectStoreError(str(exc)) from None
