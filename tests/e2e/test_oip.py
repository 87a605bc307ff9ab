"""The Open Inference Protocol v2 (REST and gRPC) through tritonclient, unchanged, against a
real gateway and real instances of tests/models/tensor_add and tests/models/echo."""

from __future__ import annotations

import gzip
import json
import urllib.request
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS, GatewayProcess, deploy, free_port, start_gateway

GRPC_PORT = free_port()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("oip") / "home"
    gateway = start_gateway(home, args=["--grpc-port", str(GRPC_PORT)])
    try:
        deploy(gateway.sm, "add", (MODELS / "tensor_add").as_uri())
        deploy(gateway.sm, "echo", (MODELS / "echo").as_uri())
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def http(gw: GatewayProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    yield client
    client.close()


def _inputs(binary: bool, dtype: str = "INT32") -> list[httpclient.InferInput]:
    a = np.arange(6, dtype=np.int32 if dtype == "INT32" else np.float32).reshape(2, 3)
    b = np.full((2, 3), 10, dtype=a.dtype)
    inputs = [
        httpclient.InferInput("INPUT0", [2, 3], dtype),
        httpclient.InferInput("INPUT1", [2, 3], dtype),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def _post(gw: GatewayProcess, path: str, body: Any, method: str = "POST") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        gw.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_health_metadata_and_ready_over_rest(http: httpclient.InferenceServerClient) -> None:
    assert http.is_server_live()
    assert http.is_server_ready()
    assert http.get_server_metadata()["extensions"] == ["binary_tensor_data", "schedule_policy"]
    metadata = http.get_model_metadata("add")
    assert metadata["name"] == "add" and metadata["versions"] == ["v1"]
    assert http.is_model_ready("add")
    assert http.is_model_ready("add", model_version="v1")
    assert not http.is_model_ready("nope")
    with pytest.raises(InferenceServerException) as info:
        http.get_model_metadata("nope")
    assert info.value.status() == "404"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_over_rest(http: httpclient.InferenceServerClient, binary: bool) -> None:
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary),
    ]
    result = http.infer("add", _inputs(binary), outputs=outputs, request_id="r-1")
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 10)
    response = result.get_response()
    assert response["model_name"] == "add" and response["id"] == "r-1"
    # No outputs named: every output, all binary (tritonclient asks binary_data_output).
    result = http.infer("add", _inputs(binary, "FP32"))
    assert result.as_numpy("OUTPUT0").dtype == np.float32
    assert {o["name"] for o in result.get_response()["outputs"]} == {"OUTPUT0", "OUTPUT1"}


def test_bytes_tensors_and_the_toolkit_chain(http: httpclient.InferenceServerClient) -> None:
    text = httpclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"ab", b"c"], dtype=object))
    result = http.infer("add", [text])
    assert result.as_numpy("UPPER").tolist() == [b"AB", b"C"]
    # No predict_tensors_fn: the default handlers pass the dict of arrays through.
    echoed = http.infer("echo", _inputs(True, "FP32"))
    np.testing.assert_array_equal(echoed.as_numpy("INPUT1"), np.full((2, 3), 10, np.float32))


def test_rest_errors_have_the_protocol_shape(
    gw: GatewayProcess, http: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as info:
        http.infer("nope", _inputs(False))
    assert info.value.status() == "404"
    good = {"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}
    cases = {
        "shape": {**good, "shape": [3]},
        "datatype": {**good, "datatype": "INT9"},
        "data": {**good, "data": [1.5, 2]},
        "range": {**good, "datatype": "UINT8", "data": [1, 300]},
        "ragged": {**good, "data": [[1], [2, 3]]},
    }
    for case, tensor in cases.items():
        status, body = _post(gw, "/v2/models/add/infer", {"inputs": [tensor]})
        assert status == 400, case
        assert set(body) == {"error"} and body["error"], case
    status, body = _post(gw, "/v2/models/add/infer", {"inputs": []})
    assert status == 400 and "inputs" in body["error"]
    status, body = _post(gw, "/v2/models/nope/infer", {"inputs": [good]})
    assert status == 404 and "nope" in body["error"]
    fail = {**good, "name": "FAIL"}
    status, body = _post(gw, "/v2/models/add/infer", {"inputs": [fail]})
    assert status == 424 and "asked to fail" in body["error"]
    status, body = _post(gw, "/v2/models/add/infer", {"inputs": [good], "outputs": [{"name": "X"}]})
    assert status == 424  # INPUT1 missing: the model's own KeyError
    status, body = _post(gw, "/v2/models/add/frobnicate", {})
    assert status == 404 and set(body) == {"error"}
    with pytest.raises(InferenceServerException) as info:
        http.infer("add", _inputs(True) + [httpclient.InferInput("FAIL", [1], "INT32")])
    assert info.value.status() == "400"  # FAIL has no data: a malformed request


def test_binary_framing_errors_are_bad_requests(gw: GatewayProcess) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    ).encode()
    for tail, length in ((b"\0" * 4, len(header)), (b"\0" * 12, len(header)), (b"", 10_000)):
        request = urllib.request.Request(
            gw.url + "/v2/models/add/infer",
            data=header + tail,
            method="POST",
            headers={
                "Inference-Header-Content-Length": str(length),
                "Content-Type": "application/octet-stream",
            },
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 400
        assert "error" in json.loads(info.value.read())


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_compressed_requests_from_tritonclient(
    http: httpclient.InferenceServerClient, algorithm: str, binary: bool
) -> None:
    # tritonclient.http compresses the request when asked, the binary extension's header
    # length counting the JSON header before compression; the answer may come plain
    # although it asks for a compressed one (Accept-Encoding).
    result = http.infer(
        "add",
        _inputs(binary),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 10)


def _post_encoded(gw: GatewayProcess, body: bytes, encoding: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        gw.url + "/v2/models/add/infer",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_encoded_bodies_that_cannot_be_decoded_are_refused(gw: GatewayProcess) -> None:
    tensor = {"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}
    good = json.dumps({"inputs": [tensor, {**tensor, "name": "INPUT1"}]}).encode()
    packed = gzip.compress(good)
    status, body = _post_encoded(gw, packed, "gzip, identity")
    assert status == 200 and body["outputs"][0]["data"] == [2, 4]
    cases = {
        "br": (b"\x0b\x02\x80{}\x03", 415, "not supported"),
        "gzip, br": (packed, 415, "not supported"),
        "gzip": (b"not gzip at all", 400, "not valid gzip"),
        "deflate": (packed, 400, "not valid deflate"),  # gzip's framing is not zlib's
    }
    for encoding, (data, code, words) in cases.items():
        status, body = _post_encoded(gw, data, encoding)
        assert (status, set(body)) == (code, {"error"}), encoding
        assert words in body["error"], (encoding, body)
    status, body = _post_encoded(gw, packed[:-6], "gzip")
    assert status == 400 and "ends before its end" in body["error"]
    status, body = _post_encoded(gw, packed + b"more", "gzip")
    assert status == 400 and "after its end" in body["error"]
    # gzip members one after the other (pigz, bgzip, `cat a.gz b.gz`) are one body.
    cut = len(good) // 2
    status, body = _post_encoded(gw, gzip.compress(good[:cut]) + gzip.compress(good[cut:]), "gzip")
    assert status == 200 and body["outputs"][0]["data"] == [2, 4]
    # A long coding is named in part, not echoed whole.
    status, body = _post_encoded(gw, packed, "x" * 20_000)
    assert status == 415 and len(body["error"]) < 200


def test_repeated_content_encoding_headers_are_one_list(gw: GatewayProcess) -> None:
    tensor = {"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}
    packed = gzip.compress(json.dumps({"inputs": [tensor, {**tensor, "name": "INPUT1"}]}).encode())
    host, port = gw.url.removeprefix("http://").split(":")
    for codings, expected in ((["identity", "gzip"], 200), (["br", "gzip"], 415)):
        connection = HTTPConnection(host, int(port), timeout=30)
        try:
            connection.putrequest("POST", "/v2/models/add/infer")
            for coding in codings:
                connection.putheader("Content-Encoding", coding)
            connection.putheader("Content-Length", str(len(packed)))
            connection.endheaders(packed)
            answer = connection.getresponse()
            assert answer.status == expected, (codings, answer.read())
            assert ("outputs" if expected == 200 else "error") in json.loads(answer.read())
        finally:
            connection.close()


def test_a_small_compressed_body_is_held_to_the_payload_limit_once_decoded(
    gw: GatewayProcess,
) -> None:
    # 7 MiB of zeros in about 7 KiB of gzip: the body passes the 6 MiB limit only as it
    # is inflated, and is refused then, not after.
    bomb = gzip.compress(b"0" * (7 << 20), compresslevel=9)
    assert len(bomb) < 64 << 10
    status, body = _post_encoded(gw, bomb, "gzip")
    assert status == 413 and set(body) == {"error"}
    assert gw.get("/healthz")[0] == 200


def test_metrics_count_v2_inferences(
    gw: GatewayProcess, http: httpclient.InferenceServerClient
) -> None:
    def invocations() -> float:
        _, body = gw.get("/metrics")
        for line in body.decode().splitlines():
            if line.startswith("shipyard_invocations_total{") and 'endpoint="add"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = invocations()
    http.infer("add", _inputs(True))
    assert invocations() == before + 1


@pytest.fixture(scope="module")
def grpc(gw: GatewayProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    yield client
    client.close()


def _grpc_inputs(dtype: str = "INT32") -> list[grpcclient.InferInput]:
    a = np.arange(6, dtype=np.int32 if dtype == "INT32" else np.float32).reshape(2, 3)
    inputs = [
        grpcclient.InferInput("INPUT0", [2, 3], dtype),
        grpcclient.InferInput("INPUT1", [2, 3], dtype),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.full((2, 3), 10, dtype=a.dtype))
    return inputs


def test_health_metadata_and_ready_over_grpc(grpc: grpcclient.InferenceServerClient) -> None:
    assert grpc.is_server_live()
    assert grpc.is_server_ready()
    assert list(grpc.get_server_metadata().extensions) == ["binary_tensor_data", "schedule_policy"]
    metadata = grpc.get_model_metadata("add")
    assert metadata.name == "add" and list(metadata.versions) == ["v1"]
    assert grpc.is_model_ready("add")
    with pytest.raises(InferenceServerException) as info:
        grpc.get_model_metadata("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("dtype", ["INT32", "FP32"])
def test_infer_over_grpc(grpc: grpcclient.InferenceServerClient, dtype: str) -> None:
    result = grpc.infer(
        "add",
        _grpc_inputs(dtype),
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
        request_id="g-1",
    )
    a = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 10)
    assert result.as_numpy("OUTPUT0") is None  # not asked for
    assert result.get_response().id == "g-1"
    text = grpcclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"grpc"], dtype=object))
    assert grpc.infer("add", [text]).as_numpy("UPPER").tolist() == [b"GRPC"]


def test_grpc_errors_have_the_protocol_codes(grpc: grpcclient.InferenceServerClient) -> None:
    def code(name: str, inputs: list[grpcclient.InferInput]) -> str | None:
        with pytest.raises(InferenceServerException) as info:
            grpc.infer(name, inputs)
        return info.value.status()

    assert code("nope", _grpc_inputs()) == "StatusCode.NOT_FOUND"
    fail = grpcclient.InferInput("FAIL", [1], "INT32")
    fail.set_data_from_numpy(np.array([1], dtype=np.int32))
    assert code("add", [fail]) == "StatusCode.INTERNAL"
    wrong = grpcclient.InferInput("INPUT0", [4], "INT32")  # 3 elements for shape [4]
    wrong._raw_content = np.arange(3, dtype=np.int32).tobytes()
    assert code("add", [wrong]) == "StatusCode.INVALID_ARGUMENT"
    odd = grpcclient.InferInput("INPUT0", [1], "BF16")
    odd._raw_content = b"\0\0"
    assert code("add", [odd]) == "StatusCode.INVALID_ARGUMENT"
    unnamed = grpcclient.InferInput("", [2], "INT32")  # refused here, never sent
    unnamed.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    assert code("add", [unnamed]) == "StatusCode.INVALID_ARGUMENT"
