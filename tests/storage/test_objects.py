"""ObjectStore on local paths, file:// URIs and S3 (moto's server, over real HTTP)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shipyard.errors import NoSuchObject, ObjectStoreError
from shipyard.storage.objects import ObjectStore
from tests.conftest import Bucket

MiB = 1 << 20


@dataclass
class Place:
    """Where a test reads and writes: a store, a prefix URI, and what lies under it."""

    store: ObjectStore
    root: str
    leftovers: Callable[[], list[str]]
    """Everything stored under ``root``: hidden temporary files and open uploads too."""

    def uri(self, name: str) -> str:
        return self.store.join(self.root, name)


@pytest.fixture(params=["path", "file-uri", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "s3":
        bucket: Bucket = request.getfixturevalue("bucket")
        return Place(
            ObjectStore(s3_endpoint_url=bucket.endpoint_url),
            f"s3://{bucket.name}/out",
            lambda: _bucket_contents(bucket),
        )
    root = tmp_path / "objects"
    root.mkdir()
    uri = str(root) if request.param == "path" else root.as_uri()
    return Place(
        ObjectStore(),
        uri,
        lambda: sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()),
    )


def _bucket_contents(bucket: Bucket) -> list[str]:
    objects = bucket.client.list_objects_v2(Bucket=bucket.name).get("Contents", [])
    uploads = bucket.client.list_multipart_uploads(Bucket=bucket.name).get("Uploads", [])
    return sorted([o["Key"] for o in objects] + [f"upload of {u['Key']}" for u in uploads])


def payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(251)) * (size // 251) + b"t" * (size % 251)


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def failing_after(data: bytes, size: int) -> AsyncIterator[bytes]:
    async for piece in pieces(data, size):
        yield piece
    raise RuntimeError("the instance went away")


async def read_all(store: ObjectStore, uri: str, chunk_bytes: int = MiB) -> list[bytes]:
    return [chunk async for chunk in store.read_chunks(uri, chunk_bytes=chunk_bytes)]


def test_an_object_written_in_chunks_reads_back_whole(place: Place) -> None:
    data = payload(3 * MiB + 12345)
    uri = place.uri("nested/folders/result.out")
    written = asyncio.run(place.store.write(uri, pieces(data, 100_000)))
    assert written == len(data)
    assert place.store.size(uri) == len(data)
    assert place.store.exists(uri)
    chunks = asyncio.run(read_all(place.store, uri, chunk_bytes=256 * 1024))
    assert b"".join(chunks) == data
    assert {len(c) for c in chunks[:-1]} == {256 * 1024}
    assert place.leftovers() == [_key(place, "nested/folders/result.out")]


def test_a_multipart_sized_object_round_trips(place: Place) -> None:
    """Larger than one S3 part (8 MiB), so the upload is multipart."""
    data = payload(19 * MiB)
    uri = place.uri("big.out")
    assert asyncio.run(place.store.write(uri, pieces(data, MiB))) == len(data)
    assert b"".join(asyncio.run(read_all(place.store, uri))) == data
    assert place.leftovers() == [_key(place, "big.out")]


def test_small_and_empty_objects(place: Place) -> None:
    asyncio.run(place.store.write_bytes(place.uri("small"), b"a failure reason"))
    asyncio.run(place.store.write_bytes(place.uri("empty"), b""))
    assert place.store.read_bytes(place.uri("small"), limit=16) == b"a failure reason"
    assert place.store.read_bytes(place.uri("empty"), limit=0) == b""
    assert place.store.size(place.uri("empty")) == 0
    assert asyncio.run(read_all(place.store, place.uri("empty"))) == []


def test_read_bytes_refuses_an_object_over_its_limit(place: Place) -> None:
    uri = place.uri("large")
    asyncio.run(place.store.write_bytes(uri, b"x" * 1000))
    with pytest.raises(ObjectStoreError, match="larger than the 999 bytes") as err:
        place.store.read_bytes(uri, limit=999)
    assert uri in str(err.value)


def test_a_write_replaces_an_earlier_object_whole(place: Place) -> None:
    uri = place.uri("result.out")
    asyncio.run(place.store.write_bytes(uri, b"old and longer than the new one"))
    asyncio.run(place.store.write(uri, pieces(b"new", 1)))
    assert place.store.read_bytes(uri, limit=100) == b"new"
    assert place.leftovers() == [_key(place, "result.out")]


@pytest.mark.parametrize("size", [3 * MiB, 12 * MiB], ids=["one-put", "multipart"])
def test_a_write_that_fails_midway_leaves_nothing(place: Place, size: int) -> None:
    uri = place.uri("result.out")
    with pytest.raises(RuntimeError, match="the instance went away"):
        asyncio.run(place.store.write(uri, failing_after(payload(size), MiB)))
    assert not place.store.exists(uri)
    assert place.leftovers() == []


def test_a_failed_write_keeps_the_earlier_object(place: Place) -> None:
    uri = place.uri("result.out")
    asyncio.run(place.store.write_bytes(uri, b"earlier"))
    with pytest.raises(RuntimeError):
        asyncio.run(place.store.write(uri, failing_after(payload(10 * MiB), MiB)))
    assert place.store.read_bytes(uri, limit=100) == b"earlier"
    assert place.leftovers() == [_key(place, "result.out")]


def test_a_cancelled_write_leaves_nothing(place: Place) -> None:
    uri = place.uri("result.out")
    started = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        chunk = b"c" * MiB
        for i in range(10_000):
            if i == 10:
                started.set()
            yield chunk
            await asyncio.sleep(0)

    async def main() -> None:
        task = asyncio.create_task(place.store.write(uri, endless()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert place.leftovers() == []


def test_a_missing_object_is_object_not_found(place: Place) -> None:
    uri = place.uri("nothing-here")
    assert not place.store.exists(uri)
    with pytest.raises(NoSuchObject, match="nothing-here"):
        place.store.size(uri)
    with pytest.raises(NoSuchObject, match="nothing-here"):
        place.store.read_bytes(uri, limit=10)
    with pytest.raises(NoSuchObject, match="nothing-here") as err:
        asyncio.run(read_all(place.store, uri))
    assert isinstance(err.value.__cause__, FileNotFoundError)


def test_a_folder_is_not_an_object(place: Place) -> None:
    asyncio.run(place.store.write_bytes(place.uri("folder/inside"), b"x"))
    folder = place.uri("folder")
    assert not place.store.exists(folder)
    with pytest.raises(ObjectStoreError, match="names a folder"):
        place.store.size(folder)
    with pytest.raises(ObjectStoreError, match="names a folder"):
        asyncio.run(read_all(place.store, folder))


def test_delete_removes_an_object_and_ignores_a_missing_one(place: Place) -> None:
    uri = place.uri("result.out")
    asyncio.run(place.store.write_bytes(uri, b"x"))
    place.store.delete(uri)
    assert not place.store.exists(uri)
    place.store.delete(uri)
    assert place.leftovers() == []


def test_reading_stopped_early_can_be_closed(place: Place) -> None:
    uri = place.uri("result.out")
    asyncio.run(place.store.write(uri, pieces(payload(3 * MiB), MiB)))

    async def first_chunk() -> bytes:
        chunks = place.store.read_chunks(uri)
        try:
            return await anext(chunks)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    assert len(asyncio.run(first_chunk())) == MiB


def test_an_object_replaced_during_a_read_is_never_mixed(place: Place) -> None:
    """Locally the reader keeps the old file; on S3 the next ranged GET fails."""
    uri = place.uri("input")
    old = payload(20 * MiB)
    asyncio.run(place.store.write(uri, pieces(old, MiB)))

    async def read_while_replaced() -> bytes:
        chunks = place.store.read_chunks(uri)
        received = [await anext(chunks)]
        await place.store.write_bytes(uri, b"new")
        received += [chunk async for chunk in chunks]
        return b"".join(received)

    if place.root.startswith("s3://"):
        with pytest.raises(ObjectStoreError, match="input"):
            asyncio.run(read_while_replaced())
    else:
        assert asyncio.run(read_while_replaced()) == old


def test_a_relative_path_is_relative_to_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = ObjectStore()
    asyncio.run(store.write_bytes("out/result.out", b"here"))
    assert (tmp_path / "out" / "result.out").read_bytes() == b"here"
    assert store.size("out/result.out") == 4


def test_a_local_write_streams_with_bounded_memory(tmp_path: Path) -> None:
    """128 MB go through to disk and back while the process grows by far less."""
    store = ObjectStore()
    uri = str(tmp_path / "big.out")
    total = 128

    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    async def main() -> int:
        baseline = peak = rss()

        async def produce() -> AsyncIterator[bytes]:
            nonlocal peak
            for i in range(total):
                yield bytes([i]) * MiB
                peak = max(peak, rss())

        assert await store.write(uri, produce()) == total * MiB
        count = 0
        async for chunk in store.read_chunks(uri):
            assert chunk == bytes([count // MiB]) * MiB
            count += len(chunk)
            peak = max(peak, rss())
        assert count == total * MiB
        return peak - baseline

    assert asyncio.run(main()) < 32 * MiB


def test_a_missing_bucket_is_not_found_on_read_and_an_error_on_write(bucket: Bucket) -> None:
    store = ObjectStore(s3_endpoint_url=bucket.endpoint_url)
    uri = f"s3://{bucket.name}-absent/result.out"
    with pytest.raises(NoSuchObject):
        store.size(uri)
    with pytest.raises(ObjectStoreError, match="Could not write") as err:
        asyncio.run(store.write_bytes(uri, b"x"))
    assert not isinstance(err.value, NoSuchObject)
    assert uri in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_a_local_permission_error_is_an_object_store_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ObjectStoreError, match="denied"):
        asyncio.run(ObjectStore().write_bytes(str(locked / "x"), b"x"))


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://example.com/x", "unsupported scheme 'http'"),
        ("file://otherhost/x", "not a local file URI"),
        ("s3://just-a-bucket", "names no object"),
        ("s3:///key", "names no object"),
    ],
)
def test_an_unusable_uri_is_an_object_store_error(uri: str, message: str) -> None:
    store = ObjectStore()
    with pytest.raises(ObjectStoreError, match=message):
        store.size(uri)
    with pytest.raises(ObjectStoreError, match=message):
        asyncio.run(store.write_bytes(uri, b"x"))


@pytest.mark.parametrize(
    ("prefix", "name", "joined"),
    [
        ("s3://b/out", "x.out", "s3://b/out/x.out"),
        ("s3://b/out/", "x.out", "s3://b/out/x.out"),
        ("file:///data/out", "x.out", "file:///data/out/x.out"),
        ("file:///", "x.out", "file:///x.out"),
        ("/data/out/", "/x.out", "/data/out/x.out"),
        ("/", "x.out", "/x.out"),
        ("out", "sub/x.out", "out/sub/x.out"),
    ],
)
def test_join(prefix: str, name: str, joined: str) -> None:
    assert ObjectStore().join(prefix, name) == joined


def _key(place: Place, name: str) -> str:
    """How ``leftovers`` lists the object ``name`` written under ``place.root``."""
    return f"out/{name}" if place.root.startswith("s3://") else name
