"""The OpenAI-compatible door's wire pieces: server-sent event framing of a model's JSON
Lines, and OpenAI's error objects (gateway/doors/openai.py, gateway/wire/errors.py)."""

from __future__ import annotations

import json

import pytest

from shipyard.errors import (
    AccessDenied,
    EndpointNotFound,
    MissingAuthenticationToken,
    ModelError,
    RuntimeValidationError,
    Throttling,
    UnrecognizedClient,
)
from shipyard.gateway.doors.openai import ModelNotFound, SseFraming, _read_request
from shipyard.gateway.edge.auth import Verifier
from shipyard.gateway.wire.errors import openai_error_body


def test_lines_become_events_whatever_the_chunks() -> None:
    framing = SseFraming()
    parts = [b'{"a": 1}\n{"b"', b": 2}\n", b"\n", b'{"c": 3}']
    events = b"".join(b"".join(framing.parts(p)) for p in parts) + framing.end()
    assert events == b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: {"c": 3}\n\ndata: [DONE]\n\n'


def test_a_chunk_that_is_one_object_is_one_event() -> None:
    framing = SseFraming()
    events = [b"".join(framing.parts(c)) for c in (b'{"a": 1}', b'{"b": {"c": 2}}')]
    assert events == [b'data: {"a": 1}\n\n', b'data: {"b": {"c": 2}}\n\n']
    # a piece of an object is held until its line ends, even if it ends with "}"
    assert list(framing.parts(b'{"x": {"y": 1}')) == []
    assert b"".join(framing.parts(b"}\n")) == b'data: {"x": {"y": 1}}\n\n'


def test_a_model_speaking_sse_is_framed_once() -> None:
    framing = SseFraming()
    sent = b'data: {"a": 1}\n\ndata:{"b": 2}\n\ndata: [DONE]\n\n'
    assert b"".join(framing.parts(sent)) + framing.end() == (
        b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    )


def test_a_line_past_the_limit_fails_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    from shipyard.gateway.doors import openai
    from shipyard.gateway.doors.relay import FramingError

    monkeypatch.setattr(openai, "MAX_LINE_BYTES", 100)
    framing = SseFraming()
    assert list(framing.parts(b"x" * 60)) == []
    assert list(framing.parts(b"y" * 30 + b"\n" + b"z" * 90)) == [b"data: " + b"x" * 60 +
                                                                  b"y" * 30 + b"\n\n"]  # fmt: skip
    with pytest.raises(FramingError, match="more than 100 bytes"):
        framing.parts(b"z" * 20)


def test_a_failure_is_the_last_event_and_flushes_the_partial_line() -> None:
    framing = SseFraming()
    assert list(framing.parts(b"[1, 2]")) == []  # no line's end, no object: held
    end = framing.failure("StreamBroken", "The model failed mid-stream: boom")
    first, second, rest = end.split(b"\n\n")
    assert first == b"data: [1, 2]" and rest == b""
    error = json.loads(second.removeprefix(b"data: "))["error"]
    assert error["code"] == "StreamBroken" and "boom" in error["message"]


@pytest.mark.parametrize(
    ("exc", "status", "kind", "code"),
    [
        (ModelNotFound("The model `x` does not exist"), 404, "not_found_error", "model_not_found"),
        (EndpointNotFound("no"), 400, "invalid_request_error", "ValidationError"),
        (Throttling("slow down"), 429, "rate_limit_error", "ThrottlingException"),
        (MissingAuthenticationToken("Missing"), 401, "authentication_error", "invalid_api_key"),
        (UnrecognizedClient("bad"), 401, "authentication_error", "invalid_api_key"),
        (AccessDenied("no right"), 403, "permission_error", "access_denied"),
    ],
)
def test_errors_map_to_openai_statuses(exc: object, status: int, kind: str, code: str) -> None:
    got, body = openai_error_body(exc)  # type: ignore[arg-type]
    assert got == status
    assert body["error"]["type"] == kind and body["error"]["code"] == code
    assert body["error"]["param"] is None


def _model_error(status: int, message: str) -> ModelError:
    return ModelError("wrapped", original_status_code=status, original_message=message,
                      log_stream_arn="arn")  # fmt: skip


def test_a_models_error_keeps_a_4xx_and_its_own_error_object() -> None:
    status, body = openai_error_body(_model_error(400, "InvalidRequest: temperature: 3"))
    assert status == 400 and body["error"]["message"] == "InvalidRequest: temperature: 3"
    assert body["error"]["type"] == "invalid_request_error"
    status, body = openai_error_body(_model_error(503, "RuntimeError: out of memory"))
    assert status == 500 and body["error"]["type"] == "server_error"
    given = {"error": {"message": "bad max_tokens", "type": "BadRequestError", "code": 400}}
    status, body = openai_error_body(_model_error(400, json.dumps(given)))
    assert (status, body) == (400, given)


@pytest.mark.parametrize(
    ("original", "status"),
    [(401, 500), (403, 500), (404, 400), (422, 422), (429, 429)],
)
def test_a_models_status_never_reads_as_the_doors_own(original: int, status: int) -> None:
    """A model's 401/403 (a service it called refused it) is its failure, not the
    caller's key; its 404 a request it refused, not an unknown model; its 429 its own
    overload, retried as the door's."""
    got, body = openai_error_body(_model_error(original, "refused"))
    assert got == status and body["error"]["code"] == "model_error"


def test_json_nested_past_the_decoders_depth_is_refused_or_passed_over() -> None:
    deep = b"{" + b'"a": [' * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(RuntimeValidationError, match="not valid JSON"):
        _read_request(b'{"model": "m", "messages": ' + deep + b"}")
    # a model's chunk or error, written so: framed as text, rendered as a model's error
    assert b"".join(SseFraming().parts(deep + b"\n")) == b"data: " + deep + b"\n\n"
    status, body = openai_error_body(_model_error(400, deep.decode()))
    assert status == 400 and body["error"]["message"] == deep.decode()


def test_bearer_tokens_name_their_key_and_nothing_else() -> None:
    verifier = Verifier({"K1": ("s1", ["sagemaker-runtime:*"]), "K2": ("s2", ["*"])})
    verifier.accept_bearer("K1", "tok-1")
    assert verifier.bearer("Bearer tok-1").access_key_id == "K1"
    for wrong in ("Bearer tok-2", "Bearer ", "Bearer tok-1x"):
        with pytest.raises(UnrecognizedClient):
            verifier.bearer(wrong)
    with pytest.raises(ValueError, match="same bearer token"):
        verifier.accept_bearer("K2", "tok-1")


def _scope(client: str, scheme: str, token: str) -> dict[str, object]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "scheme": scheme,
        "client": (client, 40000),
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"host", b"gw")],
    }


@pytest.mark.parametrize(
    ("client", "scheme", "status"),
    [("127.0.0.1", "http", 200), ("::1", "http", 200), ("10.0.0.5", "https", 200),
     ("10.0.0.5", "http", 401)],
)  # fmt: skip
def test_bearer_tokens_travel_only_over_tls_or_loopback(
    client: str, scheme: str, status: int
) -> None:
    import asyncio

    from shipyard.gateway.edge.signatures import RequireSignature

    async def door(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    verifier = Verifier({"K1": ("s1", ["*"])})
    verifier.accept_bearer("K1", "tok-1")
    edge = RequireSignature(
        door, verifier=verifier, account_id="1", max_body_bytes=1 << 20, body_timeout_s=5
    )
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(edge(_scope(client, scheme, "tok-1"), receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == status
    if status == 401:
        assert b"only over TLS" in sent[1]["body"]  # type: ignore[operator]
