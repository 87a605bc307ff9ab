"""The base environment of instances and jobs, and the S3 access handed to them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shipyard.backends import BackendContext
from shipyard.backends.environment import process_environment, s3_variables
from shipyard.settings import Settings
from shipyard.stackfile import AccessKey, AuthConfig, StackFile


class Recorder(BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:
        Recorder.paths.append(self.path)
        body = b'{"AccessKeyId": "AKIDROLE", "SecretAccessKey": "role", "Token": "t",'
        body += b' "Expiration": "2099-01-01T00:00:00Z"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_PUT = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_service() -> Iterator[str]:
    """A stand-in for the EC2 and ECS metadata services on loopback, recording calls."""
    Recorder.paths = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def test_the_base_keeps_a_few_plain_variables_and_nothing_else(tmp_path: Path) -> None:
    gateway = {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "HOME": "/home/operator",
        "SHIPYARD_KEY_OPS": "secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "DATABASE_URL": "postgresql://u:secret@db/x",
    }
    env = process_environment(gateway, home=tmp_path)
    assert env == {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "HOME": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "OPENBLAS_THREAD_TIMEOUT": "4",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "MALLOC_TRIM_THRESHOLD_": "33554432",
    }
    s3 = {"AWS_ACCESS_KEY_ID": "AKID", "SHIPYARD_S3_ENDPOINT_URL": "http://s3"}
    assert process_environment(gateway, home=tmp_path, s3=s3).items() >= s3.items()


def test_s3_access_is_resolved_from_a_profile_into_plain_keys(
    no_aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text("[p]\naws_access_key_id = AKIDP\naws_secret_access_key = sp\n")
    config = tmp_path / "config"
    config.write_text("[profile p]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "p")
    env = s3_variables({}, s3_endpoint_url="http://127.0.0.1:9000")
    assert env == {
        "AWS_ACCESS_KEY_ID": "AKIDP",
        "AWS_SECRET_ACCESS_KEY": "sp",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "eu-west-1",
        "SHIPYARD_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
    }


def test_credentials_that_are_a_callers_key_are_never_lent(
    no_aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator who exported their own auth key for the CLI, then started the gateway
    from that shell: a job given those credentials would sign as the operator."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOPS")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ops-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    lent = s3_variables({}, s3_endpoint_url=None, callers_keys=frozenset({"AKIATEAM"}))
    assert (lent["AWS_ACCESS_KEY_ID"], lent["AWS_SECRET_ACCESS_KEY"]) == ("AKIAOPS", "ops-secret")
    kept = s3_variables({}, s3_endpoint_url=None, callers_keys=frozenset({"AKIATEAM", "AKIAOPS"}))
    assert "ops-secret" not in kept.values()
    assert kept == {"AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "eu-west-1"}


def test_s3_access_never_asks_the_metadata_services(
    no_aws: None, monkeypatch: pytest.MonkeyPatch, metadata_service: str
) -> None:
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", metadata_service + "/ecs")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", metadata_service)
    env = s3_variables({}, s3_endpoint_url=None)
    assert "AWS_ACCESS_KEY_ID" not in env
    assert Recorder.paths == []


def test_a_gateway_lends_no_credentials_that_one_of_its_keys_signs_with(
    no_aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The backend a gateway builds gets its auth keys' ids: its own AWS credentials are
    the operator's key, so its instances and jobs get none."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOPS")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ops-secret")
    settings = Settings(home=tmp_path / "home")
    keys = [
        AccessKey(access_key_id=key_id, secret_access_key_env="UNUSED")
        for key_id in ("AKIAOPS", "AKIATEAM")
    ]
    with_auth = StackFile(auth=AuthConfig(keys=keys, sandbox=False))
    assert "AWS_ACCESS_KEY_ID" not in BackendContext.of(settings, with_auth).s3
    assert BackendContext.of(settings, StackFile()).s3["AWS_ACCESS_KEY_ID"] == "AKIAOPS"
