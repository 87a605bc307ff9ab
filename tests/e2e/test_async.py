"""Asynchronous endpoints end to end: boto3's InvokeEndpointAsync against real gateways,
real instance processes, real files and a real webhook receiver."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.exceptions import ClientError

from shipyard.storage.filesystems import local_path
from tests.conftest import (
    MODELS,
    GatewayProcess,
    PgSchema,
    make_tarball,
    unique,
    wait_dispatched,
    wait_until,
)
from tests.e2e.processes import instance_pids

TOPIC = "arn:aws:sns:us-east-1:123456789012:results"
COUNTER = MODELS / "async_counter" / "server.py"


@pytest.fixture
def async_gateway(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> GatewayProcess:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    return gateway_factory(args=["--config", str(stack)])


def deploy_async(
    sm: Any,
    name: str,
    out: Path,
    *,
    model_url: str | None = None,
    image: str = "shipyard/python",
    count: int = 1,
    max_concurrent: int | None = None,
    include: list[str] | None = None,
) -> None:
    sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": image, "ModelDataUrl": model_url or (MODELS / "echo").as_uri()},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    config: dict[str, Any] = {
        "OutputConfig": {
            "S3OutputPath": (out / "ok").as_uri(),
            "S3FailurePath": (out / "failed").as_uri(),
            "NotificationConfig": {
                "SuccessTopic": TOPIC,
                "ErrorTopic": TOPIC,
                "IncludeInferenceResponseIn": include or [],
            },
        }
    }
    if max_concurrent is not None:
        config["ClientConfig"] = {"MaxConcurrentInvocationsPerInstance": max_concurrent}
    sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": name,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": count,
            }
        ],  # fmt: skip
        AsyncInferenceConfig=config,
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )


def put_input(tmp_path: Path, body: Any) -> str:
    path = tmp_path / "inputs" / f"{uuid.uuid4().hex}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path.as_uri()


def wait_file(uri: str, timeout_s: float = 30) -> bytes:
    path = local_path(uri)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{uri} never appeared"
        time.sleep(0.05)
    return path.read_bytes()


def results(webhook: Any, inference_id: str | None = None) -> list[dict[str, Any]]:
    messages = [json.loads(r.body["message"]) for r in webhook.requests if r.status == 200]
    messages = [m for m in messages if m.get("eventName") == "InferenceResult"]
    if inference_id is not None:
        messages = [m for m in messages if m["inferenceId"] == inference_id]
    return messages


def wait_results(webhook: Any, count: int, timeout_s: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while len(results(webhook)) < count:
        assert time.monotonic() < deadline, f"{len(results(webhook))} of {count} notifications"
        time.sleep(0.05)
    return results(webhook)


def test_an_async_request_lands_in_the_output_path_and_is_announced(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    sm, rt = async_gateway.sm, async_gateway.rt
    name = unique("async")
    deploy_async(sm, name, tmp_path / "out", include=["SUCCESS_NOTIFICATION_TOPIC"])
    described = sm.describe_endpoint_config(EndpointConfigName=name)
    assert described["AsyncInferenceConfig"]["OutputConfig"]["S3OutputPath"].endswith("/out/ok")
    tests = [json.loads(r.body["message"]) for r in webhook.wait_for(1)]
    assert tests[0]["eventName"] == "TestNotification"

    answer = rt.invoke_endpoint_async(
        EndpointName=name,
        InputLocation=put_input(tmp_path, {"x": [1, 2]}),
        ContentType="application/json",
        Accept="application/json",
    )
    inference_id = answer["InferenceId"]
    assert answer["OutputLocation"] == (tmp_path / "out" / "ok" / f"{inference_id}.out").as_uri()
    assert answer["FailureLocation"].endswith(f"/out/failed/{inference_id}-error.out")
    assert json.loads(wait_file(answer["OutputLocation"])) == {"x": [1, 2]}
    [message] = wait_results(webhook, 1)
    assert message["invocationStatus"] == "Completed"
    assert message["inferenceId"] == inference_id
    assert message["responseParameters"]["outputLocation"] == answer["OutputLocation"]
    assert message["requestParameters"]["endpointName"] == name
    assert message["responseBody"]["content"] == '{"x": [1, 2]}'
    for key in ("awsRegion", "eventTime", "receivedTime", "eventVersion", "eventSource"):
        assert key in message
    assert not Path(answer["FailureLocation"].removeprefix("file://")).exists()
    status, metrics = async_gateway.get("/metrics")
    assert b"shipyard_async_backlog_size" in metrics
    assert b"shipyard_async_oldest_request_age_seconds" in metrics


def test_a_model_error_lands_in_the_failure_path_and_is_announced(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    name = unique("asyncfail")
    model = make_tarball("predict_raises", tmp_path / "m" / "model.tar.gz").as_uri()
    deploy_async(async_gateway.sm, name, tmp_path / "out", model_url=model)
    answer = async_gateway.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, [1])
    )
    reason = wait_file(answer["FailureLocation"]).decode()
    assert "ModelError" in reason and "bad input for model" in reason
    [message] = wait_results(webhook, 1)
    assert message["invocationStatus"] == "Failed"
    assert "bad input for model" in message["failureReason"]
    assert not Path(answer["OutputLocation"].removeprefix("file://")).exists()


@pytest.mark.parametrize(
    ("blocked", "model"),
    [(["failed"], "predict_raises"), (["ok", "failed"], "echo")],
    ids=["failure-path-unwritable", "output-and-failure-paths-unwritable"],
)
def test_a_request_whose_outcome_file_cannot_be_written_still_ends_failed(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any, blocked: list[str], model: str
) -> None:
    """A file where the output or failure folder must be: the write is refused every time
    (the walk beneath the root meets no folder there), and the request still ends Failed,
    announced once, its reason telling why, rather than staying Running and retried."""
    name = unique("asyncunwritable")
    out = tmp_path / "out"
    url = make_tarball(model, tmp_path / "m" / "model.tar.gz").as_uri()
    deploy_async(async_gateway.sm, name, out, model_url=url)
    out.mkdir(exist_ok=True)
    for folder in blocked:
        (out / folder).write_text("a file where a folder must be")
    answer = async_gateway.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, [1]), ContentType="application/json"
    )
    [message] = wait_results(webhook, 1)
    assert message["invocationStatus"] == "Failed", message
    reason = message["failureReason"]
    assert "could not be written to the FailureLocation" in reason, reason
    if model == "predict_raises":
        assert "bad input for model" in reason, reason
    else:
        assert f"/out/ok/{answer['InferenceId']}.out" in reason, reason
    with sqlite3.connect(async_gateway.home / "shipyard.db") as db:
        status, stored = db.execute(
            "SELECT status, failure_reason FROM async_requests WHERE inference_id = ?",
            (answer["InferenceId"],),
        ).fetchone()
    assert (status, stored) == ("Failed", reason)


def test_unreadable_input_and_timeouts_fail_with_a_reason(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    name = unique("asyncto")
    deploy_async(async_gateway.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=2)  # fmt: skip
    rt = async_gateway.rt
    missing = rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=(tmp_path / "nope.json").as_uri()
    )
    assert "Could not read the input" in wait_file(missing["FailureLocation"]).decode()
    slow = rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 3}),
        InvocationTimeoutSeconds=1,
    )  # fmt: skip
    assert "timed out after 1 s" in wait_file(slow["FailureLocation"]).decode()
    assert len(wait_results(webhook, 2)) == 2


def test_bad_requests_get_validation_errors(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    sm, rt = async_gateway.sm, async_gateway.rt
    name = unique("asyncbad")
    deploy_async(sm, name, tmp_path / "out")
    for kwargs in (
        {"InputLocation": "ftp://host/x"},
        {"InputLocation": put_input(tmp_path, 1), "RequestTTLSeconds": 30000},
        {"InputLocation": put_input(tmp_path, 1), "InvocationTimeoutSeconds": 4000},
    ):
        with pytest.raises(ClientError) as err:
            rt.invoke_endpoint_async(EndpointName=name, **kwargs)
        assert err.value.response["Error"]["Code"] == "ValidationError", kwargs
    with pytest.raises(ClientError) as err:
        rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "asynchronous" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        rt.invoke_endpoint_async(EndpointName="missing", InputLocation=put_input(tmp_path, 1))
    assert err.value.response["Error"]["Code"] == "ValidationError"
    # A number is ASCII digits: not "1_000" or another script's digits, as int() takes.
    for ttl in ("1_000", "\u0666\u0660\u0660"):
        request = urllib.request.Request(
            f"{async_gateway.url}/endpoints/{name}/async-invocations",
            data=b"",
            method="POST",
            headers={
                "X-Amzn-SageMaker-InputLocation": put_input(tmp_path, 1),
                "X-Amzn-SageMaker-RequestTTLSeconds": ttl.encode().decode("latin-1"),
                "Content-Type": "application/json",
            },
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400, ttl


def test_an_inline_body_is_queued_with_the_request_and_answered_at_the_output_path(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    sm, rt = async_gateway.sm, async_gateway.rt
    name = unique("asyncbody")
    deploy_async(sm, name, tmp_path / "out")
    answer = rt.invoke_endpoint_async(
        EndpointName=name, Body=b'{"inline": [1, 2]}', ContentType="application/json"
    )
    assert json.loads(wait_file(answer["OutputLocation"])) == {"inline": [1, 2]}
    [message] = wait_results(webhook, 1)
    assert message["invocationStatus"] == "Completed"
    assert message["requestParameters"]["inputLocation"] is None
    # As large as SageMaker allows: 128,000 bytes.
    largest = json.dumps("x" * (128_000 - 2)).encode()
    assert len(largest) == 128_000
    answer = rt.invoke_endpoint_async(
        EndpointName=name, Body=largest, ContentType="application/json"
    )
    assert wait_file(answer["OutputLocation"]) == largest


def test_an_inline_body_and_an_input_location_together_or_too_large_queue_nothing(
    async_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm, rt = async_gateway.sm, async_gateway.rt
    name = unique("asyncboth")
    deploy_async(sm, name, tmp_path / "out")
    location = put_input(tmp_path, {"from": "location"})
    for inference_id, kwargs, words in (
        ("both", {"Body": b'{"from": "body"}', "InputLocation": location}, "not both"),
        ("large", {"Body": json.dumps("x" * 128_000).encode()}, "maximum of 128000"),
    ):
        with pytest.raises(ClientError) as err:
            rt.invoke_endpoint_async(EndpointName=name, InferenceId=inference_id, **kwargs)
        assert err.value.response["Error"]["Code"] == "ValidationError", kwargs
        assert words in err.value.response["Error"]["Message"]
        # Nothing was queued under the id: a request queued under it would be the one
        # this returns (a repeated Inference-Id is answered with the earlier request).
        again = rt.invoke_endpoint_async(
            EndpointName=name, InferenceId=inference_id, InputLocation=location
        )
        assert json.loads(wait_file(again["OutputLocation"])) == {"from": "location"}
    with pytest.raises(ClientError) as err:
        rt.invoke_endpoint_async(EndpointName=name)
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "InputLocation" in err.value.response["Error"]["Message"]


def test_an_unknown_topic_or_output_path_is_refused_at_create(
    async_gateway: GatewayProcess, tmp_path: Path
) -> None:
    sm = async_gateway.sm
    sm.create_model(
        ModelName="m", PrimaryContainer={"Image": "shipyard/python",
                                         "ModelDataUrl": (MODELS / "echo").as_uri()},
    )  # fmt: skip
    variants = [{"VariantName": "v1", "ModelName": "m", "InstanceType": "ml.m5.large",
                 "InitialInstanceCount": 1}]  # fmt: skip
    for output in (
        {"S3OutputPath": (tmp_path / "o").as_uri(),
         "NotificationConfig": {"SuccessTopic": "arn:aws:sns:us-east-1:123456789012:nope"}},
        {"S3OutputPath": "relative/path"},
    ):  # fmt: skip
        with pytest.raises(ClientError) as err:
            sm.create_endpoint_config(
                EndpointConfigName=unique("c"),
                ProductionVariants=variants,
                AsyncInferenceConfig={"OutputConfig": output},
            )
        assert err.value.response["Error"]["Code"] == "ValidationException"


def test_a_full_queue_refuses_with_503_and_queues_nothing(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    """SHIPYARD_MAX_ASYNC_QUEUE=3 and a model busy for a minute with the first request:
    three requests are unfinished (one running, two queued), the fourth is refused in the
    runtime's shape with Retry-After, and nothing more is queued."""
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    gw = gateway_factory(
        args=["--config", str(stack)],
        extra_env={"SHIPYARD_MAX_ASYNC_QUEUE": "3", "SHIPYARD_DRAIN_TIMEOUT_S": "1"},
    )
    name = unique("asyncfull")
    deploy_async(gw.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=1)  # fmt: skip
    slow = put_input(tmp_path, {"sleep": 60})
    answers = [
        gw.rt.invoke_endpoint_async(EndpointName=name, InputLocation=slow, InferenceId=f"r{i}")
        for i in range(3)
    ]
    rt = gw.client("sagemaker-runtime", max_attempts=1)
    with pytest.raises(ClientError) as refused:
        rt.invoke_endpoint_async(EndpointName=name, InputLocation=slow)
    error = refused.value.response
    assert error["Error"]["Code"] == "ServiceUnavailable", error
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "SHIPYARD_MAX_ASYNC_QUEUE" in error["Error"]["Message"]
    request = urllib.request.Request(
        f"{gw.url}/endpoints/{name}/async-invocations",
        method="POST",
        headers={"X-Amzn-SageMaker-InputLocation": slow},
    )
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=10)
    assert raw.value.code == 503
    assert raw.value.headers["x-amzn-ErrorType"] == "ServiceUnavailable"
    assert raw.value.headers["Retry-After"] == "30"
    assert json.loads(raw.value.read())["ErrorCode"] == "ServiceUnavailable"
    # A repeated Inference-Id is still answered with the request it names.
    again = rt.invoke_endpoint_async(EndpointName=name, InputLocation=slow, InferenceId="r2")
    assert again["OutputLocation"] == answers[2]["OutputLocation"]
    with sqlite3.connect(gw.home / "shipyard.db") as db:
        ids = db.execute("SELECT inference_id FROM async_requests WHERE endpoint = ?", (name,))
        assert sorted(row[0] for row in ids) == ["r0", "r1", "r2"]


def test_a_real_time_endpoint_refuses_async_invocations(
    async_gateway: GatewayProcess, tmp_path: Path
) -> None:
    from tests.conftest import deploy

    deploy(async_gateway.sm, "rt", (MODELS / "echo").as_uri())
    with pytest.raises(ClientError) as err:
        async_gateway.rt.invoke_endpoint_async(
            EndpointName="rt", InputLocation=put_input(tmp_path, 1)
        )
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "not an asynchronous endpoint" in err.value.response["Error"]["Message"]


def test_a_repeated_inference_id_is_processed_once(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    name = unique("asyncid")
    deploy_async(async_gateway.sm, name, tmp_path / "out")
    rt = async_gateway.rt
    location = put_input(tmp_path, {"n": 1})
    first = rt.invoke_endpoint_async(EndpointName=name, InputLocation=location, InferenceId="job-1")
    wait_file(first["OutputLocation"])
    again = rt.invoke_endpoint_async(EndpointName=name, InputLocation=location, InferenceId="job-1")
    assert again["InferenceId"] == "job-1"
    assert again["OutputLocation"] == first["OutputLocation"]
    # The repeat queued nothing: the request ran once, and its one event went out.
    with sqlite3.connect(async_gateway.home / "shipyard.db") as db:
        rows = db.execute(
            "SELECT status, attempts FROM async_requests WHERE inference_id = 'job-1'"
        ).fetchall()
    assert rows == [("Completed", 1)]
    wait_dispatched(async_gateway)
    assert len(results(webhook, "job-1")) == 1


def test_an_endpoint_made_again_under_its_name_runs_its_own_requests(
    async_gateway: GatewayProcess, tmp_path: Path
) -> None:
    """Deleting an endpoint drops its queue: one made again under the name runs a
    request with an InferenceId the old one used, and answers it in its own output path."""
    sm, rt = async_gateway.sm, async_gateway.rt
    name = unique("again")
    deploy_async(sm, name, tmp_path / "first")
    first = rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"n": 1}), InferenceId="same"
    )
    wait_file(first["OutputLocation"])
    sm.delete_endpoint(EndpointName=name)
    sm.get_waiter("endpoint_deleted").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    sm.delete_endpoint_config(EndpointConfigName=name)
    sm.delete_model(ModelName=name)
    deploy_async(sm, name, tmp_path / "second")
    second = rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"n": 2}), InferenceId="same"
    )
    assert second["OutputLocation"] != first["OutputLocation"]
    assert "/second/" in second["OutputLocation"]
    assert json.loads(wait_file(second["OutputLocation"])) == {"n": 2}


def test_an_inference_id_names_a_file_in_the_output_path_whatever_its_characters(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    # '%2F' read as '/' and '#' as a fragment's start once steered the output (and the
    # failure file a success removes) out of the output path, onto any file a caller's
    # InvokeEndpoint key could name.
    name = unique("asyncname")
    deploy_async(async_gateway.sm, name, tmp_path / "out")
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    for inference_id in ("..%2F..%2Fvictim.txt#", "50% of a?b"):
        answer = async_gateway.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, {"n": 3}), InferenceId=inference_id
        )
        assert json.loads(wait_file(answer["OutputLocation"])) == {"n": 3}
        assert (tmp_path / "out" / "ok" / f"{inference_id}.out").is_file()
    assert victim.read_text() == "untouched"
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == sorted(
        ["..%2F..%2Fvictim.txt#.out", "50% of a?b.out"]
    )


def test_output_path_extension_and_filename_place_the_output(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    name = unique("asyncext")
    deploy_async(async_gateway.sm, name, tmp_path / "out")
    answer = async_gateway.rt.invoke_endpoint_async(
        EndpointName=name,
        InputLocation=put_input(tmp_path, {"n": 2}),
        S3OutputPathExtension="2026/11",
        Filename="result.json",
    )
    assert answer["OutputLocation"] == (tmp_path / "out" / "ok" / "2026/11/result.json").as_uri()
    assert json.loads(wait_file(answer["OutputLocation"])) == {"n": 2}
    with pytest.raises(ClientError) as err:
        async_gateway.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, 1), Filename="a.b.c"
        )
    assert err.value.response["Error"]["Code"] == "ValidationError"


def test_in_flight_requests_per_instance_never_pass_the_cap(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    name = unique("asynccap")
    deploy_async(async_gateway.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=2)  # fmt: skip
    answers = [
        async_gateway.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 0.4})
        )
        for _ in range(8)
    ]
    seen = [json.loads(wait_file(a["OutputLocation"]))["max_in_flight"] for a in answers]
    assert max(seen) == 2, seen
    assert len(wait_results(webhook, 8)) == 8


def test_an_expired_request_is_not_run_and_fails_as_expired(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    """A request waits behind a slow one; its TTL is moved into the past in the store (the
    floor is 60 s), so when its turn comes it fails as expired without reaching the model."""
    name = unique("asyncttl")
    deploy_async(async_gateway.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=1)  # fmt: skip
    rt = async_gateway.rt
    slow = rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 2})
    )
    late = rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {}), RequestTTLSeconds=60
    )
    with sqlite3.connect(async_gateway.home / "shipyard.db") as db:
        db.execute(
            "UPDATE async_requests SET expires = '2000-01-01 00:00:00' WHERE inference_id = ?",
            (late["InferenceId"],),
        )
    wait_file(slow["OutputLocation"])
    assert "Request expired" in wait_file(late["FailureLocation"]).decode()
    [message] = [m for m in wait_results(webhook, 2) if m["inferenceId"] == late["InferenceId"]]
    assert message["invocationStatus"] == "Failed" and "expired" in message["failureReason"]


def test_a_queued_backlog_survives_a_gateway_kill(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    home = tmp_path / "home"
    gw = gateway_factory(home, args=["--config", str(stack)])
    name = unique("asynckill")
    deploy_async(gw.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=1)  # fmt: skip
    answers = [
        gw.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 0.3})
        )
        for _ in range(8)
    ]
    wait_file(answers[0]["OutputLocation"])
    gw.stop(signal.SIGKILL)
    again = gateway_factory(home, args=["--config", str(stack)])
    again.sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    for answer in answers:
        wait_file(answer["OutputLocation"], timeout_s=60)
    found = wait_results(webhook, 8, timeout_s=60)
    wait_dispatched(again)
    # A delivery the webhook took just before the kill, before "sent" was committed, is
    # sent again after its lease with the same delivery key (the one documented window):
    # each request is announced under exactly one key, and every request is announced.
    keys: dict[str, set[str]] = {}
    for request in webhook.requests:
        if request.status != 200:
            continue
        message = json.loads(request.body["message"])
        if message.get("eventName") == "InferenceResult":
            key = request.headers["x-shipyard-delivery-key"]
            keys.setdefault(message["inferenceId"], set()).add(key)
    assert sorted(keys) == sorted(a["InferenceId"] for a in answers), found
    assert all(len(k) == 1 for k in keys.values()), keys


def test_queued_inline_bodies_survive_a_gateway_kill(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path, webhook: Any
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    home = tmp_path / "home"
    gw = gateway_factory(home, args=["--config", str(stack)])
    name = unique("asyncbodykill")
    deploy_async(gw.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=1)  # fmt: skip
    bodies = [json.dumps({"sleep": 0.3, "pad": "x" * n}).encode() for n in range(6)]
    answers = [
        gw.rt.invoke_endpoint_async(EndpointName=name, Body=body, ContentType="application/json")
        for body in bodies
    ]
    wait_file(answers[0]["OutputLocation"])
    gw.stop(signal.SIGKILL)
    again = gateway_factory(home, args=["--config", str(stack)])
    again.sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    for body, answer in zip(bodies, answers, strict=True):
        # The counter model answers with the size of the body it got.
        out = json.loads(wait_file(answer["OutputLocation"], timeout_s=60))
        assert out["bytes"] == len(body), (out, len(body))


def test_two_gateways_on_postgresql_share_one_queue_and_run_each_request_once(
    gateway_factory: Callable[..., GatewayProcess],
    tmp_path: Path,
    webhook: Any,
    pg_schema: PgSchema,
) -> None:
    import sqlalchemy

    url, admin, schema = pg_schema.url, pg_schema.admin, pg_schema.name
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    args = ["--config", str(stack), "--db", url]
    first = gateway_factory(tmp_path / "a", args=args)
    name = unique("shared")
    deploy_async(first.sm, name, tmp_path / "out", image=f"cmd:python {COUNTER}",
                 model_url=(MODELS / "async_counter").as_uri(), max_concurrent=1)  # fmt: skip
    second = gateway_factory(tmp_path / "b", args=args)
    deadline = time.monotonic() + 60
    while True:  # the second gateway learns the instances of the first from the store
        described = second.sm.describe_endpoint(EndpointName=name)
        if described["ProductionVariants"][0]["CurrentInstanceCount"] == 1:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    fleet = [p for gw in (first, second) for p in instance_pids(gw.process.pid)]
    assert len(fleet) == 1  # one fleet, whichever gateway runs it
    answers = [
        gw.rt.invoke_endpoint_async(
            EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 0.2})
        )
        for _ in range(10)
        for gw in (first, second)
    ]
    for answer in answers:
        wait_file(answer["OutputLocation"], timeout_s=60)
    wait_results(webhook, 20)
    deadline = time.monotonic() + 30
    query = f"SELECT count(*) FROM {schema}.events WHERE dispatched_at IS NULL"
    while True:  # every event dispatched: nothing more will be sent
        with admin.connect() as conn:
            if conn.execute(sqlalchemy.text(query)).scalar() == 0:
                break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ids = sorted(m["inferenceId"] for m in results(webhook))
    assert ids == sorted(a["InferenceId"] for a in answers)
    with admin.connect() as conn:
        owners = conn.execute(
            sqlalchemy.text(f"SELECT owner, attempts FROM {schema}.async_requests")
        ).all()
    assert {attempts for _, attempts in owners} == {1}  # nothing ran twice
    assert len({owner for owner, _ in owners}) == 2  # both gateways took work


def test_a_request_whose_instance_dies_under_it_is_run_again(
    async_gateway: GatewayProcess, tmp_path: Path, webhook: Any
) -> None:
    """The instance's process died mid-request (as when the gateway running the fleet is
    lost): the request failed for good, where InvokeEndpoint's client would retry it."""
    name = unique("asyncdies")
    model = make_tarball("dies_once", tmp_path / "m" / "model.tar.gz").as_uri()
    deploy_async(async_gateway.sm, name, tmp_path / "out", model_url=model)
    marker = tmp_path / "died"
    answer = async_gateway.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"marker": str(marker)})
    )
    assert json.loads(wait_file(answer["OutputLocation"], timeout_s=60)) == {"marker": str(marker)}
    assert marker.exists()  # it did die once
    [message] = wait_results(webhook, 1)
    assert message["invocationStatus"] == "Completed"


def test_a_gateway_stopped_cleanly_gives_back_the_requests_it_was_running(
    gateway_factory: Callable[..., GatewayProcess],
    tmp_path: Path,
    model_tarball: Any,
    webhook: Any,
) -> None:
    """Not left Running under its name until their leases pass (InvocationTimeoutSeconds,
    15 minutes by default): another gateway on the store runs them at once."""
    from shipyard.records import AsyncStatus
    from shipyard.storage.async_queue import AsyncQueue
    from shipyard.storage.metadata import MetadataStore

    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    home = tmp_path / "home"
    gw = gateway_factory(home, args=["--config", str(stack)])
    name = unique("handback")
    deploy_async(gw.sm, name, tmp_path / "out", model_url=model_tarball("sleepy"))
    answer = gw.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 60})
    )
    store = MetadataStore(f"sqlite:///{home / 'shipyard.db'}")
    queue = AsyncQueue(store.engine)
    try:
        wait_until(
            lambda: queue.get(name, answer["InferenceId"]).status is AsyncStatus.RUNNING,
            "the request running",
        )
        gw.stop()
        request = queue.get(name, answer["InferenceId"])
        assert request.status is AsyncStatus.QUEUED and request.owner is None, request
    finally:
        store.close()


def test_a_killed_gateways_running_requests_are_run_by_another_within_a_lease(
    gateway_factory: Callable[..., GatewayProcess],
    tmp_path: Path,
    webhook: Any,
    pg_schema: PgSchema,
    model_tarball: Any,
) -> None:
    """They stayed Running under the dead gateway's name for InvocationTimeoutSeconds (15
    minutes by default): a gateway now renews what it runs, so they pass to another
    SHIPYARD_ASYNC_LEASE_S after its last renewal."""
    import sqlalchemy

    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"topics": {"results": [webhook.url]}}))
    args = ["--config", str(stack), "--db", pg_schema.url]
    env = {"SHIPYARD_ASYNC_LEASE_S": "3"}
    first = gateway_factory(tmp_path / "a", args=args, extra_env=env)
    name = unique("orphaned")
    deploy_async(first.sm, name, tmp_path / "out", model_url=model_tarball("sleepy"))
    answer = first.rt.invoke_endpoint_async(
        EndpointName=name, InputLocation=put_input(tmp_path, {"sleep": 5})
    )
    query = sqlalchemy.text(f"SELECT status FROM {pg_schema.name}.async_requests")

    def running() -> bool:
        with pg_schema.admin.connect() as conn:
            return conn.execute(query).scalar() == "Running"

    wait_until(running, "the request running on the first gateway")
    first.stop(signal.SIGKILL)
    gateway_factory(tmp_path / "b", args=args, extra_env=env)
    wait_file(answer["OutputLocation"], timeout_s=60)
    with pg_schema.admin.connect() as conn:
        attempts = conn.execute(
            sqlalchemy.text(f"SELECT attempts FROM {pg_schema.name}.async_requests")
        ).scalar()
    # The killed gateway's try, then the second's: once more if it first reached the dead
    # holder's instances, still in the routes it mirrored (back to the queue, as they died).
    assert attempts in (2, 3)
