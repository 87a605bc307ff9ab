"""Data capture (DataCaptureConfig): sampled invocations written as SageMaker's JSON Lines
records, in its folder layout, off the request's path."""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import (
    Bucket,
    GatewayProcess,
    make_tarball,
    start_gateway,
    unique,
    wait_in_service,
    wait_until,
)

ROLE = "arn:aws:iam::123456789012:role/x"
FAST_FLUSH = {"SHIPYARD_CAPTURE_FLUSH_INTERVAL_S": "0.2"}
# <endpoint>/<variant>/yyyy/mm/dd/hh/mm-ss-mmm-<uuid>.jsonl, as SageMaker names them.
LAYOUT = re.compile(
    r"^[\w-]+/v1/\d{4}/\d{2}/\d{2}/\d{2}/\d{2}-\d{2}-\d{3}-"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.jsonl$"
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the file:// tests of this module, each on endpoints of its own."""
    gateway = start_gateway(tmp_path_factory.mktemp("capture") / "home", extra_env=FAST_FLUSH)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def echo_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tarball("echo", tmp_path_factory.mktemp("echo") / "model.tar.gz").as_uri()


def capture_config(destination: str, percent: int = 100, **extra: Any) -> dict[str, Any]:
    return {
        "EnableCapture": True,
        "InitialSamplingPercentage": percent,
        "DestinationS3Uri": destination,
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        **extra,
    }


def create_config(sm: Any, name: str, model: str, capture: dict[str, Any] | None) -> None:
    extra = {"DataCaptureConfig": capture} if capture is not None else {}
    sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": model,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
        **extra,
    )


def deploy(sm: Any, name: str, model_url: str, capture: dict[str, Any] | None) -> None:
    """Model, config and endpoint called ``name``; not waited for."""
    sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_url},
        ExecutionRoleArn=ROLE,
    )
    create_config(sm, name, name, capture)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)


def invoke(gw: GatewayProcess, name: str, body: bytes, content_type: str, **kw: Any) -> bytes:
    out = gw.rt.invoke_endpoint(EndpointName=name, ContentType=content_type, Body=body, **kw)
    data: bytes = out["Body"].read()
    return data


def post_many(gw: GatewayProcess, name: str, count: int) -> list[int]:
    """``count`` invocations over one keep-alive connection (faster than boto3's)."""
    host, port = gw.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    statuses = []
    try:
        for _ in range(count):
            connection.request(
                "POST",
                f"/endpoints/{name}/invocations",
                body=b"[1]",
                headers={"Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            answer.read()
            statuses.append(answer.status)
    finally:
        connection.close()
    return statuses


def records(folder: Path, endpoint: str) -> list[dict[str, Any]]:
    """Every record written for ``endpoint`` under ``folder``, checking the layout."""
    found = []
    for path in sorted((folder / endpoint).rglob("*")):
        if path.is_file():
            assert LAYOUT.match(path.relative_to(folder).as_posix()), path
            found += [json.loads(line) for line in path.read_text().splitlines()]
    return found


def captured(gw: GatewayProcess, endpoint: str, outcome: str) -> float:
    """shipyard_capture_records_total of one endpoint's v1 for ``outcome``."""
    status, body = gw.get("/metrics")
    assert status == 200
    # The exposition lists labels sorted by name.
    prefix = (
        f'shipyard_capture_records_total{{endpoint="{endpoint}",outcome="{outcome}",variant="v1"}} '
    )
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def wait_written(gw: GatewayProcess, endpoint: str, count: int) -> None:
    wait_until(lambda: captured(gw, endpoint, "written") >= count, f"{count} records written")


def test_every_invocation_is_captured_at_100_percent_in_sagemakers_format(
    gw: GatewayProcess, echo_url: str, tmp_path: Path
) -> None:
    name = unique("cap")
    dest = tmp_path / "capture"
    deploy(gw.sm, name, echo_url, capture_config(dest.as_uri()))
    wait_in_service(gw.sm, name)
    for i in range(10):
        kw = {"InferenceId": f"inf-{i}"} if i % 2 == 0 else {}
        invoke(gw, name, json.dumps({"n": i}).encode(), "application/json", **kw)
    answer = invoke(gw, name, b"1,2\n3,4\n", "text/csv", Accept="text/csv")
    wait_written(gw, name, 11)

    found = records(dest, name)
    assert len(found) == 11
    for record in found:
        assert record["eventVersion"] == "0"
        assert set(record["captureData"]) == {"endpointInput", "endpointOutput"}
        assert re.fullmatch(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["eventMetadata"]["inferenceTime"]
        )
    by_id = {r["eventMetadata"].get("inferenceId"): r for r in found}
    assert {f"inf-{i}" for i in range(0, 10, 2)} <= set(by_id)
    assert len({r["eventMetadata"]["eventId"] for r in found}) == 11
    first = by_id["inf-0"]["captureData"]
    assert first["endpointInput"] == {
        "observedContentType": "application/json",
        "mode": "INPUT",
        "data": '{"n": 0}',
        "encoding": "JSON",
    }
    assert first["endpointOutput"]["mode"] == "OUTPUT"
    assert first["endpointOutput"]["encoding"] == "JSON"
    assert json.loads(first["endpointOutput"]["data"]) == {"n": 0}
    csv = next(r for r in found if r["captureData"]["endpointInput"]["encoding"] == "CSV")
    assert csv["captureData"]["endpointInput"]["data"] == "1,2\n3,4\n"
    assert csv["captureData"]["endpointOutput"]["data"] == answer.decode()
    assert "inferenceId" not in csv["eventMetadata"]

    summary = gw.sm.describe_endpoint(EndpointName=name)["DataCaptureConfig"]
    assert summary == {
        "EnableCapture": True,
        "CaptureStatus": "Started",
        "CurrentSamplingPercentage": 100,
        "DestinationS3Uri": dest.as_uri(),
    }
    echoed = gw.sm.describe_endpoint_config(EndpointConfigName=name)["DataCaptureConfig"]
    assert echoed == capture_config(dest.as_uri())


def test_sampling_at_0_and_50_percent(gw: GatewayProcess, echo_url: str, tmp_path: Path) -> None:
    none, half = unique("cap0"), unique("cap50")
    dest = tmp_path / "capture"
    deploy(gw.sm, none, echo_url, capture_config(dest.as_uri(), percent=0))
    deploy(gw.sm, half, echo_url, capture_config(dest.as_uri(), percent=50))
    wait_in_service(gw.sm, none)
    wait_in_service(gw.sm, half)
    posted = post_many(gw, none, 100) + post_many(gw, half, 400)
    assert posted == [200] * 500
    # Binomial(400, 0.5) has a standard deviation of 10: six of them either side.
    wait_until(lambda: captured(gw, half, "written") >= 140, "half the records")
    marker = unique("marker")  # a later flush of the same writer: "half" is done by then
    deploy(gw.sm, marker, echo_url, capture_config(dest.as_uri()))
    wait_in_service(gw.sm, marker)
    invoke(gw, marker, b"[1]", "application/json")
    wait_written(gw, marker, 1)
    written = captured(gw, half, "written")
    assert 140 <= written <= 260
    assert len(records(dest, half)) == written
    assert not (dest / none).exists()
    assert captured(gw, none, "written") == 0
    status = gw.sm.describe_endpoint(EndpointName=none)["DataCaptureConfig"]
    assert status["CaptureStatus"] == "Started" and status["CurrentSamplingPercentage"] == 0


def test_input_only_output_only_and_base64(
    gw: GatewayProcess, echo_url: str, tmp_path: Path
) -> None:
    inputs, outputs = unique("capin"), unique("capout")
    dest = tmp_path / "capture"
    # text/csv is not listed as CSV here, so its bodies are written in base64.
    header = {"CsvContentTypes": ["text/x-csv"], "JsonContentTypes": ["application/json"]}
    only_input = capture_config(dest.as_uri(), CaptureContentTypeHeader=header)
    only_input["CaptureOptions"] = [{"CaptureMode": "Input"}]
    only_output = capture_config(dest.as_uri())
    only_output["CaptureOptions"] = [{"CaptureMode": "Output"}]
    deploy(gw.sm, inputs, echo_url, only_input)
    deploy(gw.sm, outputs, echo_url, only_output)
    wait_in_service(gw.sm, inputs)
    wait_in_service(gw.sm, outputs)
    invoke(gw, inputs, b"5,6\n", "text/csv", Accept="text/csv")
    invoke(gw, outputs, b'{"x": 1}', "application/json", InferenceId="out-1")
    wait_written(gw, inputs, 1)
    wait_written(gw, outputs, 1)

    (seen,) = records(dest, inputs)
    assert list(seen["captureData"]) == ["endpointInput"]
    body = seen["captureData"]["endpointInput"]
    assert body["encoding"] == "BASE64" and body["observedContentType"] == "text/csv"
    assert base64.b64decode(body["data"]) == b"5,6\n"
    (answered,) = records(dest, outputs)
    assert list(answered["captureData"]) == ["endpointOutput"]
    assert answered["captureData"]["endpointOutput"]["encoding"] == "JSON"
    assert answered["eventMetadata"]["inferenceId"] == "out-1"


def test_update_endpoint_turns_capture_on_and_off(
    gw: GatewayProcess, echo_url: str, tmp_path: Path
) -> None:
    name = unique("capupd")
    dest = tmp_path / "capture"
    deploy(gw.sm, name, echo_url, None)
    wait_in_service(gw.sm, name)
    assert "DataCaptureConfig" not in gw.sm.describe_endpoint(EndpointName=name)
    invoke(gw, name, b"[0]", "application/json")

    create_config(gw.sm, f"{name}-on", name, capture_config(dest.as_uri()))
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-on")
    wait_in_service(gw.sm, name)
    summary = gw.sm.describe_endpoint(EndpointName=name)["DataCaptureConfig"]
    assert summary["EnableCapture"] is True and summary["CaptureStatus"] == "Started"
    for _ in range(3):
        invoke(gw, name, b"[1]", "application/json")
    wait_written(gw, name, 3)

    off = {**capture_config(dest.as_uri()), "EnableCapture": False}
    create_config(gw.sm, f"{name}-off", name, off)
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=f"{name}-off")
    wait_in_service(gw.sm, name)
    summary = gw.sm.describe_endpoint(EndpointName=name)["DataCaptureConfig"]
    assert summary["EnableCapture"] is False and summary["CaptureStatus"] == "Stopped"
    for _ in range(3):
        invoke(gw, name, b"[2]", "application/json")
    marker = unique("marker")  # a later flush of the same writer
    deploy(gw.sm, marker, echo_url, capture_config(dest.as_uri()))
    wait_in_service(gw.sm, marker)
    invoke(gw, marker, b"[1]", "application/json")
    wait_written(gw, marker, 1)
    found = records(dest, name)
    assert [r["captureData"]["endpointInput"]["data"] for r in found] == ["[1]"] * 3
    assert captured(gw, name, "written") == 3


def test_an_unwritable_destination_counts_failures_and_invocations_succeed(
    gw: GatewayProcess, echo_url: str, tmp_path: Path
) -> None:
    name = unique("capfail")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the capture folder should be")
    deploy(gw.sm, name, echo_url, capture_config((blocker / "capture").as_uri()))
    wait_in_service(gw.sm, name)
    for i in range(10):
        assert invoke(gw, name, f"[{i}]".encode(), "application/json") == f"[{i}]".encode()
    wait_until(lambda: captured(gw, name, "failed") >= 10, "10 failed records")
    assert captured(gw, name, "written") == 0
    assert blocker.read_text().startswith("a file")


BAD = [
    ("percent over 100", {"InitialSamplingPercentage": 101}, "initialSamplingPercentage"),
    ("negative percent", {"InitialSamplingPercentage": -1}, "initialSamplingPercentage"),
    ("no capture options", {"CaptureOptions": []}, "captureOptions"),
    (
        "a mode twice",
        {"CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Input"}]},
        "more than once",
    ),
    ("an unknown mode", {"CaptureOptions": [{"CaptureMode": "Sideways"}]}, "captureMode"),
    ("an https destination", {"DestinationS3Uri": "https://example.com/x"}, "DestinationS3Uri"),
    ("a relative destination", {"DestinationS3Uri": "capture/here"}, "DestinationS3Uri"),
    ("an s3 uri with no bucket", {"DestinationS3Uri": "s3:///x"}, "DestinationS3Uri"),
    (
        "11 csv content types",
        {"CaptureContentTypeHeader": {"CsvContentTypes": [f"text/c{i}" for i in range(11)]}},
        "csvContentTypes",
    ),
    (
        "a malformed json content type",
        {"CaptureContentTypeHeader": {"JsonContentTypes": ["json"]}},
        "jsonContentTypes",
    ),
]


@pytest.mark.parametrize(("case", "change", "named"), BAD, ids=[c for c, _, _ in BAD])
def test_bad_data_capture_configs_are_refused(
    gw: GatewayProcess, echo_url: str, case: str, change: dict[str, Any], named: str
) -> None:
    sm = gw.client("sagemaker", config_validation=False)
    config = {**capture_config("file:///tmp/capture"), **change}
    with pytest.raises(ClientError) as caught:
        create_config(sm, unique("bad"), "no-such-model", config)
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationException", case
    assert named in error["Message"], error["Message"]


def test_missing_destination_is_refused(gw: GatewayProcess) -> None:
    sm = gw.client("sagemaker", config_validation=False)
    config = capture_config("file:///tmp/capture")
    del config["DestinationS3Uri"]
    with pytest.raises(ClientError) as caught:
        create_config(sm, unique("bad"), "no-such-model", config)
    assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_stopping_the_gateway_flushes_pending_records(
    gateway_factory: Callable[..., GatewayProcess], echo_url: str, tmp_path: Path
) -> None:
    gateway = gateway_factory(extra_env={"SHIPYARD_CAPTURE_FLUSH_INTERVAL_S": "600"})
    name = unique("capstop")
    dest = tmp_path / "capture"
    deploy(gateway.sm, name, echo_url, capture_config(dest.as_uri()))
    wait_in_service(gateway.sm, name)
    for i in range(7):
        invoke(gateway, name, f"[{i}]".encode(), "application/json")
    assert captured(gateway, name, "written") == 0
    assert not dest.exists()
    gateway.stop(signal.SIGTERM)
    assert "gateway stopped" in gateway.log()
    found = records(dest, name)
    assert sorted(r["captureData"]["endpointInput"]["data"] for r in found) == [
        f"[{i}]" for i in range(7)
    ]


def test_capture_to_s3(
    gateway_factory: Callable[..., GatewayProcess], echo_url: str, bucket: Bucket
) -> None:
    gateway = gateway_factory(
        extra_env={**FAST_FLUSH, "SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url}
    )
    name = unique("caps3")
    deploy(gateway.sm, name, echo_url, capture_config(f"s3://{bucket.name}/monitor"))
    wait_in_service(gateway.sm, name)
    for i in range(5):
        invoke(gateway, name, f"[{i}]".encode(), "application/json", InferenceId=f"s3-{i}")
    wait_written(gateway, name, 5)
    listed = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="monitor/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert keys and all(LAYOUT.match(k.removeprefix("monitor/")) for k in keys), keys
    found = []
    for key in keys:
        text = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read().decode()
        found += [json.loads(line) for line in text.splitlines()]
    assert sorted(r["eventMetadata"]["inferenceId"] for r in found) == [f"s3-{i}" for i in range(5)]
