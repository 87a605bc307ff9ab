"""Stateful sessions as SageMaker defines them, with boto3: the model creates the session
(its own id and expiry in X-Amzn-SageMaker-New-Session-Id), the gateway pins and passes
on what it answered; a built-in-runtime handler does the same through its context; open
sessions are bounded per endpoint."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.client import HTTPConnection
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, deploy, wait_until
from tests.e2e.test_gateway_workers import _workers, held_until_both_take_one

CONTAINER = f"cmd:python {MODELS / 'stateful' / 'server.py'}"
EXPIRES = re.compile(r"; Expires=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")


def ask(rt: Any, endpoint: str, body: bytes = b"hi", **extra: Any) -> tuple[dict[str, Any], Any]:
    out = rt.invoke_endpoint(EndpointName=endpoint, Body=body, **extra)
    return json.loads(out["Body"].read()), out


def refused(rt: Any, endpoint: str, session: str) -> bool:
    """Whether ``session`` is now the gateway's ValidationError (not the model's error)."""
    try:
        ask(rt, endpoint, SessionId=session)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "ValidationError", exc.response
        assert f"Session {session} is not valid" in str(exc)
        return True
    return False


def _expiry(header: str) -> float:
    found = EXPIRES.search(header)
    assert found, header
    return datetime.strptime(found[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_a_sagemaker_session_container_works_unchanged(gateway: GatewayProcess) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "stateful", (MODELS / "stateful").as_uri(), image=CONTAINER, count=2,
           strategy="LEAST_OUTSTANDING_REQUESTS")  # fmt: skip

    first, out = ask(rt, "stateful", SessionId="NEW_SESSION")
    header = out["NewSessionId"]
    session = header.split(";")[0]
    # The model's own id, and its own expiry (ten minutes), passed on as it answered.
    assert session == first["opened"] and session.startswith("sess-")
    assert abs(_expiry(header) - (time.time() + 600)) < 30
    followed = [ask(rt, "stateful", f"turn {n}".encode(), SessionId=session)[0] for n in range(6)]
    assert {f["pid"] for f in followed} == {first["pid"]}  # the instance holding it
    assert {f["session"] for f in followed} == {session}  # the model sees its own id
    assert [f["turns"] for f in followed] == [1, 2, 3, 4, 5, 6]
    # Without a session, requests spread over both instances.
    assert len({ask(rt, "stateful")[0]["pid"] for _ in range(30)}) == 2

    closing, out = ask(rt, "stateful", b"close", SessionId=session)
    assert out["ClosedSessionId"] == session and closing["turns"] == 7
    assert refused(rt, "stateful", session)
    assert refused(rt, "stateful", "sess-never-opened")

    # The model's expiry is the session's: one given in the past is over at once, a
    # short one once its time has come.
    _, out = ask(rt, "stateful", b'{"ttl": -5}', SessionId="NEW_SESSION")
    assert refused(rt, "stateful", out["NewSessionId"].split(";")[0])
    _, out = ask(rt, "stateful", b'{"ttl": 2}', SessionId="NEW_SESSION")
    brief = out["NewSessionId"].split(";")[0]
    ends = _expiry(out["NewSessionId"])
    wait_until(lambda: refused(rt, "stateful", brief), "the brief session expired", 20)
    assert time.time() >= ends


def test_a_models_session_on_the_response_stream(gateway: GatewayProcess) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "streamy", (MODELS / "stateful").as_uri(), image=CONTAINER, count=2)
    first, out = ask(rt, "streamy", SessionId="NEW_SESSION")
    session = out["NewSessionId"].split(";")[0]
    for turn in (1, 2, 3):
        streamed = rt.invoke_endpoint_with_response_stream(
            EndpointName="streamy", Body=b"hi", SessionId=session
        )
        parts = [e["PayloadPart"]["Bytes"] for e in streamed["Body"] if "PayloadPart" in e]
        answer = json.loads(b"".join(parts))
        assert answer == {"pid": first["pid"], "session": session, "turns": turn}


def test_a_models_session_is_followed_whichever_worker_takes_its_requests(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    """``--workers 2``: the worker that saw the session opened records where it lives in
    the store before the client has its id, so the other routes it too."""
    gw = gateway_factory(args=["--workers", "2"])
    workers = _workers(gw)
    deploy(gw.sm, "chat", (MODELS / "stateful").as_uri(), image=CONTAINER, count=2,
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
    assert [a["turns"] for a in answers] == list(range(1, len(answers) + 1))


def test_a_handler_keeps_sessions_through_its_context(gateway: GatewayProcess) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "ctx", (MODELS / "session_context").as_uri(), count=2)

    first, out = ask(rt, "ctx", SessionId="NEW_SESSION")
    assert first["seen"] == "NEW_SESSION"  # the handler read the request's session
    header = out["NewSessionId"]
    session = header.split(";")[0]
    assert session == first["opened"] and session.startswith("chat-")
    assert abs(_expiry(header) - (time.time() + 600)) < 30
    followed = [ask(rt, "ctx", SessionId=session)[0] for _ in range(4)]
    assert {f["pid"] for f in followed} == {first["pid"]}
    assert [(f["seen"], f["turns"]) for f in followed] == [(session, n) for n in (1, 2, 3, 4)]
    assert ask(rt, "ctx")[0]["seen"] is None

    _, out = ask(rt, "ctx", b"close", SessionId=session)
    assert out["ClosedSessionId"] == session
    assert refused(rt, "ctx", session)

    _, out = ask(rt, "ctx", b'{"ttl": 2}', SessionId="NEW_SESSION")
    brief = out["NewSessionId"].split(";")[0]
    assert ask(rt, "ctx", SessionId=brief)[0]["turns"] == 1
    wait_until(lambda: refused(rt, "ctx", brief), "the handler's brief session expired", 20)


def test_open_sessions_are_bounded_per_endpoint(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_MAX_SESSIONS": "2"})
    deploy(gw.sm, "few", (MODELS / "stateful").as_uri(), image=CONTAINER, count=1)
    rt = gw.client("sagemaker-runtime", max_attempts=1)

    _, out = ask(rt, "few", SessionId="NEW_SESSION")
    kept = out["NewSessionId"].split(";")[0]
    _, out = ask(rt, "few", b'{"ttl": 3}', SessionId="NEW_SESSION")
    brief = out["NewSessionId"].split(";")[0]
    with pytest.raises(ClientError) as full:
        ask(rt, "few", SessionId="NEW_SESSION")
    assert full.value.response["Error"]["Code"] == "ThrottlingException"
    assert full.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert ask(rt, "few", SessionId=kept)[0]["turns"] == 1  # the open ones still serve
    assert ask(rt, "few")[0]["pid"]  # and requests without a session

    def opens() -> bool:
        try:
            ask(rt, "few", SessionId="NEW_SESSION")
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ThrottlingException"
            return False
        return True

    # The brief session's expiry frees its place; a close frees the other's at once.
    wait_until(opens, "a place freed by the expired session", 20)
    assert refused(rt, "few", brief)
    with pytest.raises(ClientError):
        ask(rt, "few", SessionId="NEW_SESSION")
    ask(rt, "few", b"close", SessionId=kept)
    assert opens()


def test_a_model_cannot_keep_a_session_for_ever_nor_take_anothers(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    """A model's expiry is cut to SHIPYARD_SESSION_MAX_TTL_S from the answer; an id the
    model answers that is another instance's open session is the model's error, and the
    session stays on its instance."""
    gw = gateway_factory(extra_env={"SHIPYARD_SESSION_MAX_TTL_S": "60"})
    deploy(gw.sm, "hostile", (MODELS / "stateful").as_uri(), image=CONTAINER, count=2)
    rt = gw.client("sagemaker-runtime", max_attempts=1)

    forever = json.dumps({"expires": "9999-12-31T23:59:59Z"}).encode()
    first, out = ask(rt, "hostile", forever, SessionId="NEW_SESSION")
    session = out["NewSessionId"].split(";")[0]
    assert abs(_expiry(out["NewSessionId"]) - (time.time() + 60)) < 15

    # NEW_SESSIONs naming that id: its own instance may open it again; the other's
    # answer is refused, until one reaches it.
    taking = json.dumps({"id": session}).encode()

    def refused_to_the_other() -> bool:
        try:
            reopened, _ = ask(rt, "hostile", taking, SessionId="NEW_SESSION")
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ModelError", exc.response
            assert "open on another instance" in str(exc)
            return True
        assert reopened["pid"] == first["pid"]
        return False

    wait_until(refused_to_the_other, "a NEW_SESSION answered by the other instance", 30)
    assert ask(rt, "hostile", SessionId=session)[0]["pid"] == first["pid"]
