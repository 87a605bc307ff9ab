"""HTTPS on the gateway's own port (``--tls-cert``/``--tls-key``, or ``tls:``).

The certificate is made here, self-signed for 127.0.0.1, and boto3 trusts it through
``verify=``, as a user of a self-signed gateway would.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import GatewayProcess, deploy, free_port, make_tarball, start_gateway
from tests.e2e.test_auth import OPS, OPS_SECRET, SECRETS, write_stack


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def start_https_gateway(
    home: Path, cert: Path, args: list[str], extra_env: dict[str, str] | None = None
) -> GatewayProcess:
    """``start_gateway`` for a gateway that speaks only HTTPS: ready once its /healthz
    answers over TLS with ``cert`` trusted."""
    context = ssl.create_default_context(cafile=str(cert))

    def answers(gw: GatewayProcess) -> bool:
        with urllib.request.urlopen(gw.url + "/healthz", timeout=5, context=context) as r:
            return bool(r.status == 200)

    env = {**SECRETS, **(extra_env or {})}
    return start_gateway(home, extra_env=env, args=args, scheme="https", answers=answers)


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    """A gateway with auth: and TLS, the sum model deployed as ``sums``; and its cert."""
    home = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(home / "tls")
    models = home / "models"
    tarball = make_tarball("sum", models / "sum" / "model.tar.gz")
    stack = write_stack(home / "stack.yaml", file_roots=[str(models)])
    args = ["--config", str(stack), "--tls-cert", str(cert), "--tls-key", str(key)]
    gw = start_https_gateway(home / "home", cert, args)
    try:
        deploy(client(gw, "sagemaker", cert), "sums", tarball.as_uri())
        yield gw, cert
    finally:
        gw.stop()


def client(gw: GatewayProcess, service: str, cert: Path) -> Any:
    return boto3.client(
        service,
        endpoint_url=gw.url,
        region_name="us-east-1",
        aws_access_key_id=OPS,
        aws_secret_access_key=OPS_SECRET,
        verify=str(cert),
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def test_boto3_reaches_a_gateway_over_https_with_its_certificate(
    tls_gateway: tuple[GatewayProcess, Path],
) -> None:
    gw, cert = tls_gateway
    sm = client(gw, "sagemaker", cert)
    assert sm.describe_endpoint(EndpointName="sums")["EndpointStatus"] == "InService"
    rt = client(gw, "sagemaker-runtime", cert)
    out = rt.invoke_endpoint(EndpointName="sums", ContentType="application/json", Body=b"[[1, 2]]")
    assert json.loads(out["Body"].read()) == [3]


def test_an_untrusted_certificate_is_refused_by_the_client(
    tls_gateway: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = tls_gateway
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(gw.url + "/healthz", timeout=10)


def test_an_unsigned_payload_is_accepted_over_tls(
    tls_gateway: tuple[GatewayProcess, Path],
) -> None:
    """boto3 leaves a body unsigned when payload signing is off (``UNSIGNED-PAYLOAD``):
    over TLS the gateway takes it, and serves the body the client sent."""
    gw, cert = tls_gateway
    rt = client(gw, "sagemaker-runtime", cert)

    def unsigned(request: Any, **_: Any) -> None:
        request.context["payload_signing_enabled"] = False

    sent: list[str] = []
    rt.meta.events.register("before-sign.sagemaker-runtime.InvokeEndpoint", unsigned)
    rt.meta.events.register(
        "before-send.sagemaker-runtime.InvokeEndpoint",
        lambda request, **_: sent.append(request.headers["X-Amz-Content-SHA256"].decode()),
    )
    out = rt.invoke_endpoint(EndpointName="sums", ContentType="application/json", Body=b"[[4, 5]]")
    assert sent == ["UNSIGNED-PAYLOAD"]
    assert json.loads(out["Body"].read()) == [9]

    # A raw request too, on the control plane.
    request = AWSRequest(
        method="POST",
        url=gw.url + "/",
        data=b"{}",
        headers={
            "X-Amz-Target": "SageMaker.ListModels",
            "Content-Type": "application/x-amz-json-1.1",
            "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
        },
    )
    SigV4Auth(Credentials(OPS, OPS_SECRET), "sagemaker", "us-east-1").add_auth(request)
    prepared = urllib.request.Request(
        gw.url + "/", data=b"{}", method="POST", headers=dict(request.headers.items())
    )
    context = ssl.create_default_context(cafile=str(cert))
    with urllib.request.urlopen(prepared, timeout=30, context=context) as r:
        assert "sums" in [m["ModelName"] for m in json.loads(r.read())["Models"]]


def test_the_stack_files_tls_section_serves_https_and_the_flags_win(tmp_path: Path) -> None:
    from shipyard.app import create_app
    from shipyard.settings import Settings

    cert, key = self_signed(tmp_path / "tls")
    other_cert, other_key = self_signed(tmp_path / "other")
    stack = tmp_path / "stack.yaml"
    stack.write_text(json.dumps({"tls": {"cert": "tls/cert.pem", "key": "tls/key.pem"}}))
    gateway = create_app(Settings(home=tmp_path / "h1", config=stack))
    assert gateway.tls == (cert, key)  # relative to the stack file
    gateway.store.close()
    gateway = create_app(
        Settings(home=tmp_path / "h2", config=stack, tls_cert=other_cert, tls_key=other_key)
    )
    assert gateway.tls == (other_cert, other_key)
    gateway.store.close()


def test_a_certificate_that_cannot_be_loaded_stops_the_start(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path / "tls")
    out = subprocess.run(
        [sys.executable, "-m", "shipyard", "serve", "--home", str(tmp_path / "h")]
        + ["--port", "1", "--tls-cert", str(cert), "--tls-key", str(cert)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "tls: cannot serve HTTPS with certificate" in out.stderr


def test_grpc_is_served_over_tls_with_the_same_certificate(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    cert, key = self_signed(tmp_path / "tls")
    grpc_port = free_port()
    args = ["--grpc-port", str(grpc_port), "--tls-cert", str(cert), "--tls-key", str(key)]
    gw = start_https_gateway(tmp_path / "home", cert, args)
    try:
        url = f"127.0.0.1:{grpc_port}"
        secure = grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(cert))
        assert secure.is_server_live()
        secure.close()
    finally:
        gw.stop()
