"""Every door invokes the same way (routing/invocation.py): an Open Inference Protocol
inference, over REST or gRPC, is copied to a shadow variant and captured like an
InvokeEndpoint request, and an asynchronous invocation is counted on its variant, its
model's failure as an error, its model latency observed. Real gateways, real instances."""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import (
    MODELS,
    GatewayProcess,
    deploy,
    free_port,
    start_gateway,
    unique,
    wait_in_service,
    wait_until,
)
from tests.e2e.test_data_capture import FAST_FLUSH, capture_config, records, wait_written
from tests.e2e.test_data_capture import deploy as deploy_capturing
from tests.e2e.test_shadow import metric, model, variant

TENSORS = "application/vnd.shipyard.v2+tensors"
INPUT = {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, grpc_port: int) -> Iterator[GatewayProcess]:
    """One gateway for the module, with the gRPC door open; each test has endpoints of
    its own on it."""
    home = tmp_path_factory.mktemp("paths") / "home"
    gateway = start_gateway(home, extra_env=FAST_FLUSH, args=["--grpc-port", str(grpc_port)])
    yield gateway
    gateway.stop()


def infer_rest(gw: GatewayProcess, name: str, request_id: str) -> dict[str, Any]:
    """POST /v2/models/{name}/infer with one JSON input; the answer, checked 200."""
    body = json.dumps({"id": request_id, "inputs": [INPUT]}).encode()
    request = urllib.request.Request(
        gw.url + f"/v2/models/{name}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
        result: dict[str, Any] = json.loads(answer.read())
    return result


def infer_grpc(port: int, name: str, request_id: str) -> dict[str, Any]:
    """The same inference through tritonclient's gRPC client; the answer as a dict."""
    tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array(INPUT["data"], dtype=np.float32))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        result = client.infer(name, [tensor], request_id=request_id)
        return {
            "id": result.get_response().id,
            "model_version": result.get_response().model_version,
            "outputs": [{"name": "INPUT0", "data": result.as_numpy("INPUT0").tolist()}],
        }


def shadowed(gw: GatewayProcess) -> str:
    """An endpoint of an echo model with an echo model as its shadow: both answer
    tensors (the runtime's default handlers pass them through); returns its name."""
    name = unique("sh")
    echo = (MODELS / "echo").as_uri()
    gw.sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[variant("prod", model(gw, f"{name}-prod", echo))],
        ShadowProductionVariants=[variant("shadow", model(gw, f"{name}-shadow", echo))],
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gw.sm, name)
    return name


@pytest.mark.parametrize("door", ["rest", "grpc"])
def test_an_oip_inference_is_copied_to_the_shadow(
    gw: GatewayProcess, grpc_port: int, door: str
) -> None:
    name = shadowed(gw)
    request_id = f"r-{door}"
    if door == "rest":
        answer = infer_rest(gw, name, request_id)
    else:
        answer = infer_grpc(grpc_port, name, request_id)
    assert answer["id"] == request_id and answer["model_version"] == "prod"
    (output,) = answer["outputs"]
    assert output["name"] == "INPUT0" and output["data"] == [1.0, 2.0]
    wait_until(
        lambda: metric(gw, "shipyard_invocations_total", name, "shadow") == 1,
        "the copy counted on the shadow",
    )
    assert metric(gw, "shipyard_model_latency_seconds_count", name, "shadow") == 1
    assert metric(gw, "shipyard_invocation_4xx_errors_total", name, "shadow") == 0
    assert metric(gw, "shipyard_invocation_5xx_errors_total", name, "shadow") == 0
    assert metric(gw, "shipyard_invocations_total", name, "prod") == 1


def test_an_oip_inference_is_captured(gw: GatewayProcess, tmp_path: Path) -> None:
    name = unique("oipcap")
    dest = tmp_path / "capture"
    deploy_capturing(gw.sm, name, (MODELS / "echo").as_uri(), capture_config(dest.as_uri()))
    wait_in_service(gw.sm, name)
    infer_rest(gw, name, "r-captured")
    wait_written(gw, name, 1)

    (record,) = records(dest, name)
    sent = record["captureData"]["endpointInput"]
    assert sent["mode"] == "INPUT" and sent["encoding"] == "BASE64"
    kind, _, length = sent["observedContentType"].partition("; header-length=")
    assert kind == TENSORS
    data = base64.b64decode(sent["data"])
    header = json.loads(data[: int(length)])
    assert header["id"] == "r-captured"
    assert [t["name"] for t in header["inputs"]] == ["INPUT0"]
    assert np.frombuffer(data[int(length) :], np.float32).tolist() == [1.0, 2.0]
    answered = record["captureData"]["endpointOutput"]
    assert answered["mode"] == "OUTPUT"
    assert answered["observedContentType"].startswith(TENSORS)


def deploy_async(gw: GatewayProcess, model: str, out: Path) -> str:
    """An asynchronous endpoint of tests/models/<model>, writing to ``out``; its name."""
    name = unique("async")
    output = {"S3OutputPath": (out / "ok").as_uri(), "S3FailurePath": (out / "failed").as_uri()}
    deploy(gw.sm, name, (MODELS / model).as_uri(), async_config={"OutputConfig": output})
    return name


def invoke_async(gw: GatewayProcess, name: str, tmp_path: Path, body: Any) -> dict[str, Any]:
    source = tmp_path / "inputs" / f"{uuid.uuid4().hex}.json"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(json.dumps(body))
    answer: dict[str, Any] = gw.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=source.as_uri(), ContentType="application/json"
    )
    return answer


def local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def test_an_async_invocation_is_counted_on_its_variant(gw: GatewayProcess, tmp_path: Path) -> None:
    name = deploy_async(gw, "echo", tmp_path / "out")
    answer = invoke_async(gw, name, tmp_path, {"x": [1, 2]})
    wait_until(
        lambda: metric(gw, "shipyard_invocations_total", name, "v1") == 1,
        "the async invocation counted",
    )
    assert json.loads(local(answer["OutputLocation"]).read_bytes()) == {"x": [1, 2]}
    assert metric(gw, "shipyard_model_latency_seconds_count", name, "v1") == 1
    assert metric(gw, "shipyard_model_latency_seconds_sum", name, "v1") > 0
    assert metric(gw, "shipyard_overhead_latency_seconds_count", name, "v1") == 1
    assert metric(gw, "shipyard_invocation_4xx_errors_total", name, "v1") == 0
    assert metric(gw, "shipyard_invocation_5xx_errors_total", name, "v1") == 0


def test_an_async_invocation_whose_model_fails_is_counted_as_an_error(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    name = deploy_async(gw, "predict_raises", tmp_path / "out")
    answer = invoke_async(gw, name, tmp_path, [1])
    failure = local(answer["FailureLocation"])
    wait_until(failure.exists, "the failure written")
    assert "bad input for model" in failure.read_text()
    wait_until(
        lambda: metric(gw, "shipyard_invocations_total", name, "v1") == 1,
        "the failed async invocation counted",
    )
    # A model's error counts by the status the model answered (500 here), as
    # CloudWatch's Invocation5XXErrors counts it, not by ModelError's 424.
    assert metric(gw, "shipyard_invocation_4xx_errors_total", name, "v1") == 0
    assert metric(gw, "shipyard_invocation_5xx_errors_total", name, "v1") == 1
    assert not local(answer["OutputLocation"]).exists()
