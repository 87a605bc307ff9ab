"""Every local write and delete made for a caller goes beneath its root through no link.

A location is checked against ``auth.file_roots`` when the write begins; a sandboxed job
that writes a folder under a root can turn a folder below it into a link after that
check. These tests make the job's move at a fixed point after the check (no timing):
between the check and an answer's first bytes (transform and async outputs, which
stream), or just after the check itself (``Racing``: failure files, capture files,
uploads and deletes, which write at once). Nothing may land outside the roots.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shipyard.beneath import Beneath
from shipyard.capture.config import CaptureConfig
from shipyard.capture.jsonl import Captured
from shipyard.capture.writer import CaptureWriter
from shipyard.errors import ArtifactError, LinkRefused, ObjectStoreError
from shipyard.metrics import Metrics
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.filesystems import FileRoots, Filesystems
from shipyard.storage.objects import ObjectStore


class Racing(Filesystems):
    """The store's filesystems, where ``then`` (the job's move) runs once, just after a
    location is checked: the worst moment for the write that follows."""

    def __init__(self, roots: list[Path], then: Callable[[], None]) -> None:
        super().__init__(file_roots=FileRoots(roots))
        self._then: Callable[[], None] | None = then

    def local_file(self, uri: str) -> Path:
        path = super().local_file(uri)
        then, self._then = self._then, None
        if then is not None:
            then()
        return path


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """``root`` (the only file root) and ``outside`` beside it, both empty."""
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    return tmp_path


def linked(folder: Path, to: Path) -> Callable[[], None]:
    """The job's move: ``folder`` (made if missing) becomes a link to ``to``."""

    def move() -> None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.is_dir() and not folder.is_symlink():
            folder.rename(folder.with_name(folder.name + ".was"))
        folder.symlink_to(to, target_is_directory=True)

    return move


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


async def answer(before: Callable[[], None], *chunks: bytes) -> AsyncIterator[bytes]:
    """A model's answer, streamed; ``before`` runs before its first bytes arrive."""
    before()
    for chunk in chunks:
        yield chunk


@pytest.mark.parametrize("depth", ["out", "out/job", "out/job/sub"])
def test_a_folder_linked_out_while_an_answer_streams_is_not_followed(
    place: Path, depth: str
) -> None:
    """Transform and async outputs: the write is checked, the model answers slowly, and
    meanwhile a folder on the way (new or not) becomes a link out of the roots."""
    root, outside = place / "root", place / "outside"
    (root / "out" / "job").mkdir(parents=True)
    store = ObjectStore(filesystems=Filesystems(file_roots=FileRoots([root])))
    uri = (root / "out" / "job" / "sub" / "in.csv.out").as_uri()
    with pytest.raises(ObjectStoreError, match="is a link or no folder") as refused:
        asyncio.run(store.write(uri, answer(linked(root / depth, outside), b"attacker's")))
    assert uri in str(refused.value) and isinstance(refused.value.__cause__, LinkRefused)
    assert files(outside) == []
    assert not any(".partial" in name for name in files(root))


def test_failure_files_capture_files_and_deletes_refuse_a_link_made_after_the_check(
    place: Path,
) -> None:
    """Async failure files and deletes: the link is made right after the check."""
    root, outside = place / "root", place / "outside"
    (outside / "kept.out").write_text("the gateway's own")

    def store(move: Callable[[], None]) -> ObjectStore:
        return ObjectStore(filesystems=Racing([root], move))

    failure = (root / "failures" / "r1" / "x.out").as_uri()
    with pytest.raises(ObjectStoreError):
        asyncio.run(store(linked(root / "failures" / "r1", outside)).write_bytes(failure, b"e"))
    (root / "gone").mkdir()
    (root / "gone" / "kept.out").write_text("the caller's")
    output = (root / "gone" / "kept.out").as_uri()
    with pytest.raises(ObjectStoreError):
        store(linked(root / "gone", outside)).delete(output)
    assert files(outside) == ["kept.out"]
    assert (outside / "kept.out").read_text() == "the gateway's own"


def test_a_capture_file_is_not_written_through_a_link_made_after_the_check(
    place: Path,
) -> None:
    root, outside = place / "root", place / "outside"
    objects = ObjectStore(filesystems=Racing([root], linked(root / "capture" / "ep", outside)))
    metrics = Metrics()
    writer = CaptureWriter(objects=objects, metrics=metrics)
    config = CaptureConfig(
        enabled=True,
        sampling_percentage=100,
        destination=(root / "capture").as_uri(),
        capture_input=True,
        capture_output=True,
    )
    variant = writer.for_variant("ep", "v1", config)
    assert variant is not None
    record = Captured(
        at=time.time(),
        inference_id="i1",
        input=b"{}",
        input_type="application/json",
        output=b"1",
        output_type="text/csv",
    )
    writer.put(variant, record)
    asyncio.run(writer.flush())
    failed = {"endpoint": "ep", "variant": "v1", "outcome": "failed"}
    assert metrics.registry.get_sample_value("shipyard_capture_records_total", failed) == 1
    assert files(outside) == []


def test_a_jobs_upload_is_not_written_through_a_link_made_after_the_check(
    place: Path,
) -> None:
    root, outside = place / "root", place / "outside"
    model = place / "model.tar.gz"
    model.write_bytes(b"weights")
    store = ArtifactStore(filesystems=Racing([root], linked(root / "train" / "out", outside)))
    with pytest.raises(ArtifactError, match="auth.file_roots"):
        store.upload_file(model, (root / "train" / "out" / "model.tar.gz").as_uri())
    assert files(outside) == []


def test_a_write_lands_whole_beneath_its_root_and_replaces_a_link_in_its_place(
    place: Path,
) -> None:
    """The walk changes nothing for a plain write; a link in place of the file itself
    is replaced, not followed (as a rename over it always did)."""
    root, outside = place / "root", place / "outside"
    (outside / "target").write_text("not this")
    store = ObjectStore(filesystems=Filesystems(file_roots=FileRoots([root])))
    (root / "out").mkdir()
    (root / "out" / "x.out").symlink_to(root / "elsewhere")
    asyncio.run(store.write_bytes((root / "out" / "x.out").as_uri(), b"mine"))
    assert (root / "out" / "x.out").read_bytes() == b"mine"
    assert not (root / "out" / "x.out").is_symlink()
    asyncio.run(store.write_bytes((root / "a" / "b" / "y.out").as_uri(), b"deep"))
    assert files(root) == ["a/b/y.out", "out/x.out"]
    assert (outside / "target").read_text() == "not this"


def test_without_roots_the_users_own_links_are_followed_and_a_swapped_one_is_not(
    place: Path,
) -> None:
    """No ``auth:``: a link that is there when the write begins is the user's (a data
    folder linked elsewhere) and is followed; one made during the write is not."""
    data, outside = place / "root", place / "outside"
    (place / "mine").symlink_to(data, target_is_directory=True)
    store = ObjectStore()
    asyncio.run(store.write_bytes(str(place / "mine" / "out" / "x.out"), b"ok"))
    assert (data / "out" / "x.out").read_bytes() == b"ok"
    with pytest.raises(ObjectStoreError, match="is a link or no folder"):
        uri = str(place / "mine" / "out" / "late" / "y.out")
        asyncio.run(store.write(uri, answer(linked(data / "out" / "late", outside), b"x")))
    assert files(outside) == []


def test_the_walk_refuses_a_link_at_any_depth_and_deletes_only_the_name(place: Path) -> None:
    root, outside = place / "root", place / "outside"
    (root / "a" / "b").mkdir(parents=True)
    (outside / "f").write_text("outside")
    (root / "a" / "b" / "f").symlink_to(outside / "f")
    Beneath(root, ("a", "b"), "f").unlink()  # the link itself, not what it points to
    assert not os.path.lexists(root / "a" / "b" / "f") and (outside / "f").exists()
    Beneath(root, ("a", "missing"), "f").unlink()  # nothing there: no error
    (root / "a" / "b").rename(root / "a" / "was")
    (root / "a" / "b").symlink_to(outside)
    for parts in [("a", "b"), ("a", "b", "c")]:
        write = Beneath(root, parts, "f").writer()
        with pytest.raises(LinkRefused, match=r"root/a/b is a link or no folder"):
            write.write(b"x")
        write.abort()
        with pytest.raises(LinkRefused):
            Beneath(root, parts, "f").unlink()
    assert files(outside) == ["f"]
    with pytest.raises(ValueError):
        Beneath(root, ("..",), "f").writer().write(b"x")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_a_folder_that_may_be_passed_but_not_listed_is_written_through(place: Path) -> None:
    """Folders on the way are opened as places, not read: a write through a folder of
    mode 0711 (a home folder, often) works as a write by path did."""
    passage = place / "root" / "passage"
    (passage / "out").mkdir(parents=True)
    passage.chmod(0o311)
    try:
        store = ObjectStore(filesystems=Filesystems(file_roots=FileRoots([place / "root"])))
        asyncio.run(store.write_bytes(str(passage / "out" / "x.out"), b"through"))
        store.delete(str(passage / "out" / "x.out"))
    finally:
        passage.chmod(0o755)
    assert files(passage) == []
