"""Filesystems: one URI parse and one S3 filesystem under both stores."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from shipyard.errors import ArtifactError, ObjectStoreError, UnsupportedLocation
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.filesystems import Filesystems, local_path, s3_path
from shipyard.storage.objects import ObjectStore
from tests.conftest import Bucket


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("/srv/models/a", "/srv/models/a"),
        ("file:///srv/models/a", "/srv/models/a"),
        ("file://localhost/srv/my%20model", "/srv/my model"),
        ("relative/dir", "relative/dir"),
    ],
)
def test_local_locations(uri: str, path: str) -> None:
    assert local_path(uri) == Path(path)


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("ftp://host/x", "unsupported scheme 'ftp'"),
        ("file://otherhost/x", "not a local file URI"),
    ],
)
def test_other_locations_are_refused_saying_what_to_write(uri: str, problem: str) -> None:
    with pytest.raises(UnsupportedLocation, match=problem):
        local_path(uri)


def test_s3_paths() -> None:
    assert s3_path("s3://bucket/prefix/") == "bucket/prefix"
    assert s3_path("s3://bucket") == "bucket"
    with pytest.raises(UnsupportedLocation, match="names no object"):
        s3_path("s3://bucket", object_key=True)
    with pytest.raises(UnsupportedLocation, match="names no bucket"):
        s3_path("s3:///key")


def test_one_s3_filesystem_serves_every_thread_and_both_stores(
    bucket: Bucket, tmp_path: Path
) -> None:
    filesystems = Filesystems(s3_endpoint_url=bucket.endpoint_url)
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(filesystems.s3())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(fs) for fs in seen}) == 1

    # An object written through one store is read through the other, on the shared layer.
    objects = ObjectStore(filesystems=filesystems)
    uri = f"s3://{bucket.name}/models/m/data.txt"
    asyncio.run(objects.write_bytes(uri, b"weights"))
    fetched = ArtifactStore(filesystems=filesystems).fetch_model(
        f"s3://{bucket.name}/models/m/", tmp_path / "m"
    )
    assert (fetched / "data.txt").read_bytes() == b"weights"


def test_the_s3_filesystem_has_the_one_configuration() -> None:
    fs = Filesystems(s3_endpoint_url="http://127.0.0.1:9").s3()
    assert fs.storage_options == {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "use_listings_cache": False,
    }
    assert Filesystems().s3().storage_options["client_kwargs"] == {}


def test_an_object_added_after_a_listing_is_seen(bucket: Bucket) -> None:
    """A retried fetch must find what the user uploaded since: no listing is cached."""
    filesystems = Filesystems(s3_endpoint_url=bucket.endpoint_url)
    objects = ObjectStore(filesystems=filesystems)
    bucket.client.put_object(Bucket=bucket.name, Key="data/a.csv", Body=b"a")
    assert len(filesystems.s3().ls(f"{bucket.name}/data")) == 1
    bucket.client.put_object(Bucket=bucket.name, Key="data/b.csv", Body=b"b")
    assert objects.size(f"s3://{bucket.name}/data/b.csv") == 1
    assert len(filesystems.s3().ls(f"{bucket.name}/data")) == 2


@pytest.mark.parametrize(
    ("uri", "artifact_message", "object_message"),
    [
        (
            "ftp://host/x",
            "Model data ftp://host/x has the unsupported scheme 'ftp'; "
            "use s3://, file:// or a local path.",
            "ftp://host/x has the unsupported scheme 'ftp'; use s3://, file:// or a path.",
        ),
        (
            "file://otherhost/x",
            "Model data file://otherhost/x is not a local file URI; write file:///absolute/path.",
            "file://otherhost/x is not a local file URI; write file:///absolute/path.",
        ),
    ],
)
def test_each_store_words_an_unusable_location_as_before(
    uri: str, artifact_message: str, object_message: str, tmp_path: Path
) -> None:
    with pytest.raises(ArtifactError) as artifact_error:
        ArtifactStore().fetch_model(uri, tmp_path / "m")
    assert str(artifact_error.value) == artifact_message
    with pytest.raises(ObjectStoreError) as object_error:
        ObjectStore().size(uri)
    assert str(object_error.value) == object_message


def test_s3_locations_that_name_too_little_are_worded_by_each_store(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as artifact_error:
        ArtifactStore().fetch_model("s3://", tmp_path / "m")
    assert str(artifact_error.value) == "Model data s3:// names no bucket."
    with pytest.raises(ObjectStoreError) as object_error:
        ObjectStore().size("s3://bucket")
    assert str(object_error.value) == "s3://bucket names no object: write s3://bucket/key."


def test_stores_show_their_endpoint_whether_given_it_or_a_shared_layer() -> None:
    shared = Filesystems(s3_endpoint_url="http://minio:9000")
    assert repr(ArtifactStore(filesystems=shared)) == (
        "ArtifactStore(s3_endpoint_url='http://minio:9000')"
    )
    assert repr(ObjectStore(s3_endpoint_url=None)) == "ObjectStore(s3_endpoint_url=None)"
