"""Bidirectional streams to container images, on a real engine: an image labelled
``com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true`` is reached over its
WebSocket, and one without the label is refused before any connection to it."""

from __future__ import annotations

import asyncio
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, deploy, free_port, unique
from tests.containers.conftest import Engine, needs_engine
from tests.h2client import H2Client

pytestmark = needs_engine

LABEL = 'LABEL com.amazonaws.sagemaker.capabilities.bidirectional-streaming="true"'


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, str]:
    repo = "localhost/shipyard-test"
    return {
        "plain": engine.build(f"{repo}/echo:1", lines=("ENV IMAGE_VERSION=1",)),
        "labelled": engine.build(f"{repo}/bidi:1", lines=("ENV IMAGE_VERSION=bidi", LABEL)),
    }


@pytest.fixture
def artifact(tmp_path: Path) -> str:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "answer.txt").write_text("42\n")
    path = tmp_path / "model.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(tmp_path / "model", arcname=".")
    return path.as_uri()


@pytest.fixture
def gateway(gateway_factory: Callable[..., GatewayProcess], engine: Engine) -> GatewayProcess:
    port = free_port()
    gw = gateway_factory(extra_env=engine.env, args=["--http2-port", str(port)])
    gw.env["HTTP2_PORT"] = str(port)
    return gw


def refusal(gw: GatewayProcess, endpoint: str) -> tuple[int, dict[str, Any], bytes]:
    async def go() -> tuple[int, dict[str, Any], bytes]:
        client = await H2Client.connect(int(gw.env["HTTP2_PORT"]))
        stream = await client.open(endpoint)
        status = await stream.wait_head()
        await stream.rest()
        await client.close()
        return status, stream.json_body(), stream.headers[b"x-amzn-errortype"]

    return asyncio.run(asyncio.wait_for(go(), 60))


def test_an_image_without_the_label_cannot_stream_and_one_with_it_is_asked(
    gateway: GatewayProcess, images: dict[str, str], artifact: str
) -> None:
    plain, labelled = unique("plain"), unique("labelled")
    deploy(gateway.sm, plain, artifact, image=images["plain"])
    deploy(gateway.sm, labelled, artifact, image=images["labelled"])

    status, body, kind = refusal(gateway, plain)
    assert (status, kind) == (400, b"InputValidationError")
    assert "bidirectional-streaming=true" in body["Message"]

    # Labelled, it is asked for the WebSocket: this image serves none (it answers the
    # handshake 404), which is the model's refusal.
    status, body, kind = refusal(gateway, labelled)
    assert (status, kind) == (424, b"ModelError")
    assert body["OriginalStatusCode"] == 404
