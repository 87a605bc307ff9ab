"""Fixtures for the ArtifactStore: an S3 stand-in (moto's server) and fresh buckets on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer


@dataclass
class Bucket:
    """A fresh bucket on the moto server, and a boto3 client to fill it."""

    name: str
    endpoint_url: str
    client: Any

    def put(self, key: str, body: bytes | Path) -> str:
        """Upload ``body`` (bytes, or a file's content) to ``key``; return its s3:// URI."""
        data = body.read_bytes() if isinstance(body, Path) else body
        self.client.put_object(Bucket=self.name, Key=key, Body=data)
        return f"s3://{self.name}/{key}"


@pytest.fixture(scope="module")
def s3_endpoint_url() -> Iterator[str]:
    """A moto S3 server on a free loopback port, once per test module.

    AWS itself cannot run here, so moto stands in for it, spoken to over real HTTP.
    """
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_endpoint_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Bucket:
    """A new, empty bucket, with fake credentials in the environment for every client."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # Keep the developer's own AWS profile and config out of the tests.
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    client = boto3.client("s3", endpoint_url=s3_endpoint_url)
    name = f"models-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return Bucket(name=name, endpoint_url=s3_endpoint_url, client=client)
