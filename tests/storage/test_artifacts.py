"""ArtifactStore.fetch_model: local paths, file:// and s3:// sources; safety; atomicity."""

from __future__ import annotations

import io
import os
import re
import tarfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest

from shipyard.errors import ArtifactError
from shipyard.storage import artifacts
from shipyard.storage.artifacts import COMPLETE_MARKER, ArtifactStore

if TYPE_CHECKING:
    from tests.storage.conftest import Bucket

WriteMode = Literal["w", "w:gz", "w:bz2"]

INFERENCE_PY = b"def model_fn(model_dir):\n    return 'model'\n"
WEIGHTS = b"\x00\x01weights\x02"


# -- helpers -------------------------------------------------------------------------------


def make_model_dir(root: Path) -> Path:
    """A small SageMaker-style model folder: code/inference.py and a weights file."""
    (root / "code").mkdir(parents=True)
    (root / "code" / "inference.py").write_bytes(INFERENCE_PY)
    (root / "model.bin").write_bytes(WEIGHTS)
    return root


def make_model_tar(path: Path, mode: WriteMode = "w:gz") -> Path:
    """Pack a model folder the way SageMaker users do: ``tar czf model.tar.gz -C dir .``."""
    source = make_model_dir(path.parent / f"{path.name}.contents")
    with tarfile.open(path, mode) as tar:
        tar.add(source, arcname=".")
    return path


def file_member(name: str, data: bytes = b"evil") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def link_member(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, b""


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """Write a .tar.gz holding exactly ``members``, however hostile their names."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def snapshot(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def assert_failed_cleanly(dest: Path, before: set[Path], root: Path) -> None:
    """After a failed fetch, dest is absent and nothing but its lock file is new."""
    assert not dest.exists()
    new = snapshot(root) - before
    assert new <= {dest.parent, dest.parent / f".{dest.name}.lock"}, new


@pytest.fixture
def store() -> ArtifactStore:
    return ArtifactStore()


@pytest.fixture
def s3_store(bucket: Bucket) -> ArtifactStore:
    return ArtifactStore(s3_endpoint_url=bucket.endpoint_url)


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "model"


def assert_holds_model(dest: Path) -> None:
    assert (dest / "code" / "inference.py").read_bytes() == INFERENCE_PY
    assert (dest / "model.bin").read_bytes() == WEIGHTS
    assert (dest / COMPLETE_MARKER).is_file()


# -- local sources -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "mode"),
    [("model.tar.gz", "w:gz"), ("model.tgz", "w:gz"), ("model.tar", "w"), ("model", "w:bz2")],
)
def test_fetches_an_archive_named_by_a_plain_path(
    store: ArtifactStore, tmp_path: Path, dest: Path, name: str, mode: WriteMode
) -> None:
    archive = make_model_tar(tmp_path / name, mode)

    assert store.fetch_model(str(archive), dest) == dest

    assert_holds_model(dest)


def test_fetches_an_archive_named_by_a_file_uri(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    archive = make_model_tar(tmp_path / "my model.tar.gz")  # the URI escapes the space

    store.fetch_model(archive.as_uri(), dest)

    assert_holds_model(dest)


def test_copies_a_directory(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    source = make_model_dir(tmp_path / "src")

    store.fetch_model(str(source), dest)

    assert_holds_model(dest)
    assert (source / "model.bin").exists()  # copied, not moved


def test_copies_a_directory_named_by_a_file_uri(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    source = make_model_dir(tmp_path / "src")

    store.fetch_model(source.as_uri() + "/", dest)

    assert_holds_model(dest)


def test_a_directory_copy_replaces_symlinks_by_their_content(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    """A link out of the source folder must not become a link out of dest."""
    source = make_model_dir(tmp_path / "src")
    (tmp_path / "shared.bin").write_bytes(b"shared")
    (source / "shared.bin").symlink_to(tmp_path / "shared.bin")

    store.fetch_model(str(source), dest)

    assert not (dest / "shared.bin").is_symlink()
    assert (dest / "shared.bin").read_bytes() == b"shared"


@pytest.mark.parametrize("target", [".", "..", "../sub"])
def test_a_folder_reached_twice_through_links_is_refused(
    store: ArtifactStore, tmp_path: Path, dest: Path, target: str
) -> None:
    """A link to the folder itself or above it would be copied without end (two such
    links grow it exponentially), and two links to one folder copy it twice."""
    source = make_model_dir(tmp_path / "src")
    (source / "sub").mkdir()
    (source / "sub" / "a").symlink_to(target)
    if target == "../sub":
        (source / "b").symlink_to("sub")

    with pytest.raises(ArtifactError, match="reached twice through links"):
        store.fetch_model(str(source), dest)

    assert not dest.exists()
    with pytest.raises(ArtifactError, match="reached twice through links"):
        store.download(str(source), tmp_path / "channel")


def test_a_second_fetch_returns_the_complete_copy_without_reading_the_source(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    archive = make_model_tar(tmp_path / "model.tar.gz")
    store.fetch_model(str(archive), dest)
    archive.unlink()  # a second download would now fail

    assert store.fetch_model(str(archive), dest) == dest

    assert_holds_model(dest)


def test_an_incomplete_dest_is_replaced(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    archive = make_model_tar(tmp_path / "model.tar.gz")
    dest.mkdir(parents=True)
    (dest / "half-written.bin").write_bytes(b"junk")

    store.fetch_model(str(archive), dest)

    assert_holds_model(dest)
    assert not (dest / "half-written.bin").exists()


def test_leftovers_of_a_crashed_fetch_are_cleared(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    archive = make_model_tar(tmp_path / "model.tar.gz")
    staging = dest.parent / f".{dest.name}.partial"
    (staging / "model").mkdir(parents=True)
    (staging / "model" / "stale.bin").write_bytes(b"stale")

    store.fetch_model(str(archive), dest)

    assert_holds_model(dest)
    assert not (dest / "stale.bin").exists()
    assert not staging.exists()


def test_a_failed_fetch_removes_an_incomplete_dest(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    """So that a retry after fixing the model data starts from nothing."""
    dest.mkdir(parents=True)
    (dest / "half-written.bin").write_bytes(b"junk")

    with pytest.raises(ArtifactError):
        store.fetch_model(str(tmp_path / "missing.tar.gz"), dest)

    assert not dest.exists()


def test_concurrent_fetches_of_one_dest_all_get_the_complete_model(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    archive = make_model_tar(tmp_path / "model.tar.gz")
    results: list[Path | BaseException] = []

    def fetch() -> None:
        try:
            results.append(store.fetch_model(str(archive), dest))
        except BaseException as exc:  # reported by the assertion below
            results.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [dest] * 6
    assert_holds_model(dest)
    assert not (dest.parent / f".{dest.name}.partial").exists()


# -- what is wrong with the model data -----------------------------------------------------


def test_a_missing_path_is_reported(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    before = snapshot(tmp_path)
    uri = str(tmp_path / "nope" / "model.tar.gz")

    with pytest.raises(ArtifactError, match=f"^Could not find model data at {re.escape(uri)}.$"):
        store.fetch_model(uri, dest)

    assert_failed_cleanly(dest, before, tmp_path)


def test_a_missing_file_uri_is_reported(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    uri = (tmp_path / "nope.tar.gz").as_uri()

    with pytest.raises(ArtifactError, match=f"^Could not find model data at {re.escape(uri)}.$"):
        store.fetch_model(uri, dest)


@pytest.mark.parametrize(
    "content",
    [b"this is not a tar archive", b"", b"\x1f\x8b\x08\x00garbage-after-gzip-magic"],
    ids=["text", "empty-file", "bad-gzip"],
)
def test_a_file_that_is_not_an_archive_is_reported(
    store: ArtifactStore, tmp_path: Path, dest: Path, content: bytes
) -> None:
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(content)
    before = snapshot(tmp_path)

    with pytest.raises(
        ArtifactError, match=f"^Model data {re.escape(str(archive))} is not a valid tar archive"
    ):
        store.fetch_model(str(archive), dest)

    assert_failed_cleanly(dest, before, tmp_path)


def test_a_truncated_archive_is_reported(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "model.tar.gz"
    write_tar(archive, [file_member("model.bin", os.urandom(64 * 1024))])
    archive.write_bytes(archive.read_bytes()[:-20_000])

    with pytest.raises(ArtifactError, match="is not a valid tar archive"):
        store.fetch_model(str(archive), dest)

    assert not dest.exists()


def test_a_corrupt_payload_is_caught_by_the_gzip_checksum(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    """Random bytes are stored uncompressed, so a flipped byte decodes fine: only the CRC
    in gzip's trailer, which tarfile alone never reads, can tell."""
    archive = tmp_path / "model.tar.gz"
    write_tar(archive, [file_member("model.bin", os.urandom(64 * 1024))])
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))

    with pytest.raises(ArtifactError, match="is not a valid tar archive"):
        store.fetch_model(str(archive), dest)

    assert not dest.exists()


def test_an_empty_directory_is_reported(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    source = tmp_path / "empty"
    source.mkdir()

    with pytest.raises(ArtifactError, match=f"^Model data {re.escape(str(source))} is empty"):
        store.fetch_model(str(source), dest)

    assert not dest.exists()


def test_an_empty_archive_is_reported(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    archive = write_tar(tmp_path / "model.tar.gz", [])

    with pytest.raises(ArtifactError, match="is empty"):
        store.fetch_model(str(archive), dest)


@pytest.mark.parametrize("uri", ["http://example.com/model.tar.gz", "gs://bucket/model.tar.gz"])
def test_an_unsupported_scheme_is_reported(store: ArtifactStore, dest: Path, uri: str) -> None:
    with pytest.raises(
        ArtifactError, match=f"^Model data {re.escape(uri)} has the unsupported scheme"
    ):
        store.fetch_model(uri, dest)


def test_a_remote_file_uri_is_reported(store: ArtifactStore, dest: Path) -> None:
    with pytest.raises(ArtifactError, match="is not a local file URI"):
        store.fetch_model("file://otherhost/model.tar.gz", dest)


# -- hostile archives ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../escaped.txt", "code/../../../escaped.txt"])
def test_a_member_escaping_dest_is_refused(
    store: ArtifactStore, tmp_path: Path, dest: Path, name: str
) -> None:
    archive = write_tar(
        tmp_path / "model.tar.gz", [file_member("model.bin", WEIGHTS), file_member(name)]
    )
    before = snapshot(tmp_path)

    with pytest.raises(ArtifactError) as caught:
        store.fetch_model(str(archive), dest)

    assert str(caught.value) == (
        f"Model data {archive} is unsafe: member {name!r} would be written outside the "
        "model directory."
    )
    assert isinstance(caught.value.__cause__, tarfile.OutsideDestinationError)
    assert_failed_cleanly(dest, before, tmp_path)


def test_an_absolute_member_lands_inside_dest(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    """The data filter strips the leading '/', as GNU tar does, rather than obey it."""
    target = tmp_path / "outside" / "evil.txt"
    archive = write_tar(tmp_path / "model.tar.gz", [file_member(str(target))])

    store.fetch_model(str(archive), dest)

    assert not target.exists()
    assert (dest / str(target).lstrip("/")).read_bytes() == b"evil"


@pytest.mark.parametrize(
    ("linkname", "problem"),
    [
        ("../../outside.txt", "links to '../../outside.txt', outside the model directory"),
        ("/etc/passwd", "links to the absolute path '/etc/passwd'"),
    ],
)
def test_a_symlink_pointing_outside_is_refused(
    store: ArtifactStore, tmp_path: Path, dest: Path, linkname: str, problem: str
) -> None:
    archive = write_tar(
        tmp_path / "model.tar.gz", [link_member("code/link", linkname, tarfile.SYMTYPE)]
    )
    before = snapshot(tmp_path)

    with pytest.raises(ArtifactError) as caught:
        store.fetch_model(str(archive), dest)

    assert str(caught.value) == f"Model data {archive} is unsafe: member 'code/link' {problem}."
    assert_failed_cleanly(dest, before, tmp_path)


def test_a_symlink_then_a_write_through_it_is_refused(
    store: ArtifactStore, tmp_path: Path, dest: Path
) -> None:
    """The classic two-step escape: a link to '..', then a file written 'inside' the link."""
    archive = write_tar(
        tmp_path / "model.tar.gz",
        [link_member("up", "..", tarfile.SYMTYPE), file_member("up/escaped.txt")],
    )
    before = snapshot(tmp_path)

    with pytest.raises(ArtifactError, match="is unsafe: member 'up' links to '..'"):
        store.fetch_model(str(archive), dest)

    assert_failed_cleanly(dest, before, tmp_path)


def test_a_symlink_inside_dest_is_kept(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    archive = write_tar(
        tmp_path / "model.tar.gz",
        [
            file_member("model.bin", WEIGHTS),
            link_member("latest.bin", "model.bin", tarfile.SYMTYPE),
        ],
    )

    store.fetch_model(str(archive), dest)

    assert (dest / "latest.bin").is_symlink()
    assert (dest / "latest.bin").read_bytes() == WEIGHTS


@pytest.mark.parametrize("linkname", ["../../outside.txt", "/etc/passwd"])
def test_a_hardlink_pointing_outside_is_refused(
    store: ArtifactStore, tmp_path: Path, dest: Path, linkname: str
) -> None:
    (tmp_path / "outside.txt").write_bytes(b"secret")
    archive = write_tar(
        tmp_path / "model.tar.gz", [link_member("code/link", linkname, tarfile.LNKTYPE)]
    )
    before = snapshot(tmp_path)

    with pytest.raises(
        ArtifactError, match=f"^Model data {re.escape(str(archive))} is unsafe: member 'code/link'"
    ):
        store.fetch_model(str(archive), dest)

    assert_failed_cleanly(dest, before, tmp_path)


def test_a_device_file_is_refused(store: ArtifactStore, tmp_path: Path, dest: Path) -> None:
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    archive = write_tar(tmp_path / "model.tar.gz", [(fifo, b"")])

    with pytest.raises(ArtifactError, match="member 'pipe' is a device, FIFO or other special"):
        store.fetch_model(str(archive), dest)

    assert not dest.exists()


# -- S3 ------------------------------------------------------------------------------------


def test_fetches_an_archive_from_s3(
    s3_store: ArtifactStore, bucket: Bucket, tmp_path: Path, dest: Path
) -> None:
    uri = bucket.put("models/m1/model.tar.gz", make_model_tar(tmp_path / "model.tar.gz"))

    assert s3_store.fetch_model(uri, dest) == dest

    assert_holds_model(dest)
    assert not (dest.parent / f".{dest.name}.partial").exists()  # the download is gone too


@pytest.mark.parametrize("suffix", ["", "/"])
def test_copies_a_prefix_from_s3(
    s3_store: ArtifactStore, bucket: Bucket, dest: Path, suffix: str
) -> None:
    uri = bucket.put("models/m1/code/inference.py", INFERENCE_PY).rsplit("/code/", 1)[0]
    bucket.put("models/m1/model.bin", WEIGHTS)
    bucket.put("models/m1/empty-folder/", b"")  # a console-made "folder" marker
    bucket.put("models/m10/model.bin", b"a sibling prefix, not part of m1")

    s3_store.fetch_model(uri + suffix, dest)

    assert_holds_model(dest)
    assert sorted(p.name for p in dest.iterdir()) == [COMPLETE_MARKER, "code", "model.bin"]


def test_a_second_s3_fetch_does_not_download_again(
    s3_store: ArtifactStore, bucket: Bucket, tmp_path: Path, dest: Path
) -> None:
    uri = bucket.put("model.tar.gz", make_model_tar(tmp_path / "model.tar.gz"))
    s3_store.fetch_model(uri, dest)
    bucket.client.delete_object(Bucket=bucket.name, Key="model.tar.gz")

    assert s3_store.fetch_model(uri, dest) == dest

    assert_holds_model(dest)


def test_an_s3_key_escaping_dest_is_refused(
    s3_store: ArtifactStore, bucket: Bucket, tmp_path: Path, dest: Path
) -> None:
    """S3 keys may hold '..' segments; copied naively they would land above dest."""
    bucket.put("models/m1/model.bin", WEIGHTS)
    bucket.put("models/m1/../../../escaped.txt", b"evil")
    uri = f"s3://{bucket.name}/models/m1"
    before = snapshot(tmp_path)

    with pytest.raises(ArtifactError) as caught:
        s3_store.fetch_model(uri, dest)

    assert str(caught.value) == (
        f"Model data {uri} is unsafe: object 's3://{bucket.name}/models/m1/../../../escaped.txt'"
        " would be written outside the model directory."
    )
    assert_failed_cleanly(dest, before, tmp_path)


def test_a_hostile_archive_from_s3_is_refused(
    s3_store: ArtifactStore, bucket: Bucket, tmp_path: Path, dest: Path
) -> None:
    uri = bucket.put("model.tar.gz", write_tar(tmp_path / "model.tar.gz", [file_member("../evil")]))
    before = snapshot(tmp_path)

    with pytest.raises(ArtifactError) as caught:
        s3_store.fetch_model(uri, dest)

    assert str(caught.value) == (
        f"Model data {uri} is unsafe: member '../evil' would be written outside the model "
        "directory."
    )
    assert_failed_cleanly(dest, before, tmp_path)


@pytest.mark.parametrize("key", ["missing/model.tar.gz", "missing-prefix"])
def test_a_missing_s3_object_is_reported(
    s3_store: ArtifactStore, bucket: Bucket, tmp_path: Path, dest: Path, key: str
) -> None:
    uri = f"s3://{bucket.name}/{key}"
    before = snapshot(tmp_path)

    with pytest.raises(ArtifactError, match=f"^Could not find model data at {re.escape(uri)}.$"):
        s3_store.fetch_model(uri, dest)

    assert_failed_cleanly(dest, before, tmp_path)


def test_a_missing_s3_bucket_is_reported(
    s3_store: ArtifactStore, bucket: Bucket, dest: Path
) -> None:
    uri = "s3://no-such-bucket-here/model.tar.gz"

    with pytest.raises(ArtifactError, match=f"^Could not find model data at {re.escape(uri)}.$"):
        s3_store.fetch_model(uri, dest)


def test_an_s3_uri_without_a_bucket_is_reported(s3_store: ArtifactStore, dest: Path) -> None:
    with pytest.raises(ArtifactError, match="^Model data s3:///model.tar.gz names no bucket.$"):
        s3_store.fetch_model("s3:///model.tar.gz", dest)


def test_links_that_climb_with_dotdot_are_refused_even_inside(tmp_path: Path) -> None:
    """Stricter than the ``data`` filter: it would allow this link (it stays inside), but
    chains of such links are how CVE-2025-4517 escapes on older Pythons."""

    archive = tmp_path / "m.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = tarfile.TarInfo("code/inference.py")
        data.size = 2
        tar.addfile(data, io.BytesIO(b"#\n"))
        link = tarfile.TarInfo("code/sub/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "../inference.py"
        tar.addfile(link)
    dest = tmp_path / "dest"
    with pytest.raises(
        ArtifactError, match=r"member 'code/sub/link' links to '\.\./inference\.py' through '\.\.'"
    ):
        ArtifactStore().fetch_model(str(archive), dest)
    assert not dest.exists()


def test_very_long_member_paths_are_refused(tmp_path: Path) -> None:

    archive = tmp_path / "m.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        member = tarfile.TarInfo("a/" * 600 + "f")
        member.size = 1
        tar.addfile(member, io.BytesIO(b"x"))
    with pytest.raises(ArtifactError, match="longer than 1024 characters"):
        ArtifactStore().fetch_model(str(archive), tmp_path / "dest")


def test_an_archive_of_too_many_entries_is_refused(
    store: ArtifactStore, tmp_path: Path, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty files cost no bytes of the budget but an inode each: millions of them in a
    few MB of gzip would exhaust the disk's inodes (here the limit is lowered to 50)."""
    monkeypatch.setattr(artifacts, "MAX_MEMBERS", 50)
    members = [file_member("code/inference.py", b"#\n")]
    members += [file_member(f"empty/{n}", b"") for n in range(60)]
    archive = write_tar(tmp_path / "model.tar.gz", members)
    before = snapshot(tmp_path)
    with pytest.raises(ArtifactError, match="'empty/49' is past the 50 entries"):
        store.fetch_model(str(archive), dest)
    assert_failed_cleanly(dest, before, tmp_path)
    store.fetch_model(str(write_tar(tmp_path / "ok.tar.gz", members[:50])), tmp_path / "ok")


def test_an_archive_growing_far_past_its_size_is_refused_before_it_fills_the_disk(
    store: ArtifactStore, tmp_path: Path, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bomb (a few KB of gzip making MBs of zeros; in the wild, 2 MB making 2 GiB):
    refused on its members' declared sizes, so nothing past the budget is written."""
    monkeypatch.setattr(artifacts, "MIN_EXPANSION_BYTES", 1 << 20)  # a small floor here
    archive = write_tar(
        tmp_path / "model.tar.gz",
        [file_member("code/inference.py", b"#\n"), file_member("zeros.bin", bytes(8 << 20))],
    )
    assert archive.stat().st_size < 64 * 1024
    before = snapshot(tmp_path)
    with pytest.raises(ArtifactError, match="'zeros.bin' would make the model more than 200 times"):
        store.fetch_model(str(archive), dest)
    assert_failed_cleanly(dest, before, tmp_path)
    # Weights that compress as weights do are taken whole.
    plain = write_tar(tmp_path / "real.tar.gz", [file_member("w.bin", os.urandom(2 << 20))])
    store.fetch_model(str(plain), tmp_path / "real")
    assert (tmp_path / "real" / "w.bin").stat().st_size == 2 << 20
