"""The runtime doors against hostile clients: header limits, ids that would escape a
folder, bodies that trickle, and chunked bodies over the limit."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, deploy, make_tarball, start_gateway, wait_until
from tests.e2e.test_async import put_input


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One gateway: ``sums`` (one instance of tests/models/sum) and the async ``echoes``."""
    home = tmp_path_factory.mktemp("limits")
    gw = start_gateway(home / "home", extra_env={"SHIPYARD_BODY_READ_TIMEOUT_S": "2"})
    try:
        tarball = make_tarball("sum", home / "m" / "model.tar.gz")
        deploy(gw.sm, "sums", tarball.as_uri())
        deploy(
            gw.sm,
            "echoes",
            (MODELS / "echo").as_uri(),
            async_config={
                "OutputConfig": {
                    "S3OutputPath": (home / "out" / "ok").as_uri(),
                    "S3FailurePath": (home / "out" / "failed").as_uri(),
                }
            },
        )
        yield gw
    finally:
        gw.stop()


def port(gw: GatewayProcess) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def invoke(gw: GatewayProcess, body: bytes = b"[[1, 2]]", **headers: str) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(
        f"{gw.url}/endpoints/sums/invocations", data=body, method="POST"
    )
    request.add_header("Content-Type", "application/json")
    for k, v in headers.items():
        request.add_header(k, v)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def raw(gw: GatewayProcess, request: bytes, timeout_s: float = 15) -> bytes:
    with socket.create_connection(("127.0.0.1", port(gw)), timeout=timeout_s) as s:
        s.sendall(request)
        return read_response(s)


def read_response(s: socket.socket) -> bytes:
    """One whole response: its headers and body may arrive in several reads."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        if not (chunk := s.recv(65536)):
            return answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    while length and len(body) < int(length.group(1)):
        if not (chunk := s.recv(65536)):
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_custom_attributes_over_1024_characters_are_refused(gw: GatewayProcess) -> None:
    status, headers, body = invoke(gw, **{"X-Amzn-SageMaker-Custom-Attributes": "a" * 1025})
    assert status == 400
    assert headers.get("x-amzn-ErrorType") == "ValidationError"
    assert "customAttributes" in json.loads(body)["message"]
    assert invoke(gw, **{"X-Amzn-SageMaker-Custom-Attributes": "a" * 1024})[0] == 200


@pytest.mark.parametrize("path", ["invocations", "invocations-response-stream"])
@pytest.mark.parametrize(
    ("header", "member"),
    [
        (b"X-Amzn-SageMaker-Target-Variant", b"targetVariant"),
        (b"X-Amzn-SageMaker-Target-Container-Hostname", b"targetContainerHostname"),
        (b"X-Amzn-SageMaker-Inference-Component", b"inferenceComponentName"),
    ],
)
def test_a_name_header_outside_its_pattern_is_a_validation_error(
    gw: GatewayProcess, path: str, header: bytes, member: bytes
) -> None:
    """Bytes that are no UTF-8 (a 500 once) or no name are refused by botocore's pattern
    for the member, on both doors."""
    for value in (b"\xff", b"caf\xc3\xa9", b"a b", b"-lead", b"a_b"):
        answer = raw(
            gw,
            b"POST /endpoints/sums/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\n%s: %s\r\nContent-Length: 6\r\nConnection: close\r\n\r\n[[1]]\n"
            % (path.encode(), header, value),
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), answer
        assert b"x-amzn-errortype: ValidationError" in head.lower().replace(
            b"validationerror", b"ValidationError"
        )
        assert member in body and b"regular expression pattern" in body


def test_a_target_model_on_an_endpoint_of_one_model_is_a_validation_error(
    gw: GatewayProcess,
) -> None:
    """As SageMaker answers it (the header was passed to the model and ignored)."""
    with pytest.raises(ClientError) as info:
        gw.rt.invoke_endpoint(
            EndpointName="sums", ContentType="application/json", Body=b"[[1]]",
            TargetModel="other.tar.gz",
        )  # fmt: skip
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationError"
    assert error["Message"] == (
        "Endpoint sums is not a multi-model endpoint and does not support target model header."
    )
    status, headers, _ = invoke(gw, **{"X-Amzn-SageMaker-Target-Model": "other.tar.gz"})
    assert status == 400 and headers.get("x-amzn-ErrorType") == "ValidationError"
    assert invoke(gw)[0] == 200


def test_a_target_container_on_an_endpoint_of_one_container_is_a_validation_error(
    gw: GatewayProcess,
) -> None:
    """AWS: "You will get validation errors if you ... specify a value for
    TargetContainerHostname in a request to an endpoint that is not configured for direct
    invocation" (it was passed to the model and ignored)."""
    with pytest.raises(ClientError) as info:
        gw.rt.invoke_endpoint(
            EndpointName="sums", ContentType="application/json", Body=b"[[1]]",
            TargetContainerHostname="first",
        )  # fmt: skip
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationError"
    assert "not configured for direct invocation" in error["Message"]


@pytest.mark.parametrize("value", ["x" * 65, "caf\u00e9", "tab\there"])
def test_an_inference_id_must_be_1_to_64_printable_characters(
    gw: GatewayProcess, value: str
) -> None:
    rt = gw.rt
    with pytest.raises(ClientError) as info:
        rt.invoke_endpoint(
            EndpointName="sums", ContentType="application/json", Body=b"[[1]]", InferenceId=value
        )
    assert info.value.response["Error"]["Code"] == "ValidationError"
    assert "inferenceId" in info.value.response["Error"]["Message"]


def test_an_inference_id_cannot_place_the_output_outside_its_folder(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """Issue 9 finding 3: ``../escaped`` wrote ``<S3OutputPath>/../escaped.out``."""
    out = gw.sm.describe_endpoint_config(EndpointConfigName="echoes")["AsyncInferenceConfig"]
    ok_dir = Path(out["OutputConfig"]["S3OutputPath"].removeprefix("file://"))
    for value in ("../escaped", "a/b", "..", "a\\b"):
        with pytest.raises(ClientError) as info:
            gw.rt.invoke_endpoint_async(
                EndpointName="echoes",
                InputLocation=put_input(tmp_path, {"x": 1}),
                InferenceId=value,
            )
        assert info.value.response["Error"]["Code"] == "ValidationError"
    assert not (ok_dir.parent / "escaped.out").exists()
    assert not (ok_dir.parent / "escaped-error.out").exists()


def test_a_chunked_body_just_over_the_limit_gets_its_413(gw: GatewayProcess) -> None:
    """Issue 9 finding 6: 6 MB + 1 byte, chunked, hung instead of answering."""
    limit = 6 * 1024 * 1024
    chunk = b"x" * (limit + 1)
    request = (
        b"POST /endpoints/sums/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(chunk):x}\r\n".encode()
        + chunk
        + b"\r\n0\r\n\r\n"
    )
    answer = raw(gw, request)
    assert answer.startswith(b"HTTP/1.1 413")


def test_a_body_that_does_not_arrive_in_time_is_refused(gw: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", port(gw)), timeout=15) as s:
        s.sendall(
            b"POST /endpoints/sums/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n[[1"
        )
        answer = read_response(s)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 2 seconds" in answer


def test_slow_clients_do_not_take_the_instance_from_normal_ones(gw: GatewayProcess) -> None:
    """Issue 9 finding 5: ~64 clients trickling their bodies filled the instance's queue,
    and every normal request got 503. Bodies are now read before an instance is chosen."""
    stop = threading.Event()
    sockets: list[socket.socket] = []

    def trickle() -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port(gw)), timeout=10)
        except OSError:
            return
        sockets.append(s)
        s.sendall(
            b"POST /endpoints/sums/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        while not stop.is_set():
            try:
                s.sendall(b" ")
            except OSError:
                return
            stop.wait(0.1)

    threads = [threading.Thread(target=trickle) for _ in range(80)]
    for t in threads:
        t.start()
    try:
        # Every slow client has connected and started its body.
        wait_until(lambda: len(sockets) == len(threads), "the slow clients connected")
        statuses = [invoke(gw)[0] for _ in range(30)]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for s in sockets:
            s.close()
    assert statuses == [200] * 30
