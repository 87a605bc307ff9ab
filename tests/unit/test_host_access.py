"""HostAccess: which commands and local locations a gateway with auth: accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard.errors import InvalidParameter
from shipyard.host_access import HostAccess, local_path
from shipyard.settings import AccessKey, AuthConfig


def access(tmp_path: Path, **kw: object) -> HostAccess:
    key = AccessKey(access_key_id="AKIATEST", secret_access_key_env="X")
    return HostAccess.from_auth(AuthConfig(keys=[key], file_roots=[tmp_path / "root"], **kw))


def test_without_auth_everything_is_allowed(tmp_path: Path) -> None:
    open_access = HostAccess.from_auth(None)
    open_access.check_image("cmd:id", "Image")
    open_access.check_location("file:///etc/passwd", "ModelDataUrl")


def test_with_auth_commands_are_refused_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="allow_commands"):
        access(tmp_path).check_image("cmd:id > /tmp/x", "PrimaryContainer.Image")
    with pytest.raises(InvalidParameter, match="ContainerEntrypoint"):
        access(tmp_path).check_entrypoint(["sh"], "AlgorithmSpecification.ContainerEntrypoint")
    access(tmp_path).check_image("shipyard/python", "PrimaryContainer.Image")
    access(tmp_path, allow_commands=True).check_image("cmd:id", "PrimaryContainer.Image")


@pytest.mark.parametrize(
    "uri",
    [
        "ROOT/model.tar.gz",
        "file://ROOT/model.tar.gz",
        "file://localhost/ROOT/sub/not-yet-made/out",
        "file://ROOT/a%20b/model.tar.gz",
        "ROOT",
        "s3://bucket/anything",
    ],
)
def test_locations_under_a_root_or_in_s3_are_accepted(tmp_path: Path, uri: str) -> None:
    (tmp_path / "root").mkdir()
    access(tmp_path).check_location(uri.replace("ROOT", str(tmp_path / "root")), "S3Uri")


@pytest.mark.parametrize(
    "uri",
    [
        "/etc/hostname",
        "file:///etc/hostname",
        "ROOT/../outside",
        "file://ROOT/%2E%2E/outside",
        "ROOT-evil/model.tar.gz",
        "ROOT/link-out/secret",
        "file://otherhost/ROOT/x",
    ],
)
def test_locations_outside_the_roots_are_refused(tmp_path: Path, uri: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "link-out").symlink_to(tmp_path / "outside")
    with pytest.raises(InvalidParameter, match="auth.file_roots"):
        access(tmp_path).check_location(uri.replace("ROOT", str(root)), "S3Uri")


def test_no_roots_means_no_local_locations(tmp_path: Path) -> None:
    key = AccessKey(access_key_id="AKIATEST", secret_access_key_env="X")
    strict = HostAccess.from_auth(AuthConfig(keys=[key]))
    with pytest.raises(InvalidParameter, match="none"):
        strict.check_location(str(tmp_path), "ModelDataUrl")
    strict.check_location("s3://b/k", "ModelDataUrl")


def test_local_path_reads_file_uris_and_plain_paths() -> None:
    assert local_path("file:///a/b%20c") == "/a/b c"
    assert local_path("/a/b") == "/a/b"
    assert local_path("s3://b/k") is None


def test_a_nul_in_a_path_is_a_validation_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="NUL"):
        access(tmp_path).check_location("file:///srv/a\x00b", "CheckpointConfig.S3Uri")
