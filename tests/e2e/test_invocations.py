"""The runtime door: invocations routed to real instance processes."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import (
    MODELS,
    GatewayProcess,
    PgSchema,
    deploy,
    in_flight,
    post_expecting_continue,
    wait_in_service,
    wait_until,
)
from tests.e2e.processes import instance_pids


def _invoke(
    gw: GatewayProcess,
    name: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    path: str = "invocations",
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        f"{gw.url}/endpoints/{name}/{path}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def test_invoke_through_boto3(gateway: GatewayProcess, model_tarball: Any) -> None:
    deploy(gateway.sm, "sum", model_tarball("sum"), count=2, strategy="LEAST_OUTSTANDING_REQUESTS")
    out = gateway.rt.invoke_endpoint(
        EndpointName="sum", ContentType="application/json", Body=b'{"instances": [[1, 2], [3, 4]]}'
    )
    assert out["InvokedProductionVariant"] == "v1"
    assert out["ContentType"] == "application/json"
    assert json.loads(out["Body"].read()) == json.loads(_expected_sum([[1, 2], [3, 4]]))
    csv = gateway.rt.invoke_endpoint(
        EndpointName="sum", ContentType="text/csv", Accept="text/csv", Body=b"1,2\n3,4\n"
    )
    assert csv["ContentType"].startswith("text/csv")
    assert csv["Body"].read().split() == [b"3.0", b"7.0"]


def _expected_sum(rows: list[list[int]]) -> str:
    # The sum fixture answers {"predictions": [row sums]} for JSON input.
    return json.dumps({"predictions": [float(sum(r)) for r in rows]})


def test_custom_attributes_and_inference_id_pass_through_a_cmd_server(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    server = MODELS / "cmd_headers" / "server.py"
    deploy(gateway.sm, "hdr", (MODELS / "cmd_headers").as_uri(), image=f"cmd:python {server}")
    out = gateway.rt.invoke_endpoint(
        EndpointName="hdr",
        ContentType="application/json",
        Accept="application/json",
        Body=b"{}",
        CustomAttributes="trace=1",
        InferenceId="inf-42",
    )
    seen = json.loads(out["Body"].read())
    assert seen["headers"]["x-amzn-sagemaker-custom-attributes"] == "trace=1"
    assert seen["headers"]["x-amzn-sagemaker-inference-id"] == "inf-42"
    assert seen["model_dir"]
    assert out["CustomAttributes"] == "seen=trace=1"


def test_a_cmd_server_speaking_http_1_0_answers_with_its_connections_end(
    gateway: GatewayProcess,
) -> None:
    # http.server's defaults: no Content-Length, the body ends where the connection does.
    server = MODELS / "cmd_http10" / "server.py"
    deploy(gateway.sm, "http10", (MODELS / "cmd_http10").as_uri(), image=f"cmd:python {server}")
    for body in (b"one", b"two" * 50_000):
        out = gateway.rt.invoke_endpoint(
            EndpointName="http10", ContentType="application/octet-stream", Body=body
        )
        assert out["Body"].read() == b"echo:" + body
    streamed = gateway.rt.invoke_endpoint_with_response_stream(
        EndpointName="http10", ContentType="application/octet-stream", Body=b"three"
    )
    parts = [event["PayloadPart"]["Bytes"] for event in streamed["Body"] if "PayloadPart" in event]
    assert b"".join(parts) == b"echo:three"


def test_model_error_carries_the_original_status_and_message(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    deploy(gateway.sm, "raises", model_tarball("predict_raises"))
    with pytest.raises(ClientError) as err:
        gateway.rt.invoke_endpoint(
            EndpointName="raises", ContentType="application/json", Body=b'{"instances": [[1]]}'
        )
    response = err.value.response
    assert response["Error"]["Code"] == "ModelError"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert response["OriginalStatusCode"] == 500
    assert "bad input for model" in response["OriginalMessage"]
    # Where to look: the endpoint's log group, which the gateway serves as CloudWatch Logs.
    group = "/aws/sagemaker/Endpoints/raises"
    assert response["LogStreamArn"] == f"arn:aws:logs:us-east-1:000000000000:log-group:{group}"
    streams = gateway.client("logs").describe_log_streams(logGroupName=group)["logStreams"]
    assert len(streams) == 1
    assert gateway.get("/healthz")[0] == 200


def test_unknown_endpoint_and_oversize_body_are_validation_errors(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    with pytest.raises(ClientError) as err:
        gateway.rt.invoke_endpoint(EndpointName="ghost", Body=b"{}")
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "ghost" in err.value.response["Error"]["Message"]
    deploy(gateway.sm, "echo", model_tarball("echo"))
    big = b'"' + b"x" * (6 * 1024 * 1024 + 10) + b'"'
    status, headers, body = _invoke(gateway, "echo", big)
    assert status == 413 and headers["x-amzn-errortype"] == "ValidationError"
    assert b"maximum" in body
    status, _, body = _invoke(gateway, "echo", b'{"ok": true}')
    assert status == 200 and json.loads(body) == {"ok": True}


def test_target_variant_and_weights(gateway: GatewayProcess, model_tarball: Any) -> None:
    sm = gateway.sm
    url = model_tarball("echo")
    sm.create_model(
        ModelName="m", PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url}
    )
    deploy(
        sm,
        "split",
        url,
        variants=[
            {
                "VariantName": "big",
                "ModelName": "m",
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
                "InitialVariantWeight": 3.0,
            },
            {
                "VariantName": "small",
                "ModelName": "m",
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
                "InitialVariantWeight": 1.0,
            },
        ],
    )
    seen = Counter(
        _invoke(gateway, "split", b"{}")[1]["x-amzn-invoked-production-variant"] for _ in range(400)
    )
    assert seen["big"] + seen["small"] == 400
    assert 0.6 < seen["big"] / 400 < 0.9
    out = gateway.rt.invoke_endpoint(EndpointName="split", Body=b"{}", TargetVariant="small")
    assert out["InvokedProductionVariant"] == "small"
    with pytest.raises(ClientError) as err:
        gateway.rt.invoke_endpoint(EndpointName="split", Body=b"{}", TargetVariant="nope")
    assert err.value.response["Error"]["Code"] == "ValidationError"


def test_invocation_timeout_gives_model_error(gateway_factory: Any, model_tarball: Any) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_INVOCATION_TIMEOUT_S": "1"})
    deploy(gw.sm, "slow", model_tarball("sleepy"))
    status, headers, body = _invoke(gw, "slow", b'{"sleep": 3}')
    assert status == 424 and headers["x-amzn-errortype"] == "ModelError"
    assert b"timed out" in body
    # As every ModelError: the endpoint's log group, where its instances' logs go.
    assert json.loads(body)["LogStreamArn"].endswith(":log-group:/aws/sagemaker/Endpoints/slow")
    # The instance finishes the abandoned request on its handler thread, then serves again.
    wait_until(lambda: _invoke(gw, "slow", b'{"sleep": 0}')[0] == 200, "serving again", 10)


def test_killed_instance_is_restarted_and_traffic_keeps_flowing(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    deploy(gateway.sm, "sturdy", model_tarball("echo"), count=2)
    before = instance_pids(gateway.process.pid)
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)
    rt = gateway.client("sagemaker-runtime", max_attempts=5)
    for _ in range(50):
        out = rt.invoke_endpoint(EndpointName="sturdy", Body=b'{"n": 1}')
        assert json.loads(out["Body"].read()) == {"n": 1}
    wait_for_instance_count(gateway, "sturdy", 2)
    after = instance_pids(gateway.process.pid)
    assert len(after) == 2 and before[0] not in after
    assert gateway.sm.describe_endpoint(EndpointName="sturdy")["EndpointStatus"] == "InService"


def wait_for_instance_count(gw: GatewayProcess, name: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        variant = gw.sm.describe_endpoint(EndpointName=name)["ProductionVariants"][0]
        if variant["CurrentInstanceCount"] == count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never reached {count} instances")


def test_metrics_count_invocations_and_errors(gateway: GatewayProcess, model_tarball: Any) -> None:
    deploy(gateway.sm, "counted", model_tarball("predict_raises"))
    for _ in range(3):
        _invoke(gateway, "counted", b'{"instances": [[1]]}')
    status, text = gateway.get("/metrics")
    assert status == 200
    lines = text.decode().splitlines()
    assert 'shipyard_invocations_total{endpoint="counted",variant="v1"} 3.0' in lines
    # The model answered 500: Invocation5XXErrors, as CloudWatch counts it (not ModelError's 424).
    assert 'shipyard_invocation_5xx_errors_total{endpoint="counted",variant="v1"} 3.0' in lines
    assert any(line.startswith("shipyard_overhead_latency_seconds_bucket") for line in lines)
    assert 'shipyard_instances{endpoint="counted",state="healthy",variant="v1"} 1.0' in lines
    wait_in_service(gateway.sm, "counted")


def test_s3_artifacts_and_a_postgres_store(
    gateway_factory: Any, bucket: Any, tmp_path: Path, pg_schema: PgSchema
) -> None:
    """The at-scale parts together: metadata in PostgreSQL, the model in S3 (skipped,
    saying why, where PostgreSQL is absent)."""
    import sqlalchemy

    from tests.conftest import make_tarball

    uri = bucket.put("models/sum/model.tar.gz", make_tarball("sum", tmp_path / "sum.tar.gz"))
    gw = gateway_factory(
        extra_env={"SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url}, args=["--db", pg_schema.url]
    )
    deploy(gw.sm, "from-s3", uri)
    out = gw.rt.invoke_endpoint(EndpointName="from-s3", Body=b"[[1, 2, 3]]")
    assert json.loads(out["Body"].read()) == [6.0]
    with pg_schema.admin.connect() as conn:  # the store really is PostgreSQL
        query = f"SELECT status FROM {pg_schema.name}.endpoints WHERE name = 'from-s3'"
        assert conn.execute(sqlalchemy.text(query)).scalar() == "InService"
    assert not (gw.home / "shipyard.db").exists()


def test_unsafe_tarball_fails_the_endpoint_and_writes_nothing_outside(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    import tarfile

    from tests.conftest import tar_bytes

    info = tarfile.TarInfo("../../escaped.txt")
    info.size = 4
    archive = tmp_path / "evil" / "model.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(tar_bytes([(info, b"evil")]))
    deploy(gateway.sm, "evil", archive.as_uri(), wait=False)
    from botocore.exceptions import WaiterError

    with pytest.raises(WaiterError):
        wait_in_service(gateway.sm, "evil")
    reason = gateway.sm.describe_endpoint(EndpointName="evil")["FailureReason"]
    assert "unsafe" in reason and "../../escaped.txt" in reason
    assert not list(gateway.home.parent.rglob("escaped.txt"))
    assert gateway.get("/healthz")[0] == 200


def test_full_instances_answer_503_instead_of_queueing(
    gateway_factory: Any, model_tarball: Any
) -> None:
    import threading

    gw = gateway_factory(extra_env={"SHIPYARD_MAX_QUEUE_PER_INSTANCE": "1"})
    deploy(gw.sm, "busy", model_tarball("sleepy"))
    slow = threading.Thread(target=_invoke, args=(gw, "busy", b'{"sleep": 1.5}'))
    slow.start()
    wait_until(lambda: in_flight(gw, "busy") == 1, "the slow request on the instance")
    status, headers, _ = _invoke(gw, "busy", b'{"sleep": 0}')
    slow.join()
    assert status == 503 and headers["x-amzn-errortype"] == "ServiceUnavailable"
    assert _invoke(gw, "busy", b'{"sleep": 0}')[0] == 200


def test_large_and_chunked_bodies_stream_through(gateway: GatewayProcess) -> None:
    import http.client

    server = MODELS / "cmd_headers" / "server.py"
    deploy(gateway.sm, "big", (MODELS / "cmd_headers").as_uri(), image=f"cmd:python {server}")
    body = b"x" * (5 * 1024 * 1024)
    status, _, answer = _invoke(gateway, "big", body)
    assert status == 200 and json.loads(answer)["body_bytes"] == len(body)
    conn = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=30)
    conn.request(
        "POST",
        "/endpoints/big/invocations",
        body=iter([b"a" * 1000, b"b" * 24]),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    reply = conn.getresponse()
    assert reply.status == 200 and json.loads(reply.read())["body_bytes"] == 1024
    conn.request(
        "POST",
        "/endpoints/big/invocations",
        body=iter([b"a" * (4 * 1024 * 1024)] * 2),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    reply = conn.getresponse()
    assert reply.status == 413
    conn.close()


def test_a_client_expecting_100_continue_gets_it_then_its_answer(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    deploy(gateway.sm, "continued", model_tarball("sum"))
    port = int(gateway.url.rsplit(":", 1)[1])
    head, payload = post_expecting_continue(
        port, "/endpoints/continued/invocations", b'{"instances": [[1, 2]]}'
    )
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"x-amzn-invoked-production-variant: v1" in head.lower()
    assert json.loads(payload) == json.loads(_expected_sum([[1, 2]]))
