"""InvokeEndpointWithResponseStream through boto3, against a real gateway and
real instances: tests/models/streamer (a generator in the built-in runtime) and
tests/models/cmd_stream (a `cmd:` server answering chunked)."""

from __future__ import annotations

import http.client
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EventStreamError

from tests.conftest import MODELS, GatewayProcess, deploy, in_flight, start_gateway, wait_until

STREAMER = "streamer"
CMD = "cmd-stream"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("streaming") / "home"
    # Chunks come at most 0.4 s apart below; only the timeout test waits longer.
    gateway = start_gateway(home, extra_env={"SHIPYARD_INVOCATION_TIMEOUT_S": "1.5"})
    try:
        deploy(gateway.sm, STREAMER, (MODELS / "streamer").as_uri())
        server = MODELS / "cmd_stream" / "server.py"
        deploy(gateway.sm, CMD, (MODELS / "cmd_stream").as_uri(), image=f"cmd:python {server}")
        yield gateway
    finally:
        gateway.stop()


def stream(gw: GatewayProcess, endpoint: str, request: dict[str, Any], **kwargs: Any) -> Any:
    rt = gw.client("sagemaker-runtime", max_attempts=1)
    return rt.invoke_endpoint_with_response_stream(
        EndpointName=endpoint,
        ContentType="application/json",
        Body=json.dumps(request).encode(),
        **kwargs,
    )


def timed_parts(response: Any) -> list[tuple[float, bytes]]:
    """Each PayloadPart's bytes and when it arrived."""
    return [(time.monotonic(), event["PayloadPart"]["Bytes"]) for event in response["Body"]]


def metric(gw: GatewayProcess, name: str, endpoint: str) -> float:
    """A per-variant counter or histogram count of the gateway's /metrics (0 when absent)."""
    status, body = gw.get("/metrics")
    assert status == 200
    prefix = f'{name}{{endpoint="{endpoint}",variant="v1"}} '
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def test_chunks_arrive_as_the_model_yields_them(gw: GatewayProcess) -> None:
    started = time.monotonic()
    response = stream(gw, STREAMER, {"chunks": 4, "gap_s": 0.4}, Accept="text/plain")
    parts = timed_parts(response)
    assert [data for _, data in parts] == [f"chunk {n}\n".encode() for n in range(4)]
    # Had the gateway (or the runtime) gathered the answer, every part would arrive at
    # the end, together; each comes about gap_s after the one before.
    arrivals = [at for at, _ in parts]
    assert arrivals[0] - started < 1.0
    assert all(gap > 0.25 for gap in gaps(arrivals))
    assert response["ContentType"] == "text/plain"
    assert response["InvokedProductionVariant"] == "v1"
    assert response["CustomAttributes"] == "streamed=yes"


def test_a_failure_mid_stream_ends_it_with_model_stream_error(gw: GatewayProcess) -> None:
    response = stream(gw, STREAMER, {"chunks": 5, "fail_after": 2})
    events = iter(response["Body"])
    assert next(events) == {"PayloadPart": {"Bytes": b"chunk 0\n"}}
    assert next(events) == {"PayloadPart": {"Bytes": b"chunk 1\n"}}
    with pytest.raises(EventStreamError) as raised:
        next(events)
    error = raised.value.response["Error"]
    assert error["Code"] == "ModelStreamError"
    assert "RuntimeError: the model broke after 2 chunks" in error["Message"]
    # The instance is fine and its connection reusable: the next stream is whole.
    again = stream(gw, STREAMER, {"chunks": 2})
    assert [e["PayloadPart"]["Bytes"] for e in again["Body"]] == [b"chunk 0\n", b"chunk 1\n"]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"fail_first": True}, "ValueError: refused before the first chunk"),
        ({"fail_after": 0}, "RuntimeError: the model broke after 0 chunks"),
    ],
    ids=["predict_fn raises", "the generator raises at once"],
)
def test_a_model_that_fails_before_its_first_chunk_gets_a_model_error(
    gw: GatewayProcess, request_: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClientError) as raised:
        stream(gw, STREAMER, request_)
    error = raised.value.response
    assert error["Error"]["Code"] == "ModelError"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["OriginalStatusCode"] == 500
    assert message in error["OriginalMessage"]


def test_streams_are_counted_like_invocations(gw: GatewayProcess) -> None:
    counted = ("shipyard_invocations_total", "shipyard_model_latency_seconds_count")
    before = [metric(gw, name, STREAMER) for name in counted]
    errors = metric(gw, "shipyard_invocation_5xx_errors_total", STREAMER)
    for _ in range(3):
        assert len(list(stream(gw, STREAMER, {"chunks": 2})["Body"])) == 2
    with pytest.raises(ClientError):
        stream(gw, STREAMER, {"fail_first": True})
    assert [metric(gw, name, STREAMER) - b for name, b in zip(counted, before, strict=True)] == [
        4,
        3,
    ]
    # The model answered 500 before streaming: a 5XX error, as CloudWatch counts it.
    assert metric(gw, "shipyard_invocation_5xx_errors_total", STREAMER) == errors + 1


def test_bad_requests_get_validation_errors(gw: GatewayProcess) -> None:
    cases: list[dict[str, Any]] = [
        {"EndpointName": "no-such-endpoint"},
        {"EndpointName": STREAMER, "TargetVariant": "nope"},
        {"EndpointName": STREAMER, "CustomAttributes": "x" * 1025},
    ]
    rt = gw.client("sagemaker-runtime", max_attempts=1)
    for case in cases:
        with pytest.raises(ClientError) as raised:
            rt.invoke_endpoint_with_response_stream(Body=b"{}", **case)
        assert raised.value.response["Error"]["Code"] == "ValidationError", case
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_invoke_endpoint_gets_a_streaming_model_s_whole_answer(gw: GatewayProcess) -> None:
    out = gw.rt.invoke_endpoint(
        EndpointName=STREAMER, ContentType="application/json", Body=b'{"chunks": 3}'
    )
    assert out["Body"].read() == b"chunk 0\nchunk 1\nchunk 2\n"
    assert out["CustomAttributes"] == "streamed=yes"
    with pytest.raises(ClientError) as raised:
        gw.rt.invoke_endpoint(
            EndpointName=STREAMER,
            ContentType="application/json",
            Body=b'{"chunks": 3, "fail_after": 1}',
        )
    assert raised.value.response["Error"]["Code"] == "ModelError"
    assert "the model broke after 1 chunks" in raised.value.response["OriginalMessage"]


def test_a_cmd_server_s_chunks_pass_through_as_they_come(gw: GatewayProcess) -> None:
    response = stream(gw, CMD, {"chunks": 3, "gap_s": 0.4})
    parts = timed_parts(response)
    assert [data for _, data in parts] == [b"part 0;", b"part 1;", b"part 2;"]
    assert all(gap > 0.25 for gap in gaps([at for at, _ in parts]))
    assert response["ContentType"] == "text/plain"
    assert response["CustomAttributes"] == "from=cmd"


def test_a_cmd_server_that_drops_the_connection_breaks_the_stream(gw: GatewayProcess) -> None:
    events = iter(stream(gw, CMD, {"chunks": 3, "break_after": 1})["Body"])
    assert next(events) == {"PayloadPart": {"Bytes": b"part 0;"}}
    with pytest.raises(EventStreamError) as raised:
        next(events)
    assert raised.value.response["Error"]["Code"] == "ModelStreamError"
    assert "broke off" in raised.value.response["Error"]["Message"]
    # Before any chunk went out, the same failure is an ordinary ModelError.
    with pytest.raises(ClientError) as refused:
        stream(gw, CMD, {"chunks": 3, "break_after": 0})
    assert refused.value.response["Error"]["Code"] == "ModelError"
    assert "broke off" in refused.value.response["OriginalMessage"]


def test_a_client_that_leaves_mid_stream_releases_the_instance(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """A generator that never ends, and a client that reads a little and hangs up: the
    gateway gives the instance back and the runtime closes the generator."""
    events = tmp_path / "events.txt"
    request = {"forever": True, "gap_s": 0.05, "events": str(events)}
    port = int(gw.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "POST",
        f"/endpoints/{STREAMER}/invocations-response-stream",
        body=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    assert answer.status == 200
    assert answer.getheader("Content-Type") == "application/vnd.amazon.eventstream"
    assert answer.read1(64)  # the first event is under way
    assert in_flight(gw, STREAMER) == 1
    connection.close()
    wait_until(lambda: in_flight(gw, STREAMER) == 0, "the instance given back")
    wait_until(lambda: "closed" in events.read_text(), "the generator closed")
    out = stream(gw, STREAMER, {"chunks": 1})
    assert [e["PayloadPart"]["Bytes"] for e in out["Body"]] == [b"chunk 0\n"]


def test_a_model_silent_past_the_invocation_timeout_ends_the_stream(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """The timeout (1.5 s here) bounds each wait for the model, not the whole stream."""
    long = stream(gw, STREAMER, {"chunks": 6, "gap_s": 0.4})  # 2 s in all, in 0.4 s steps
    assert len([e["PayloadPart"]["Bytes"] for e in long["Body"]]) == 6
    events = tmp_path / "events.txt"
    silent = stream(gw, STREAMER, {"chunks": 3, "gap_s": 3, "events": str(events)})
    parts = iter(silent["Body"])
    assert next(parts) == {"PayloadPart": {"Bytes": b"chunk 0\n"}}
    with pytest.raises(EventStreamError) as raised:
        next(parts)
    assert raised.value.response["Error"]["Code"] == "ModelStreamError"
    assert "sent nothing for 1.5 seconds" in raised.value.response["Error"]["Message"]
    wait_until(lambda: in_flight(gw, STREAMER) == 0, "the instance given back")
    # The runtime stops pulling from the generator once the gateway has gone.
    wait_until(lambda: "closed" in events.read_text(), "the generator closed", timeout_s=10)


def test_a_model_silent_past_the_timeout_before_its_first_chunk_is_a_model_error(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """Sent to its instance and unanswered within the timeout: the model's ModelError
    (424), never a 503 that boto3 would send again to another instance; whether the
    instance still passes its health checks has no say in it."""
    from tests.conftest import make_tarball

    deploy(gw.sm, "sleepy-stream", make_tarball("sleepy", tmp_path / "m.tar.gz").as_uri())
    with pytest.raises(ClientError) as raised:
        stream(gw, "sleepy-stream", {"sleep": 3})
    error = raised.value.response
    assert error["Error"]["Code"] == "ModelError", error
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["OriginalStatusCode"] == 504


def test_a_signed_stream_passes_the_auth_section(tmp_path: Path) -> None:
    """With ``auth:``, the door takes boto3's signed call (the body already read by the
    signature check) and refuses a call signed with an unknown key."""
    from tests.e2e.test_auth import APP, APP_SECRET, OPS, OPS_SECRET, SECRETS, client, write_stack

    stack = write_stack(tmp_path / "stack.yaml", file_roots=[str(MODELS)])
    gateway = start_gateway(tmp_path / "home", extra_env=SECRETS, args=["--config", str(stack)])
    try:
        sm = client(gateway, "sagemaker", OPS, OPS_SECRET)
        deploy(sm, STREAMER, (MODELS / "streamer").as_uri())
        rt = client(gateway, "sagemaker-runtime", APP, APP_SECRET)
        out = rt.invoke_endpoint_with_response_stream(
            EndpointName=STREAMER, ContentType="application/json", Body=b'{"chunks": 2}'
        )
        assert [e["PayloadPart"]["Bytes"] for e in out["Body"]] == [b"chunk 0\n", b"chunk 1\n"]
        with pytest.raises(ClientError) as raised:
            stream(gateway, STREAMER, {"chunks": 1})  # signed with a key it does not know
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    finally:
        gateway.stop()
