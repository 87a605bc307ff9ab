"""Bidirectional streams under ``auth:``, over TLS: the request's SigV4 signature checked
before the stream (``host`` being ``:authority``, the payload hash
STREAMING-AWS4-HMAC-SHA256-EVENTS), the key authorised for
``sagemaker-runtime:InvokeEndpointWithBidirectionalStream`` on the endpoint, and every
event's chained signature checked before its part goes on to the model."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.conftest import GatewayProcess, deploy, free_port, make_tarball
from tests.e2e.test_auth import OPS, OPS_SECRET, write_stack
from tests.e2e.test_bidi_aws_client import DRIVER, PYTHON
from tests.e2e.test_tls import self_signed, start_https_gateway
from tests.h2client import EventSigner, H2Client, request_event, signed_head

NARROW, NARROW_SECRET = "AKIATESTNARROW000001", "narrow-secret-value"
ELSEWHERE, ELSEWHERE_SECRET = "AKIATESTELSEWHERE001", "elsewhere-secret-value"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path, int]]:
    home = tmp_path_factory.mktemp("bidi-auth")
    cert, key = self_signed(home / "tls")
    models = home / "models"
    tarball = make_tarball("bidi_echo", models / "bidi_echo" / "model.tar.gz")
    more = [
        {
            "access_key_id": NARROW,
            "secret_access_key_env": "SHIPYARD_KEY_NARROW",
            "allow": ["sagemaker-runtime:InvokeEndpoint"],
        },
        {
            "access_key_id": ELSEWHERE,
            "secret_access_key_env": "SHIPYARD_KEY_ELSEWHERE",
            "allow": ["sagemaker-runtime:*"],
            "resources": ["arn:aws:sagemaker:*:*:endpoint/other-*"],
        },
    ]
    stack = write_stack(home / "stack.yaml", more_keys=more, file_roots=[str(models)])
    port = free_port()
    env = {"SHIPYARD_KEY_NARROW": NARROW_SECRET, "SHIPYARD_KEY_ELSEWHERE": ELSEWHERE_SECRET}
    args = ["--config", str(stack), "--tls-cert", str(cert), "--tls-key", str(key)]
    gateway = start_https_gateway(
        home / "home", cert, [*args, "--http2-port", str(port)], extra_env=env
    )
    try:
        sm = boto3.client(
            "sagemaker",
            endpoint_url=gateway.url,
            region_name="us-east-1",
            aws_access_key_id=OPS,
            aws_secret_access_key=OPS_SECRET,
            verify=str(cert),
        )
        deploy(sm, "echo", tarball.as_uri())
        yield gateway, cert, port
    finally:
        gateway.stop()


def run(coro: object) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


PATH = "/endpoints/echo/invocations-bidirectional-stream"


async def open_signed(port: int, cert: Path, key: str, secret: str) -> tuple[H2Client, Any, str]:
    client = await H2Client.connect(port, tls=True, cafile=str(cert))
    headers, seed = signed_head(client.authority, PATH, key, secret)
    stream = await client.open("echo", headers)
    return client, stream, seed


def test_signed_events_reach_the_model_and_a_bad_one_ends_the_stream(
    gw: tuple[GatewayProcess, Path, int],
) -> None:
    _, cert, port = gw

    async def go() -> None:
        client, stream, seed = await open_signed(port, cert, OPS, OPS_SECRET)
        signer = EventSigner(seed, OPS_SECRET)
        await stream.send(signer.sign(request_event("good")))
        event = await stream.next_event()
        assert event is not None and event.text == "good"
        await stream.send(signer.sign(request_event("forged"), corrupt=True))
        events = await stream.rest()
        # The forged part never reached the model: no echo of it, only the failure.
        assert [e.kind for e in events] == ["InternalStreamFailure"]
        assert "signature" in events[0].error["Message"]
        await client.close()

    run(go())


def test_an_unsigned_event_ends_the_stream(gw: tuple[GatewayProcess, Path, int]) -> None:
    _, cert, port = gw

    async def go() -> None:
        client, stream, _ = await open_signed(port, cert, OPS, OPS_SECRET)
        await stream.send(request_event("bare"))
        events = await stream.rest()
        assert [e.kind for e in events] == ["InternalStreamFailure"]
        await client.close()

    run(go())


@pytest.mark.parametrize(
    ("key", "secret", "kind"),
    [
        (None, None, "MissingAuthenticationTokenException"),
        (OPS, "wrong-secret", "InvalidSignatureException"),
        (NARROW, NARROW_SECRET, "AccessDeniedException"),  # lacks the action
        (ELSEWHERE, ELSEWHERE_SECRET, "AccessDeniedException"),  # lacks the endpoint
    ],
)
def test_requests_not_signed_or_not_allowed_are_refused_before_the_stream(
    gw: tuple[GatewayProcess, Path, int], key: str | None, secret: str | None, kind: str
) -> None:
    _, cert, port = gw

    async def go() -> None:
        client = await H2Client.connect(port, tls=True, cafile=str(cert))
        headers = signed_head(client.authority, PATH, key, secret)[0] if key and secret else {}
        stream = await client.open("echo", headers)
        assert await stream.wait_head() == 403
        await stream.rest()
        assert stream.headers[b"x-amzn-errortype"] == kind.encode()
        await client.close()

    run(go())


@pytest.mark.skipif(not PYTHON.exists(), reason=f"no {PYTHON} (make http2-client)")
def test_aws_client_signs_every_event_as_the_gateway_checks(
    gw: tuple[GatewayProcess, Path, int],
) -> None:
    _, cert, port = gw
    done = subprocess.run(
        [str(PYTHON), str(DRIVER), "echo", f"https://127.0.0.1:{port}", "echo", OPS, OPS_SECRET],
        env={**os.environ, "SSL_CERT_FILE": str(cert)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"errors": []' in done.stdout
    assert '"first_before_last_sent": true' in done.stdout
