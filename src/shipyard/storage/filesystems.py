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
place atomically (``os.replace`` of a sibling file), ``flock`` on a lock file beside a
fetched folder, and the standard library's tar extraction filter over real paths.

Errors are ``UnsupportedLocation`` with a message that names the URI and what to write
instead; each store prefixes it with its own subject ("Model data ...").
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import fsspec.core

S3_SCHEME = "s3://"


class UnsupportedLocation(ValueError):
    """A URI that names no local path or S3 location; the message says what to write."""


class UnsupportedScheme(UnsupportedLocation):
    """A URI with a scheme other than ``s3`` or ``file``; ``scheme`` is the one it has."""

    def __init__(self, uri: str, scheme: str) -> None:
        super().__init__(
            f"{uri} has the unsupported scheme '{scheme}'; use s3://, file:// or a local path."
        )
        self.scheme = scheme


def local_path(uri: str) -> Path:
    """The local path of a ``file://`` URI or a plain path."""
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
    """

    def __init__(self, *, s3_endpoint_url: str | None = None) -> None:
        self.s3_endpoint_url = s3_endpoint_url
        self._s3: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Filesystems(s3_endpoint_url={self.s3_endpoint_url!r})"

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
