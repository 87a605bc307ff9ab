"""The edge reads a request once, and holds little for a client it does not know.

Raw sockets where a client library would not send what is tested (a header twice, a
signature that covers too little, a body declared and never sent), signed with
botocore's own signer; boto3 elsewhere.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.conftest import GatewayProcess, make_tarball, start_gateway, unique, wait_until
from tests.e2e.test_auth import (
    APP,
    APP_SECRET,
    OPS,
    OPS_SECRET,
    SECRETS,
    client,
    error_code,
    http,
    write_stack,
)

AMZ_JSON = "application/x-amz-json-1.1"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway with auth:, and an endpoint config ``open-config`` no endpoint uses."""
    home = tmp_path_factory.mktemp("edge")
    models = home / "models"
    tarball = make_tarball("sum", models / "sum" / "model.tar.gz")
    stack = write_stack(home / "stack.yaml", file_roots=[str(models)])
    gw = start_gateway(home / "home", extra_env=SECRETS, args=["--config", str(stack)])
    try:
        sm = client(gw, "sagemaker")
        sm.create_model(
            ModelName="open-model",
            PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": tarball.as_uri()},
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
        sm.create_endpoint_config(
            EndpointConfigName="open-config",
            ProductionVariants=[
                {
                    "VariantName": "v1",
                    "ModelName": "open-model",
                    "InstanceType": "ml.m5.large",
                    "InitialInstanceCount": 1,
                }
            ],
        )
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def open_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway without auth: that closes a connection idle for one second."""
    gw = start_gateway(
        tmp_path_factory.mktemp("idle") / "home", extra_env={"SHIPYARD_IDLE_TIMEOUT_S": "1"}
    )
    try:
        yield gw
    finally:
        gw.stop()


def address(gw: GatewayProcess) -> tuple[str, int]:
    return "127.0.0.1", int(gw.url.rsplit(":", 1)[1])


def connect(gw: GatewayProcess, timeout_s: float = 15) -> socket.socket:
    return socket.create_connection(address(gw), timeout=timeout_s)


def read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response: status, headers (lower-cased names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before a whole head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, f"closed before the whole body: {data!r}"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def signed(
    gw: GatewayProcess,
    headers: dict[str, str],
    body: bytes,
    *,
    path: str = "/",
    key: str = OPS,
    secret: str = OPS_SECRET,
    auth: type[SigV4Auth] = SigV4Auth,
) -> dict[str, str]:
    """The headers botocore's signer gives a POST of ``body`` to ``path`` (Host included)."""
    request = AWSRequest(method="POST", url=gw.url + path, data=body, headers=headers)
    auth(Credentials(key, secret), "sagemaker", "us-east-1").add_auth(request)
    host, port = address(gw)
    return {"Host": f"{host}:{port}", **dict(request.headers.items())}


def raw_request(
    headers: list[tuple[str, str]], body: bytes, *, path: str = "/", length: int | None = None
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    lines.append(f"Content-Length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def exchange(gw: GatewayProcess, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(gw) as s:
        s.sendall(request)
        return read_response(s)


def test_two_targets_cannot_turn_a_describe_key_into_a_create_key(
    secured: GatewayProcess,
) -> None:
    """The application key may only Describe. It signs both targets (a signer joins a
    repeated header's values with a comma) and sends them as two headers: one reading
    saw DescribeEndpoint and authorised it, another ran CreateEndpoint."""
    name = unique("stolen")
    body = json.dumps({"EndpointName": name, "EndpointConfigName": "open-config"}).encode()
    create, describe = "SageMaker.CreateEndpoint", "SageMaker.DescribeEndpoint"
    headers = signed(
        secured,
        {"X-Amz-Target": f"{create},{describe}", "Content-Type": AMZ_JSON},
        body,
        key=APP,
        secret=APP_SECRET,
    )
    headers.pop("X-Amz-Target")
    sent = [*headers.items(), ("X-Amz-Target", create), ("X-Amz-Target", describe)]
    status, _, answer = exchange(secured, raw_request(sent, body))
    assert status == 400, answer
    error = json.loads(answer)
    assert error["__type"] == "ValidationException"
    assert "x-amz-target header more than once" in error["message"]
    code, _, message = error_code(
        lambda: client(secured, "sagemaker").describe_endpoint(EndpointName=name)
    )
    assert code == "ValidationException" and "Could not find endpoint" in message


@pytest.mark.parametrize("header", ["Authorization", "X-Amz-Date", "Host", "X-Amz-Target"])
def test_a_security_header_sent_twice_is_refused_before_anything_runs(
    secured: GatewayProcess, header: str
) -> None:
    body = b"{}"
    headers = signed(secured, {"X-Amz-Target": "SageMaker.ListModels"}, body)
    sent = [*headers.items(), (header, headers[header])]  # even the same value twice
    status, _, answer = exchange(secured, raw_request(sent, body))
    assert status == 400, answer
    assert json.loads(answer)["__type"] == "ValidationException"
    assert f"{header.lower()} header more than once" in json.loads(answer)["message"]


def test_a_repeated_target_is_refused_without_auth_too(open_gw: GatewayProcess) -> None:
    """Without auth: the control door still must not pick one of two actions."""
    sent = [
        ("Host", "x"),
        ("X-Amz-Target", "SageMaker.ListModels"),
        ("X-Amz-Target", "SageMaker.ListEndpoints"),
    ]
    status, _, answer = exchange(open_gw, raw_request(sent, b"{}"))
    assert status == 400
    assert json.loads(answer)["__type"] == "ValidationException"


def test_a_runtime_request_with_a_repeated_header_gets_the_runtimes_error(
    secured: GatewayProcess,
) -> None:
    body = b"[[1, 2]]"
    headers = signed(
        secured, {"Content-Type": "application/json"}, body, path="/endpoints/e/invocations"
    )
    sent = [*headers.items(), ("X-Amz-Date", headers["X-Amz-Date"])]
    status, answer_headers, answer = exchange(
        secured, raw_request(sent, body, path="/endpoints/e/invocations")
    )
    assert status == 400
    assert answer_headers["x-amzn-errortype"] == "ValidationError"


def _omitting(name: str) -> type[SigV4Auth]:
    class Omitting(SigV4Auth):
        """botocore's signer, but leaving ``name`` out of SignedHeaders."""

        def headers_to_sign(self, request: Any) -> Any:
            headers = super().headers_to_sign(request)
            del headers[name]
            return headers

    return Omitting


@pytest.mark.parametrize("left_out", ["host", "x-amz-date", "x-amz-target"])
def test_a_signature_must_cover_host_date_and_target(
    secured: GatewayProcess, left_out: str
) -> None:
    body = b"{}"
    headers = signed(
        secured, {"X-Amz-Target": "SageMaker.ListModels"}, body, auth=_omitting(left_out)
    )
    assert left_out not in headers["Authorization"].split("SignedHeaders=")[1].split(",")[0]
    status, _, answer = exchange(secured, raw_request(list(headers.items()), body))
    assert status == 403, answer
    error = json.loads(answer)
    assert error["__type"] == "InvalidSignatureException"
    assert f"SignedHeaders must include '{left_out}'" in error["message"]
    # The same request with everything signed goes through.
    headers = signed(secured, {"X-Amz-Target": "SageMaker.ListModels"}, body)
    assert exchange(secured, raw_request(list(headers.items()), body))[0] == 200


def test_an_unsigned_payload_is_refused_over_plain_http(secured: GatewayProcess) -> None:
    body = b"{}"
    headers = signed(
        secured,
        {"X-Amz-Target": "SageMaker.ListModels", "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"},
        body,
    )
    status, _, answer = http(secured, "POST", "/", body, **headers)
    assert status == 403, answer
    error = json.loads(answer)
    assert error["__type"] == "InvalidSignatureException"
    assert "only over TLS" in error["message"]


@pytest.mark.parametrize(
    ("authorization", "refusal"),
    [
        (
            "AWS4-HMAC-SHA256 Credential=AKIAUNKNOWN000000000/{day}/us-east-1/sagemaker/"
            "aws4_request, SignedHeaders=host;x-amz-date, Signature=" + "0" * 64,
            "UnrecognizedClientException",
        ),
        (None, "MissingAuthenticationTokenException"),
    ],
)
def test_a_client_without_a_known_key_is_answered_before_its_body_arrives(
    secured: GatewayProcess, authorization: str | None, refusal: str
) -> None:
    """5 MB declared, none sent: the refusal comes at once (not after the 30 s body
    timeout), and the connection is closed a few seconds later, holding nothing."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    headers = [("Host", "x"), ("X-Amz-Date", stamp), ("Content-Type", "application/json")]
    if authorization is not None:
        headers.append(("Authorization", authorization.format(day=stamp[:8])))
    request = raw_request(headers, b"", path="/endpoints/any/invocations", length=5_000_000)
    with connect(secured, timeout_s=10) as s:
        s.sendall(request)
        status, answer_headers, _ = read_response(s)
        assert status == 403
        assert answer_headers["x-amzn-errortype"] == refusal
        assert s.recv(65536) == b""  # closed by the gateway, well within the 10 s


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(
    open_gw: GatewayProcess,
) -> None:
    with connect(open_gw) as s:
        assert s.recv(1) == b""  # closed by the gateway after 1 s, not our 15 s timeout


def test_a_connection_idle_between_requests_is_closed_too(open_gw: GatewayProcess) -> None:
    with connect(open_gw) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[0] == 200
        assert s.recv(1) == b""


def test_a_connection_in_use_longer_than_the_idle_timeout_is_kept(open_gw: GatewayProcess) -> None:
    # One timer per connection (shipyard/http/keepalive.py): when it fires while requests keep
    # coming it is armed again for what is left, never closing a connection in use.
    with connect(open_gw) as s:
        started = time.monotonic()
        while time.monotonic() - started < 2.5:  # 2.5 idle timeouts of requests
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(s)[0] == 200
            time.sleep(0.3)  # spaces the requests; nothing waits on it
        last = time.monotonic()
        assert s.recv(1) == b""  # idle now: closed
        assert time.monotonic() - last < 5


def test_connections_beyond_the_cap_get_503(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path / "home", extra_env={"SHIPYARD_MAX_CONNECTIONS": "3"})
    held: list[socket.socket] = []
    try:
        ask = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(3):
            s = connect(gw)
            held.append(s)
            s.sendall(ask)
            assert read_response(s)[0] == 200  # kept open: keep-alive
        assert exchange_get(gw, ask) == 503
        held.pop().close()

        def served() -> bool:
            return exchange_get(gw, ask) == 200

        wait_until(served, "a connection served once one of the three closed", timeout_s=10)
    finally:
        for s in held:
            s.close()
        gw.stop()


def exchange_get(gw: GatewayProcess, request: bytes) -> int:
    with connect(gw) as s:
        s.sendall(request)
        return read_response(s)[0]
