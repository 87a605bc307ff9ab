"""InvokeEndpointWithBidirectionalStream with AWS's own client, unchanged
(``aws-sdk-sagemaker-runtime-http2`` over its CRT transport), against a gateway serving
TLS with ALPN ``h2``: the client trusts the gateway's certificate through SSL_CERT_FILE.

The client needs Python >= 3.12 and the project runs on 3.11: ``make http2-client``
makes a side environment (``.venv-http2``) and tests/aws_http2/driver.py runs there;
without one these tests skip, saying so."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.conftest import MODELS, GatewayProcess, deploy, free_port
from tests.e2e.test_tls import self_signed, start_https_gateway

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("SHIPYARD_HTTP2_CLIENT_PYTHON", ROOT / ".venv-http2/bin/python"))
DRIVER = ROOT / "tests" / "aws_http2" / "driver.py"

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"AWS's HTTP/2 client needs Python >= 3.12: no {PYTHON} (make http2-client)",
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    home = tmp_path_factory.mktemp("bidi-aws")
    cert, key = self_signed(home / "tls")
    port = free_port()
    args = ["--http2-port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)]
    gateway = start_https_gateway(home / "home", cert, args)
    gateway.env["HTTP2_URL"] = f"https://127.0.0.1:{port}"
    try:
        sm = boto3.client(
            "sagemaker",
            endpoint_url=gateway.url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            verify=str(cert),
        )
        deploy(sm, "echo", (MODELS / "bidi_echo").as_uri())
        deploy(sm, "cannot", (MODELS / "bidi_none").as_uri())
        yield gateway, cert
    finally:
        gateway.stop()


def drive(gw: tuple[GatewayProcess, Path], scenario: str, endpoint: str) -> dict[str, Any]:
    gateway, cert = gw
    done = subprocess.run(
        [str(PYTHON), str(DRIVER), scenario, gateway.env["HTTP2_URL"], endpoint],
        env={**os.environ, "SSL_CERT_FILE": str(cert)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_two_hundred_mixed_parts_come_back_identical_and_in_order(
    gw: tuple[GatewayProcess, Path],
) -> None:
    result = drive(gw, "echo", "echo")
    assert result["errors"] == []
    assert result["got"] == result["sent"]
    assert len(result["got"]) == 200
    assert result["variant"] == "v1"
    # The client waited for the first answer before sending the rest of its parts.
    assert result["first_before_last_sent"] is True


def test_a_model_error_mid_stream_reaches_the_client_as_model_stream_error(
    gw: tuple[GatewayProcess, Path],
) -> None:
    result = drive(gw, "fail", "echo")
    assert result["got"] == ["ok"]
    assert result["errors"] == [{"raised": "ModelStreamError", "message": "asked to fail"}]


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [("no-such-endpoint", "no-such-endpoint"), ("cannot", "cannot")],
)
def test_an_endpoint_that_cannot_stream_is_refused_before_the_stream(
    gw: tuple[GatewayProcess, Path], endpoint: str, says: str
) -> None:
    result = drive(gw, "refused", endpoint)
    assert result["raised"] == "InputValidationError"
    assert says in result["message"]
