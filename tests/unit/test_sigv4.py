"""The SigV4 verifier against botocore's own signer (the one boto3 and the AWS CLI use)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import MutableMapping
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shipyard.errors import (
    AccessDenied,
    InvalidSignature,
    MissingAuthenticationToken,
    RepeatedHeader,
    UnrecognizedClient,
)
from shipyard.gateway.edge.auth import (
    ADMITTED,
    Caller,
    Door,
    SignedRequest,
    Verifier,
    action_of,
    authorize,
    read_head,
)
from shipyard.gateway.edge.signatures import RequireSignature

KEY, SECRET = "AKIATESTOPS000000001", "ops-secret/with+chars"
NOW = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def verifier(**kw: Any) -> Verifier:
    keys = {KEY: (SECRET, ["*"]), "AKIATESTAPP000000001": ("app", ["sagemaker:Describe*"])}
    return Verifier(keys, clock=kw.get("clock", NOW.timestamp))


def signed(
    *,
    url: str = "http://127.0.0.1:8080/",
    body: bytes = b'{"EndpointName": "e"}',
    headers: dict[str, str] | None = None,
    key: str = KEY,
    secret: str = SECRET,
    when: dt.datetime = NOW,
    service: str = "sagemaker",
) -> SignedRequest:
    """A request signed by botocore exactly as boto3 sends one, at ``when``."""
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers=headers or {"X-Amz-Target": "SageMaker.DescribeEndpoint"},
    )
    auth = SigV4Auth(Credentials(key, secret), service, "us-east-1")
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    # add_auth() stamps the current time; these are the steps it takes after that.
    request.context["timestamp"] = stamp
    request.headers["X-Amz-Date"] = stamp
    canonical = auth.canonical_request(request)
    signature = auth.signature(auth.string_to_sign(request, canonical), request)
    auth._inject_signature_to_request(request, signature)
    prepared = request.prepare()
    path, _, query = prepared.url.partition("//")[2].partition("/")[2].partition("?")
    return SignedRequest(
        method="POST",
        raw_path=("/" + path).encode(),
        query_string=query.encode(),
        headers=[
            (k.lower().encode(), v.encode())
            for k, v in [*prepared.headers.items(), ("host", "127.0.0.1:8080")]
        ],
        body=body,
    )


def test_a_request_botocore_signed_is_accepted_with_its_key() -> None:
    caller = verifier().verify(signed())
    assert caller.access_key_id == KEY


def test_runtime_paths_and_query_strings_are_canonicalised_as_botocore_does() -> None:
    request = signed(
        url="http://127.0.0.1:8080/endpoints/my-ep/invocations?b=2&a=x%20y&a=1",
        headers={"Content-Type": "text/csv", "Custom": "  spaced   out  "},
    )
    assert verifier().verify(request).access_key_id == KEY


def test_a_changed_body_breaks_the_signature() -> None:
    request = signed()
    tampered = SignedRequest(
        request.method, request.raw_path, request.query_string, request.headers, b"{}"
    )
    with pytest.raises(InvalidSignature, match="does not match the signature you provided"):
        verifier().verify(tampered)


def test_a_changed_signed_header_breaks_the_signature() -> None:
    request = signed()
    headers = [
        (k, b"SageMaker.DeleteEndpoint" if k == b"x-amz-target" else v) for k, v in request.headers
    ]
    with pytest.raises(InvalidSignature):
        verifier().verify(
            SignedRequest(
                request.method, request.raw_path, request.query_string, headers, request.body
            )
        )


def test_a_wrong_secret_is_an_invalid_signature() -> None:
    with pytest.raises(InvalidSignature, match="Check your AWS Secret Access Key"):
        verifier().verify(signed(secret="not-the-secret"))


def test_an_unknown_key_is_an_unrecognized_client() -> None:
    with pytest.raises(UnrecognizedClient, match="security token included in the request"):
        verifier().verify(signed(key="AKIAUNKNOWN000000000"))


def test_no_authorization_header_is_a_missing_token() -> None:
    request = signed()
    headers = [(k, v) for k, v in request.headers if k != b"authorization"]
    with pytest.raises(MissingAuthenticationToken, match="Missing Authentication Token"):
        verifier().verify(
            SignedRequest(request.method, request.raw_path, b"", headers, request.body)
        )


@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        "AWS4-HMAC-SHA256 Signature=00",
        "AWS4-HMAC-SHA256 Credential=x, SignedHeaders=host, Signature=00",
        "AWS4-HMAC-SHA1 Credential=AKIATESTOPS000000001/20261122/us-east-1/sagemaker/"
        "aws4_request, SignedHeaders=host, Signature=00",
        "Basic dXNlcjpwYXNz",
    ],
)
def test_a_malformed_authorization_header_is_an_invalid_signature(value: str) -> None:
    request = signed()
    headers = [(k, value.encode() if k == b"authorization" else v) for k, v in request.headers]
    with pytest.raises(InvalidSignature):
        verifier().verify(
            SignedRequest(request.method, request.raw_path, b"", headers, request.body)
        )


def test_a_signature_older_than_15_minutes_has_expired() -> None:
    old = signed(when=NOW - dt.timedelta(minutes=16))
    with pytest.raises(InvalidSignature, match=r"Signature expired: 20261122T114400Z is now"):
        verifier().verify(old)
    assert verifier().verify(signed(when=NOW - dt.timedelta(minutes=14))).access_key_id == KEY


def test_a_signature_from_the_future_is_not_yet_current() -> None:
    with pytest.raises(InvalidSignature, match="Signature not yet current"):
        verifier().verify(signed(when=NOW + dt.timedelta(minutes=16)))


def test_a_declared_body_hash_must_match_the_body() -> None:
    request = signed(
        headers={"X-Amz-Target": "SageMaker.ListModels", "X-Amz-Content-SHA256": "0" * 64}
    )
    with pytest.raises(InvalidSignature, match="x-amz-content-sha256"):
        verifier().verify(request)


def test_keys_are_scoped_to_the_actions_they_allow() -> None:
    app = Caller(
        "AKIATESTAPP000000001", ("sagemaker-runtime:invokeendpoint*", "sagemaker:describe*")
    )
    authorize(app, "sagemaker-runtime:InvokeEndpointAsync", account_id="1")
    authorize(app, "sagemaker:DescribeEndpoint", account_id="1")
    with pytest.raises(AccessDenied, match="not authorized to perform: sagemaker:CreateModel"):
        authorize(app, "sagemaker:CreateModel", account_id="1")


@pytest.mark.parametrize(
    ("method", "path", "target", "expected"),
    [
        ("GET", "/healthz", None, None),
        ("GET", "/console", None, None),
        ("POST", "/", "SageMaker.CreateModel", (Door.CONTROL, "sagemaker:CreateModel")),
        (
            "POST",
            "/",
            "AnyScaleFrontendService.PutScalingPolicy",
            (Door.CONTROL, "application-autoscaling:PutScalingPolicy"),
        ),
        (
            "POST",
            "/endpoints/e/invocations",
            None,
            (Door.RUNTIME, "sagemaker-runtime:InvokeEndpoint"),
        ),
        (
            "POST",
            "/endpoints/e/async-invocations",
            None,
            (Door.RUNTIME, "sagemaker-runtime:InvokeEndpointAsync"),
        ),
        (
            "POST",
            "/endpoints/e/invocations-response-stream",
            None,
            (Door.RUNTIME, "sagemaker-runtime:InvokeEndpointWithResponseStream"),
        ),
        ("POST", "/v2/models/e/infer", None, (Door.V2, "sagemaker-runtime:InvokeEndpoint")),
        ("POST", "/inference", None, (Door.FACADE, "sagemaker:CreateTrainingJob")),
        ("GET", "/jobs/j/logs", None, (Door.OTHER, "sagemaker:DescribeTrainingJob")),
        ("GET", "/metrics", None, (Door.OTHER, "shipyard:GetMetrics")),
    ],
)
def test_each_door_counts_as_the_action_it_performs(
    method: str, path: str, target: str | None, expected: tuple[Door, str] | None
) -> None:
    assert action_of(method, path, target) == expected


def test_a_signed_header_list_with_repeats_or_unknown_names_is_only_a_bad_signature() -> None:
    request = signed()
    for listed in ("host;host;x-amz-date", "host;no-such-header;x-amz-date", ""):
        authorization = (
            f"AWS4-HMAC-SHA256 Credential={KEY}/20261122/us-east-1/sagemaker/aws4_request, "
            f"SignedHeaders={listed}, Signature=" + "0" * 64
        ).encode()
        headers = [(k, authorization if k == b"authorization" else v) for k, v in request.headers]
        with pytest.raises(InvalidSignature):
            verifier().verify(SignedRequest("POST", b"/", b"", headers, request.body))


def test_a_malformed_date_is_an_invalid_signature() -> None:
    request = signed()
    for stamp in (b"2026-11-22T12:00:00Z", b"20261399T999999Z", b"99999999T000000Z"):
        headers = [(k, stamp if k == b"x-amz-date" else v) for k, v in request.headers]
        with pytest.raises(InvalidSignature):
            verifier().verify(SignedRequest("POST", b"/", b"", headers, request.body))


def test_a_header_the_signature_rests_on_may_come_only_once() -> None:
    request = signed()
    for name in (b"x-amz-target", b"authorization", b"x-amz-date", b"host"):
        value = next(v for k, v in request.headers if k == name)
        with pytest.raises(RepeatedHeader, match=f"{name.decode()} header more than once"):
            read_head([*request.headers, (name, value)])
    assert read_head(request.headers).target == "SageMaker.DescribeEndpoint"


def test_the_head_is_checked_and_the_key_known_before_any_body() -> None:
    request = signed(key="AKIAUNKNOWN000000000")
    with pytest.raises(UnrecognizedClient):
        verifier().start(
            "POST", b"/", b"", request.headers, read_head(request.headers), secure=False
        )
    request = signed()
    pending = verifier().start(
        "POST", b"/", b"", request.headers, read_head(request.headers), secure=False
    )
    assert pending.needs_body
    assert verifier().finish(pending, request.body).access_key_id == KEY


def test_an_unsigned_payload_is_taken_over_tls_only() -> None:
    headers = {"X-Amz-Target": "SageMaker.ListModels", "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}
    request = signed(headers=headers)
    with pytest.raises(InvalidSignature, match="only over TLS"):
        verifier().verify(request)
    over_tls = dataclasses.replace(request, secure=True, body=b"anything at all")
    assert verifier().verify(over_tls).access_key_id == KEY
    pending = verifier().start(
        "POST", b"/", b"", request.headers, read_head(request.headers), secure=True
    )
    assert not pending.needs_body


def test_keys_are_scoped_to_the_resources_they_name() -> None:
    team_a = Caller("K", ("*",), ("arn:aws:sagemaker:*:*:endpoint/team-a-*",))
    authorize(team_a, "x:Y", account_id="1", arn="arn:aws:sagemaker:r:1:endpoint/team-a-x")
    assert team_a.reaches("arn:aws:sagemaker:r:1:endpoint/TEAM-A-x")  # names are lower-case
    assert not team_a.reaches("arn:aws:sagemaker:r:1:endpoint/team-b-x")
    assert not team_a.reaches("arn:aws:sagemaker:r:1:model/team-a-x")
    with pytest.raises(AccessDenied, match="on resource: arn:aws:sagemaker:r:1:endpoint/team-b"):
        authorize(team_a, "x:Y", account_id="1", arn="arn:aws:sagemaker:r:1:endpoint/team-b")
    single = Caller("K", ("*",), ("arn:aws:sagemaker:*:*:endpoint/a?c",))
    assert single.reaches("arn:aws:sagemaker:r:1:endpoint/abc")
    assert not single.reaches("arn:aws:sagemaker:r:1:endpoint/abbc")
    assert Caller("K", ("*",)).reaches("anything")


class Taker:
    """An app whose ``serve_whole`` (the callback path) records what the edge admitted."""

    def __init__(self) -> None:
        self.admitted: list[Any] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the ASGI call is not this test's")

    def serve_whole(self, scope: dict[str, Any], body: bytes, respond: Any) -> bool:
        self.admitted.append(scope[ADMITTED])
        return True


def invocation_scope(request: SignedRequest) -> dict[str, Any]:
    """The scope the gateway's protocol gives a request it offers to ``serve_whole``."""
    return {
        "type": "http",
        "method": request.method,
        "path": request.raw_path.decode(),
        "raw_path": request.raw_path,
        "query_string": request.query_string,
        "headers": request.headers,
        "scheme": "http",
        "client": ("127.0.0.1", 50000),
    }


@pytest.mark.parametrize(
    ("key", "secret", "taken"),
    [(KEY, SECRET, True), ("AKIATESTAPP000000001", "app", False), (KEY, "wrong", False)],
    ids=["allowed", "not-allowed", "bad-signature"],
)
def test_a_signed_invocation_is_served_whole_only_once_verified_and_authorised(
    key: str, secret: str, taken: bool
) -> None:
    """What ``serve_whole`` lets through is what ``__call__`` lets through: a refusal is left
    to ``__call__``, which answers it in the door's shape."""
    body = b'{"instances": [[1, 2]]}'
    request = signed(
        url="http://127.0.0.1:8080/endpoints/e/invocations",
        body=body,
        headers={"Content-Type": "application/json"},
        key=key,
        secret=secret,
    )
    app = Taker()
    edge = RequireSignature(
        app, verifier=verifier(), account_id="000000000000", max_body_bytes=1 << 20,
        body_timeout_s=5,
    )  # fmt: skip
    assert edge.serve_whole(invocation_scope(request), body, lambda *answer: None) is taken
    if taken:
        (admitted,) = app.admitted
        assert admitted.caller.access_key_id == KEY
        assert admitted.action == "sagemaker-runtime:InvokeEndpoint"
    else:
        assert app.admitted == []
    # A body other than the one signed is refused too.
    assert not edge.serve_whole(invocation_scope(request), body + b" ", lambda *answer: None)


@pytest.mark.parametrize(
    "case",
    ["allowed", "not-allowed", "bad-signature", "other-body", "too-large", "repeated", "unsigned"],
)
def test_the_callback_path_admits_exactly_what_the_asgi_call_admits(case: str) -> None:
    """The same request through ``serve_whole`` and through ``__call__``: the same
    Admitted value, or a refusal (which ``serve_whole`` leaves to ``__call__`` to answer)."""
    body = b'{"instances": [[1, 2]]}'
    key, secret = {"not-allowed": ("AKIATESTAPP000000001", "app"), "bad-signature": (KEY, "x")}.get(
        case, (KEY, SECRET)
    )
    headers = {"Content-Type": "application/json"}
    if case == "unsigned":
        headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
    request = signed(
        url="http://127.0.0.1:8080/endpoints/e/invocations",
        body=body,
        headers=headers,
        key=key,
        secret=secret,
    )
    if case == "repeated":
        request.headers.append((b"x-amz-date", dict(request.headers)[b"x-amz-date"]))
    if case == "too-large":  # sent chunked: no declared length to refuse it by
        request.headers[:] = [h for h in request.headers if h[0] != b"content-length"]
        request.headers.append((b"transfer-encoding", b"chunked"))
    sent = body + b" " if case == "other-body" else body
    limit = 8 if case == "too-large" else 1 << 20

    class Called(Taker):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            self.admitted.append(scope[ADMITTED])

    def edge(app: Taker) -> RequireSignature:
        return RequireSignature(
            app, verifier=verifier(), account_id="000000000000", max_body_bytes=limit,
            body_timeout_s=5,
        )  # fmt: skip

    taken_by, called = Taker(), Called()
    taken = edge(taken_by).serve_whole(invocation_scope(request), sent, lambda *answer: None)
    answers: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": sent, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        answers.append(dict(message))

    asyncio.run(edge(called)(invocation_scope(request), receive, send))
    assert taken == (case == "allowed")
    if called.admitted:
        assert taken and taken_by.admitted == called.admitted
    else:
        assert not taken and taken_by.admitted == []
        assert answers[0]["status"] >= 400
