"""Keys scoped by resource (``resources:``): one gateway, several teams (DESIGN 2.9).

Two endpoints, ``team-a-x`` and ``team-b-x``; a key that reaches only
``endpoint/team-a-*`` invokes the one and not the other on every door, and its List
calls show only what it reaches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, deploy, make_tarball, start_gateway
from tests.e2e.test_auth import OPS, OPS_SECRET, client, error_code, signed_http

TEAM, TEAM_SECRET = "AKIATESTTEAMA0000001", "team-a-secret"
BUILDER, BUILDER_SECRET = "AKIATESTBUILDA000001", "team-a-builder-secret"


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    """A gateway with both teams' endpoints deployed; and the model tarball."""
    home = tmp_path_factory.mktemp("teams")
    models = home / "models"
    tarball = make_tarball("sum", models / "sum" / "model.tar.gz")
    stack = {
        "auth": {
            "keys": [
                {"access_key_id": OPS, "secret_access_key_env": "K_OPS"},
                {
                    "access_key_id": TEAM,
                    "secret_access_key_env": "K_TEAM",
                    "allow": ["sagemaker-runtime:InvokeEndpoint*", "sagemaker:Describe*"]
                    + ["sagemaker:List*"],
                    "resources": ["arn:aws:sagemaker:*:*:endpoint/team-a-*"],
                },
                {
                    "access_key_id": BUILDER,
                    "secret_access_key_env": "K_BUILDER",
                    "allow": ["sagemaker:*", "logs:*"],
                    "resources": ["arn:aws:sagemaker:*:*:*/TEAM-A-*"],  # names: any case
                },
            ],
            "file_roots": [str(models)],
        }
    }
    (home / "stack.yaml").write_text(json.dumps(stack))
    secrets = {"K_OPS": OPS_SECRET, "K_TEAM": TEAM_SECRET, "K_BUILDER": BUILDER_SECRET}
    gw = start_gateway(
        home / "home", extra_env=secrets, args=["--config", str(home / "stack.yaml")]
    )
    try:
        sm = client(gw, "sagemaker")
        deploy(sm, "team-a-x", tarball.as_uri(), wait=False)
        deploy(sm, "team-b-x", tarball.as_uri())
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="team-a-x", WaiterConfig={"Delay": 0.2, "MaxAttempts": 600}
        )
        yield gw, tarball
    finally:
        gw.stop()


def team(gw: GatewayProcess, service: str) -> Any:
    return client(gw, service, TEAM, TEAM_SECRET)


def test_a_team_key_invokes_its_endpoint_and_not_the_other_teams(
    teams: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = teams
    rt = team(gw, "sagemaker-runtime")
    out = rt.invoke_endpoint(
        EndpointName="team-a-x", ContentType="application/json", Body=b"[[1, 2]]"
    )
    assert json.loads(out["Body"].read()) == [3]
    code, status, message = error_code(
        lambda: rt.invoke_endpoint(
            EndpointName="team-b-x", ContentType="application/json", Body=b"[[1, 2]]"
        )
    )
    assert (code, status) == ("AccessDeniedException", 403)
    assert (
        f"user/{TEAM} is not authorized to perform: sagemaker-runtime:InvokeEndpoint on "
        "resource: arn:aws:sagemaker:us-east-1:000000000000:endpoint/team-b-x" in message
    )
    code, status, _ = error_code(
        lambda: rt.invoke_endpoint_with_response_stream(
            EndpointName="team-b-x", ContentType="application/json", Body=b"[[1, 2]]"
        )
    )
    assert (code, status) == ("AccessDeniedException", 403)
    code, status, _ = error_code(
        lambda: rt.invoke_endpoint_async(EndpointName="team-b-x", InputLocation="s3://b/k")
    )
    assert (code, status) == ("AccessDeniedException", 403)
    # The operator's key reaches both.
    ops = client(gw, "sagemaker-runtime")
    out = ops.invoke_endpoint(
        EndpointName="team-b-x", ContentType="application/json", Body=b"[[2, 2]]"
    )
    assert json.loads(out["Body"].read()) == [4]


def test_the_v2_door_acts_on_the_endpoints_arn_too(teams: tuple[GatewayProcess, Path]) -> None:
    gw, _ = teams
    status, _, body = signed_http(
        gw, "GET", "/v2/models/team-a-x/ready", key=TEAM, secret=TEAM_SECRET
    )
    assert status == 200, body
    for method, path in (
        ("GET", "/v2/models/team-b-x/ready"),
        ("POST", "/v2/models/team-b-x/infer"),
    ):
        status, _, body = signed_http(gw, method, path, b"{}", key=TEAM, secret=TEAM_SECRET)
        assert status == 403, body
        assert "endpoint/team-b-x" in json.loads(body)["error"]


def test_list_calls_show_only_what_the_key_reaches(teams: tuple[GatewayProcess, Path]) -> None:
    gw, _ = teams
    sm = team(gw, "sagemaker")
    names = [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]
    assert names == ["team-a-x"]
    every = [e["EndpointName"] for e in client(gw, "sagemaker").list_endpoints()["Endpoints"]]
    assert sorted(every) == ["team-a-x", "team-b-x"]
    # One endpoint a page: the pages the key cannot see come out empty, and boto3's
    # paginator still walks them all.
    pages = sm.get_paginator("list_endpoints").paginate(
        SortBy="Name", SortOrder="Descending", PaginationConfig={"PageSize": 1}
    )
    assert [e["EndpointName"] for page in pages for e in page["Endpoints"]] == ["team-a-x"]
    assert sm.list_models()["Models"] == []  # models are not endpoints
    assert sm.describe_endpoint(EndpointName="team-a-x")["EndpointStatus"] == "InService"
    code, status, _ = error_code(lambda: sm.describe_endpoint(EndpointName="team-b-x"))
    assert (code, status) == ("AccessDeniedException", 403)


def test_create_calls_act_on_the_resources_they_name(teams: tuple[GatewayProcess, Path]) -> None:
    gw, tarball = teams
    sm = client(gw, "sagemaker", BUILDER, BUILDER_SECRET)
    container = {"Image": "shipyard/python", "ModelDataUrl": tarball.as_uri()}
    role = "arn:aws:iam::123456789012:role/x"
    code, status, message = error_code(
        lambda: sm.create_model(
            ModelName="team-b-m", PrimaryContainer=container, ExecutionRoleArn=role
        )
    )
    assert (code, status) == ("AccessDeniedException", 403)
    assert "sagemaker:CreateModel on resource: " in message and "model/team-b-m" in message
    sm.create_model(ModelName="Team-A-M", PrimaryContainer=container, ExecutionRoleArn=role)
    # An endpoint of the team's name on the other team's config: the config is outside.
    code, _, message = error_code(
        lambda: sm.create_endpoint(EndpointName="team-a-e", EndpointConfigName="team-b-x")
    )
    assert code == "AccessDeniedException" and "endpoint-config/team-b-x" in message
    listed = sorted(m["ModelName"] for m in sm.list_models()["Models"])
    assert listed == ["Team-A-M", "team-a-x"]  # not team-b-x


def test_log_groups_are_scoped_as_their_endpoints(teams: tuple[GatewayProcess, Path]) -> None:
    gw, _ = teams
    logs = client(gw, "logs", BUILDER, BUILDER_SECRET)
    groups = [g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]]
    assert "/aws/sagemaker/Endpoints/team-a-x" in groups
    assert "/aws/sagemaker/Endpoints/team-b-x" not in groups
    streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/Endpoints/team-a-x")
    assert streams["logStreams"]
    code, status, _ = error_code(
        lambda: logs.describe_log_streams(logGroupName="/aws/sagemaker/Endpoints/team-b-x")
    )
    assert (code, status) == ("AccessDeniedException", 403)
