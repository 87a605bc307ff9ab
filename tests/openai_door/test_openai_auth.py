"""The OpenAI-compatible door under ``auth:``: bearer tokens configured per
key (``bearer_token_env``), scoped like the key's signature, and SigV4 too.

The endpoints serve the scripted model (script/), so no torch is needed here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.conftest import GatewayProcess, deploy, start_gateway
from tests.e2e.test_auth import OPS, OPS_SECRET, client, http, signed_http
from tests.openai_door.test_openai_door import QUESTION, SCRIPT

TEAM, TEAM_SECRET = "AKIATESTOPENAITEAM01", "team-secret"
TEAM_TOKEN = "sk-team-a-9c1f0e7d2b"
OPS_TOKEN = "sk-ops-4d8a61b3e0"
VIEWER, VIEWER_SECRET, VIEWER_TOKEN = "AKIATESTOPENAIVIEW01", "viewer-secret", "sk-view-77a0c2"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("openai-auth")
    stack = {
        "auth": {
            "keys": [
                {
                    "access_key_id": OPS,
                    "secret_access_key_env": "K_OPS",
                    "bearer_token_env": "T_OPS",
                },
                {
                    "access_key_id": TEAM,
                    "secret_access_key_env": "K_TEAM",
                    "bearer_token_env": "T_TEAM",
                    "allow": ["sagemaker-runtime:InvokeEndpoint"],
                    "resources": ["arn:aws:sagemaker:*:*:endpoint/team-a-*"],
                },
                {  # may describe, not invoke
                    "access_key_id": VIEWER,
                    "secret_access_key_env": "K_VIEWER",
                    "bearer_token_env": "T_VIEWER",
                    "allow": ["sagemaker:Describe*"],
                },
            ],
            "file_roots": [str(SCRIPT.parent)],
        }
    }
    (home / "stack.yaml").write_text(yaml.safe_dump(stack))
    secrets = {
        "K_OPS": OPS_SECRET,
        "K_TEAM": TEAM_SECRET,
        "K_VIEWER": VIEWER_SECRET,
        "T_OPS": OPS_TOKEN,
        "T_TEAM": TEAM_TOKEN,
        "T_VIEWER": VIEWER_TOKEN,
    }
    gw = start_gateway(
        home / "home", extra_env=secrets, args=["--config", str(home / "stack.yaml")]
    )
    try:
        sm = client(gw, "sagemaker")
        deploy(sm, "team-a-chat", SCRIPT.as_uri(), wait=False)
        deploy(sm, "team-b-chat", SCRIPT.as_uri())
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="team-a-chat", WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
        )
        yield gw
    finally:
        gw.stop()


def chat(gw: GatewayProcess, token: str, model: str, **kwargs: Any) -> Any:
    api = openai.OpenAI(base_url=gw.url + "/v1", api_key=token, max_retries=0)
    return api.chat.completions.create(model=model, messages=QUESTION, **kwargs)


def test_a_scoped_token_calls_its_endpoints_and_no_other(secured: GatewayProcess) -> None:
    answer = chat(secured, TEAM_TOKEN, "team-a-chat")
    assert answer.choices[0].message.content == "012"
    streamed = chat(secured, TEAM_TOKEN, "team-a-chat", stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "012"
    with pytest.raises(openai.PermissionDeniedError, match="team-b-chat"):
        chat(secured, TEAM_TOKEN, "team-b-chat")
    api = openai.OpenAI(base_url=secured.url + "/v1", api_key=TEAM_TOKEN, max_retries=0)
    assert [m.id for m in api.models.list()] == ["team-a-chat"]
    ops = openai.OpenAI(base_url=secured.url + "/v1", api_key=OPS_TOKEN, max_retries=0)
    assert {m.id for m in ops.models.list()} == {"team-a-chat", "team-b-chat"}
    assert chat(secured, OPS_TOKEN, "team-b-chat").choices[0].message.content == "012"
    body = json.dumps({"model": "team-a-chat", "messages": QUESTION}).encode()
    status, _, _ = http(secured, "POST", "/v1/chat/completions", body,
                        Authorization=f"bearer {TEAM_TOKEN}")  # fmt: skip
    assert status == 200  # the scheme's name is case-insensitive (RFC 6750)


def test_tokens_without_the_right_are_refused(secured: GatewayProcess) -> None:
    with pytest.raises(openai.AuthenticationError) as wrong:
        chat(secured, "sk-not-a-token", "team-a-chat")
    assert wrong.value.code == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError, match="InvokeEndpoint"):
        chat(secured, VIEWER_TOKEN, "team-a-chat")
    status, _, body = http(secured, "POST", "/v1/chat/completions", b"{}")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    # a token is a key for the OpenAI door only: the runtime's doors want a signature
    status, _, body = http(
        secured,
        "POST",
        "/endpoints/team-a-chat/invocations",
        b"{}",
        Authorization=f"Bearer {OPS_TOKEN}",
    )
    assert status == 403 and b"AWS4-HMAC-SHA256" in body


def test_sigv4_signed_requests_reach_the_door(secured: GatewayProcess) -> None:
    body = json.dumps({"model": "team-a-chat", "messages": QUESTION}).encode()
    status, _, answer = signed_http(
        secured, "POST", "/v1/chat/completions", body, TEAM, TEAM_SECRET,
        **{"Content-Type": "application/json"},
    )  # fmt: skip
    assert status == 200 and json.loads(answer)["choices"][0]["message"]["content"] == "012"
    status, _, answer = signed_http(
        secured, "POST", "/v1/chat/completions",
        json.dumps({"model": "team-b-chat", "messages": QUESTION}).encode(), TEAM, TEAM_SECRET,
    )  # fmt: skip
    assert status == 403 and json.loads(answer)["error"]["type"] == "permission_error"


def test_a_missing_token_variable_fails_the_start(tmp_path: Path) -> None:
    stack = {
        "auth": {
            "keys": [
                {
                    "access_key_id": OPS,
                    "secret_access_key_env": "K_OPS",
                    "bearer_token_env": "T_UNSET_FOR_THIS_TEST",
                }
            ]
        }
    }
    (tmp_path / "stack.yaml").write_text(yaml.safe_dump(stack))
    with pytest.raises(RuntimeError, match="T_UNSET_FOR_THIS_TEST is not set"):
        start_gateway(
            tmp_path / "home",
            extra_env={"K_OPS": OPS_SECRET},
            args=["--config", str(tmp_path / "stack.yaml")],
        )
