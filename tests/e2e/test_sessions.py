"""Stateful sessions (SessionId) end to end with boto3, for a model written without
sessions (it answers no id of its own: the gateway names the session): opened on the
instance chosen for the request, followed there, closed by the model, refused once gone,
on plain variants, on inference components and on the response stream. A model's own
sessions: test_stateful_sessions.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, deploy, wait_until
from tests.e2e.test_gateway_workers import _workers, held_until_both_take_one
from tests.e2e.test_inference_components import component_endpoint, wait_component

SERVER = MODELS / "sessions" / "server.py"
IMAGE = f"cmd:python {SERVER}"


def ask(rt: Any, endpoint: str, body: bytes = b"hi", **extra: Any) -> tuple[dict[str, Any], Any]:
    out = rt.invoke_endpoint(EndpointName=endpoint, Body=body, **extra)
    return json.loads(out["Body"].read()), out


def test_a_session_stays_on_its_instance_until_the_model_closes_it(
    gateway: GatewayProcess,
) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "chat", (MODELS / "sessions").as_uri(), image=IMAGE, count=3,
           strategy="LEAST_OUTSTANDING_REQUESTS")  # fmt: skip

    first, out = ask(rt, "chat", SessionId="NEW_SESSION")
    assert first["session"] == "NEW_SESSION"  # as the client sent it: the model may open one
    header = out["NewSessionId"]
    # It opened none: the gateway's own id, with SageMaker's form of an expiry.
    assert re.fullmatch(r"[0-9a-f]+; Expires=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", header)
    session = header.split(";")[0]
    followed = [ask(rt, "chat", SessionId=session)[0] for _ in range(6)]
    assert {f["pid"] for f in followed} == {first["pid"]}
    assert {f["session"] for f in followed} == {session}  # from then on, the model sees it
    assert [f["turn"] for f in followed] == [1, 2, 3, 4, 5, 6]

    # Without a session, requests spread over the instances as before.
    assert len({ask(rt, "chat")[0]["pid"] for _ in range(30)}) > 1

    closing, out = ask(rt, "chat", b"close", SessionId=session)
    assert out["ClosedSessionId"] == session and closing["turn"] == 7
    with pytest.raises(ClientError) as gone:
        ask(rt, "chat", SessionId=session)
    assert gone.value.response["Error"]["Code"] == "ValidationError"
    assert f"Session {session} is not valid" in str(gone.value)
    with pytest.raises(ClientError) as unknown:
        ask(rt, "chat", SessionId="never-opened")
    assert unknown.value.response["Error"]["Code"] == "ValidationError"


def test_a_session_ends_with_its_instance(gateway: GatewayProcess) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "short", (MODELS / "sessions").as_uri(), image=IMAGE, count=2)
    # Sessions on both instances, so one of them loses its instance below.
    opened: dict[int, str] = {}
    while len(opened) < 2:
        answer, out = ask(rt, "short", SessionId="NEW_SESSION")
        opened.setdefault(answer["pid"], out["NewSessionId"].split(";")[0])
    sm.update_endpoint_weights_and_capacities(
        EndpointName="short",
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 1}],
    )
    wait_until(
        lambda: (
            sm.describe_endpoint(EndpointName="short")["ProductionVariants"][0][
                "CurrentInstanceCount"
            ]
            == 1
        ),
        "one instance left",
    )
    left = ask(rt, "short")[0]["pid"]
    assert ask(rt, "short", SessionId=opened[left])[0]["pid"] == left
    (lost,) = [session for pid, session in opened.items() if pid != left]
    with pytest.raises(ClientError) as gone:
        ask(rt, "short", SessionId=lost)
    assert gone.value.response["Error"]["Code"] == "ValidationError"
    assert "is not valid" in str(gone.value)

    # The instance left crashes and is restarted in place (same instance id): its
    # sessions died with its process.
    os.kill(left, signal.SIGKILL)
    wait_until(lambda: _pid_or_none(rt, "short") not in (None, left), "restarted in place")
    with pytest.raises(ClientError) as crashed:
        ask(rt, "short", SessionId=opened[left])
    assert crashed.value.response["Error"]["Code"] == "ValidationError"


def _pid_or_none(rt: Any, endpoint: str) -> int | None:
    try:
        return int(ask(rt, endpoint)[0]["pid"])
    except ClientError:
        return None


def test_sessions_on_components_and_on_the_response_stream(gateway: GatewayProcess) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "talk", count=1)
    sm.create_inference_component(
        InferenceComponentName="talker",
        EndpointName="talk",
        VariantName="AllTraffic",
        Specification={
            "Container": {"Image": IMAGE, "ArtifactUrl": (MODELS / "sessions").as_uri()},
            "ComputeResourceRequirements": {
                "NumberOfCpuCoresRequired": 0.5,
                "MinMemoryRequiredInMb": 512,
            },
        },  # fmt: skip
        RuntimeConfig={"CopyCount": 2},
    )
    wait_component(sm, "talker")
    first, out = ask(rt, "talk", SessionId="NEW_SESSION", InferenceComponentName="talker")
    session = out["NewSessionId"].split(";")[0]
    pids = {
        ask(rt, "talk", SessionId=session, InferenceComponentName="talker")[0]["pid"]
        for _ in range(5)
    }
    assert pids == {first["pid"]}

    streamed = rt.invoke_endpoint_with_response_stream(
        EndpointName="talk", Body=b"hi", SessionId=session, InferenceComponentName="talker"
    )
    body = b"".join(e["PayloadPart"]["Bytes"] for e in streamed["Body"] if "PayloadPart" in e)
    answer = json.loads(body)
    assert answer["pid"] == first["pid"] and answer["session"] == session
    opened = rt.invoke_endpoint_with_response_stream(
        EndpointName="talk", Body=b"hi", SessionId="NEW_SESSION", InferenceComponentName="talker"
    )
    header = opened["ResponseMetadata"]["HTTPHeaders"]["x-amzn-sagemaker-new-session-id"]
    list(opened["Body"])
    new_session = header.split(";")[0]
    wait_until(
        lambda: (
            ask(rt, "talk", SessionId=new_session, InferenceComponentName="talker")[0]["session"]
            == new_session
        ),
        "the streamed session followed",
    )


def test_a_session_follows_its_instance_across_weighted_variants(gateway: GatewayProcess) -> None:
    """With two production variants, a session's requests go to its instance's variant,
    not to the one a draw by weight would give."""
    sm, rt = gateway.sm, gateway.rt
    model = (MODELS / "sessions").as_uri()
    variants = [
        {"VariantName": name, "ModelName": "split", "InstanceType": "ml.m5.large",
         "InitialInstanceCount": 1, "InitialVariantWeight": 1.0}
        for name in ("a", "b")
    ]  # fmt: skip
    deploy(sm, "split", model, image=IMAGE, variants=variants)
    first, out = ask(rt, "split", SessionId="NEW_SESSION")
    session = out["NewSessionId"].split(";")[0]
    variant = out["InvokedProductionVariant"]
    for _ in range(12):
        answer, out = ask(rt, "split", SessionId=session)
        assert answer["pid"] == first["pid"]
        assert out["InvokedProductionVariant"] == variant


def test_a_session_is_followed_whichever_worker_takes_its_requests(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    """``--workers 2``: each worker routes by the id alone, so a session's requests reach
    its instance whichever worker accepts their connection."""
    gw = gateway_factory(args=["--workers", "2"])
    workers = _workers(gw)
    deploy(gw.sm, "chat", (MODELS / "sessions").as_uri(), image=IMAGE, count=2,
           strategy="LEAST_OUTSTANDING_REQUESTS")  # fmt: skip
    first, out = ask(gw.rt, "chat", SessionId="NEW_SESSION")
    session = out["NewSessionId"].split(";")[0]

    def follow(conn: HTTPConnection) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "X-Amzn-SageMaker-Session-Id": session}
        conn.request("POST", "/endpoints/chat/invocations", b"hi", headers)
        reply = conn.getresponse()
        assert reply.status == 200, reply.read()
        return dict(json.loads(reply.read()))

    answers = held_until_both_take_one(gw, workers, follow)
    assert {a["pid"] for a in answers} == {first["pid"]}
    assert [a["turn"] for a in answers] == list(range(1, len(answers) + 1))


def test_a_session_lives_as_long_as_shipyard_session_ttl_s(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_SESSION_TTL_S": "5"})
    deploy(gw.sm, "brief", (MODELS / "sessions").as_uri(), image=IMAGE, count=1)
    before = datetime.now(UTC).timestamp()
    _, out = ask(gw.rt, "brief", SessionId="NEW_SESSION")
    after = datetime.now(UTC).timestamp()
    session, expires = out["NewSessionId"].split("; Expires=")
    at = datetime.strptime(expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    # Opened between ``before`` and ``after``, for 5 s, rounded up to a whole second.
    assert before + 5 <= at.timestamp() <= after + 6
    assert ask(gw.rt, "brief", SessionId=session)[0]["turn"] == 1

    def refused() -> bool:
        try:
            ask(gw.rt, "brief", SessionId=session)
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ValidationError"
            return True
        return False

    wait_until(refused, "the session expired", timeout_s=15)
    assert datetime.now(UTC) >= at


@pytest.mark.parametrize("ttl", ["inf", "0.5", "nan", "999999999"])
def test_a_session_ttl_out_of_bounds_is_refused_at_start(tmp_path: Path, ttl: str) -> None:
    """SHIPYARD_SESSION_TTL_S is whole seconds from 1 to a week: one that no id could
    carry (infinite, past 2106) is refused at start, not at the first NEW_SESSION."""
    out = subprocess.run(
        [sys.executable, "-m", "shipyard", "serve", "--home", str(tmp_path / "h"), "--port", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "SHIPYARD_SESSION_TTL_S": ttl},
        timeout=60,
    )
    assert out.returncode == 2
    assert "session_ttl_s" in out.stderr
