"""Keys scoped by resource (``resources:``): one gateway, several teams.

Two endpoints, ``team-a-x`` and ``team-b-x``; a key that reaches only
``endpoint/team-a-*`` invokes the one and not the other on every door, and its List
calls show only what it reaches. The console's views and lists, the names a request
holds below its top level and the jobs ``POST /inference`` makes are scoped alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.conftest import GatewayProcess, deploy, make_tarball, start_gateway
from tests.e2e.test_auth import APP, APP_SECRET, OPS, OPS_SECRET, client, error_code, signed_http
from tests.e2e.test_jobs import CODE, ENV

TEAM, TEAM_SECRET = "AKIATESTTEAMA0000001", "team-a-secret"
BUILDER, BUILDER_SECRET = "AKIATESTBUILDA000001", "team-a-builder-secret"
VIEWER, VIEWER_SECRET = "AKIATESTVIEWA000001", "team-a-viewer-secret"
WATCHER, WATCHER_SECRET = "AKIATESTWATCHA000001", "team-a-watcher-secret"
SMADMIN, SMADMIN_SECRET = "AKIATESTSMADMIN00001", "sagemaker-admin-secret"
LOGSONLY, LOGSONLY_SECRET = "AKIATESTLOGSONLY0001", "logs-only-secret"
ROLE = "arn:aws:iam::123456789012:role/x"


def _template() -> dict[str, Any]:
    return {
        "AlgorithmSpecification": {"TrainingImage": "shipyard/python"},
        "HyperParameters": {
            "sagemaker_program": "infer.py",
            "sagemaker_submit_directory": CODE.as_uri(),
        },
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    }


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
                    "allow": ["sagemaker:*", "logs:*", "application-autoscaling:*"],
                    "resources": ["arn:aws:sagemaker:*:*:*/TEAM-A-*"],  # names: any case
                },
                {  # CloudWatch for team a: its endpoints' metrics, its own alarms and
                    # its own namespaces
                    "access_key_id": WATCHER,
                    "secret_access_key_env": "K_WATCHER",
                    "allow": ["cloudwatch:*"],
                    "resources": [
                        "arn:aws:sagemaker:*:*:*/team-a-*",
                        "arn:aws:cloudwatch:*:*:alarm:team-a-*",
                        "arn:aws:cloudwatch:*:*:namespace/TeamA*",
                    ],
                },
                {  # every SageMaker action, nothing else
                    "access_key_id": SMADMIN,
                    "secret_access_key_env": "K_SMADMIN",
                    "allow": ["sagemaker:*"],
                },
                {  # log lines, of anything
                    "access_key_id": LOGSONLY,
                    "secret_access_key_env": "K_LOGSONLY",
                    "allow": ["logs:GetLogEvents"],
                },
                {  # what the console asks of a key
                    "access_key_id": VIEWER,
                    "secret_access_key_env": "K_VIEWER",
                    "allow": ["sagemaker:Describe*", "logs:GetLogEvents", "shipyard:Get*"],
                    "resources": ["arn:aws:sagemaker:*:*:*/team-a-*"],
                },
            ],
            "file_roots": [str(models)],
        },
        "jobs": {
            "limit": 8,
            "white_list": ["team-a-run", "team-b-run"],
            "s3_bucket": (models / "jobs-out").as_uri(),
            "templates": {"team-a-run": _template(), "team-b-run": _template()},
        },
    }
    (home / "stack.yaml").write_text(json.dumps(stack))
    secrets = {
        "K_OPS": OPS_SECRET,
        "K_TEAM": TEAM_SECRET,
        "K_BUILDER": BUILDER_SECRET,
        "K_VIEWER": VIEWER_SECRET,
        "K_WATCHER": WATCHER_SECRET,
        "K_SMADMIN": SMADMIN_SECRET,
        "K_LOGSONLY": LOGSONLY_SECRET,
        **ENV,
    }
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


def test_names_inside_a_request_are_resources_too(teams: tuple[GatewayProcess, Path]) -> None:
    gw, tarball = teams
    sm = client(gw, "sagemaker", BUILDER, BUILDER_SECRET)

    def variant(model: str) -> dict[str, Any]:
        return {
            "VariantName": "v1",
            "ModelName": model,
            "InitialInstanceCount": 1,
            "InstanceType": "ml.m5.large",
        }

    # Team A may not serve team B's model, as a variant or as a shadow.
    for extra in (
        {"ProductionVariants": [variant("team-b-x")]},
        {
            "ProductionVariants": [variant("team-a-x")],
            "ShadowProductionVariants": [variant("team-b-x") | {"VariantName": "s1"}],
        },
    ):
        code, status, message = error_code(
            partial(sm.create_endpoint_config, EndpointConfigName="team-a-c", **extra)
        )
        assert (code, status) == ("AccessDeniedException", 403)
        assert "sagemaker:CreateEndpointConfig on resource: " in message
        assert "model/team-b-x because" in message
    sm.create_endpoint_config(
        EndpointConfigName="team-a-c", ProductionVariants=[variant("team-a-x")]
    )
    # Nor run it in a transform job, nor move its endpoint to team B's config.
    code, _, message = error_code(
        lambda: sm.create_transform_job(
            TransformJobName="team-a-t",
            ModelName="team-b-x",
            TransformInput={
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/in"}}
            },
            TransformOutput={"S3OutputPath": "s3://b/out"},
            TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
        )
    )
    assert code == "AccessDeniedException" and "model/team-b-x because" in message
    code, _, message = error_code(
        lambda: sm.update_endpoint(EndpointName="team-a-x", EndpointConfigName="team-b-x")
    )
    assert code == "AccessDeniedException" and "endpoint-config/team-b-x" in message
    # A scaling policy of team A's endpoint may not read team B's metrics.
    scaling = client(gw, "application-autoscaling", BUILDER, BUILDER_SECRET)
    custom = {
        "MetricName": "InvocationsPerInstance",
        "Namespace": "AWS/SageMaker",
        "Statistic": "Sum",
        "Dimensions": [
            {"Name": "EndpointName", "Value": "team-b-x"},
            {"Name": "VariantName", "Value": "v1"},
        ],
    }
    code, _, message = error_code(
        lambda: scaling.put_scaling_policy(
            PolicyName="team-a-p",
            ServiceNamespace="sagemaker",
            ResourceId="endpoint/team-a-x/variant/v1",
            ScalableDimension="sagemaker:variant:DesiredInstanceCount",
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": 10.0,
                "CustomizedMetricSpecification": custom,
            },
        )
    )
    assert code == "AccessDeniedException" and "endpoint/team-b-x" in message


def _post_job(gw: GatewayProcess, job_type: str, key: str, secret: str) -> tuple[int, Any]:
    body = json.dumps({"type": job_type}).encode()
    status, _, answer = signed_http(gw, "POST", "/inference", body, key=key, secret=secret)
    return status, json.loads(answer)


def test_the_facade_makes_only_jobs_the_key_reaches(teams: tuple[GatewayProcess, Path]) -> None:
    gw, _ = teams
    status, answer = _post_job(gw, "team-b-run", BUILDER, BUILDER_SECRET)
    assert (status, answer["status"]) == (403, 403), answer
    assert "sagemaker:CreateTrainingJob on resource: " in answer["errMsg"]
    assert ":training-job/team-b-run-" in answer["errMsg"]
    listed = client(gw, "sagemaker").list_training_jobs()["TrainingJobSummaries"]
    names = [j["TrainingJobName"] for j in listed]
    assert not any(name.startswith("team-b-run-") for name in names)  # nothing scheduled
    status, answer = _post_job(gw, "team-a-run", BUILDER, BUILDER_SECRET)
    assert (status, answer["status"]) == (200, 200), answer
    assert answer["jobName"].startswith("team-a-run-")


@pytest.fixture(scope="module")
def team_jobs(teams: tuple[GatewayProcess, Path]) -> tuple[str, str]:
    """A training job of each team, made with the operator's key."""
    gw, _ = teams
    names = []
    for job_type in ("team-a-run", "team-b-run"):
        status, answer = _post_job(gw, job_type, OPS, OPS_SECRET)
        assert status == 200, answer
        names.append(answer["jobName"])
    return names[0], names[1]


def _view(gw: GatewayProcess, path: str, key: str = VIEWER) -> tuple[int, str]:
    secret = {VIEWER: VIEWER_SECRET, OPS: OPS_SECRET}[key]
    status, _, body = signed_http(gw, "GET", "/console/api" + path, key=key, secret=secret)
    return status, body.decode()


def test_a_console_view_of_one_resource_needs_the_key_to_reach_it(
    teams: tuple[GatewayProcess, Path], team_jobs: tuple[str, str]
) -> None:
    gw, _ = teams
    mine, theirs = team_jobs
    for path in (
        "/endpoints/team-a-x",
        "/endpoints/team-a-x/metrics",
        "/endpoints/team-a-x/logs",
        f"/jobs/{mine}",
        f"/jobs/{mine}/log",
    ):
        status, body = _view(gw, path)
        assert status == 200, (path, body)
    assert _view(gw, "/transform-jobs/team-a-none")[0] == 404  # reached, and not there
    for path, arn in (
        ("/endpoints/team-b-x", "endpoint/team-b-x"),
        ("/endpoints/team-b-x/metrics", "endpoint/team-b-x"),
        ("/endpoints/team-b-x/logs", "endpoint/team-b-x"),
        (f"/jobs/{theirs}", f"training-job/{theirs}"),
        (f"/jobs/{theirs}/log", f"training-job/{theirs}"),
        ("/transform-jobs/team-b-t", "transform-job/team-b-t"),
        ("/transform-jobs/team-b-t/logs", "transform-job/team-b-t"),
    ):
        status, body = _view(gw, path)
        assert status == 403, (path, body)
        error = json.loads(body)  # the console's shape, as the edge refuses
        assert error["__type"] == "AccessDeniedException"
        assert f":000000000000:{arn} because" in error["message"], error
    # The operator's key reaches both teams'.
    assert _view(gw, "/endpoints/team-b-x", OPS)[0] == 200
    assert _view(gw, f"/jobs/{theirs}/log", OPS)[0] == 200


def test_console_lists_keep_what_the_key_reaches(
    teams: tuple[GatewayProcess, Path], team_jobs: tuple[str, str]
) -> None:
    gw, _ = teams
    mine, theirs = team_jobs
    shown = {path: _view(gw, path) for path in ("/endpoints", "/jobs", "/events")}
    for path, (status, body) in shown.items():
        assert status == 200, (path, body)
        assert "team-b" not in body, path
    assert "team-a-x" in shown["/endpoints"][1] and "1 endpoints" in shown["/endpoints"][1]
    assert mine in shown["/jobs"][1] and mine in shown["/events"][1]
    for path in ("/endpoints", "/jobs", "/events"):  # the operator sees both teams
        status, body = _view(gw, path, OPS)
        assert status == 200 and "team-b" in body, path
    assert theirs in _view(gw, "/jobs", OPS)[1]


def test_inference_components_are_scoped_by_their_name(
    teams: tuple[GatewayProcess, Path],
) -> None:
    """Describe/Update/Delete name the component: a builder scoped to team-a-* cannot
    reach team B's, nor scale it through Application Auto Scaling."""
    gw, _ = teams
    builder = client(gw, "sagemaker", BUILDER, BUILDER_SECRET)
    for call in (
        lambda: builder.describe_inference_component(InferenceComponentName="team-b-ic"),
        lambda: builder.delete_inference_component(InferenceComponentName="team-b-ic"),
        lambda: builder.update_inference_component_runtime_config(
            InferenceComponentName="team-b-ic", DesiredRuntimeConfig={"CopyCount": 0}
        ),
    ):
        code, status, message = error_code(call)
        assert (code, status) == ("AccessDeniedException", 403), message
        assert "inference-component/team-b-ic" in message
    scaling = client(gw, "application-autoscaling", BUILDER, BUILDER_SECRET)
    code, status, message = error_code(
        lambda: scaling.register_scalable_target(
            ServiceNamespace="sagemaker",
            ResourceId="inference-component/team-b-ic",
            ScalableDimension="sagemaker:inference-component:DesiredCopyCount",
            MinCapacity=0,
            MaxCapacity=1,
        )  # fmt: skip
    )
    assert (code, status) == ("AccessDeniedException", 403), message
    # Its own name is reached (and then found missing, as SageMaker says).
    code, _, message = error_code(
        lambda: builder.describe_inference_component(InferenceComponentName="team-a-ic")
    )
    assert code == "ValidationException" and "Could not find inference component" in message


def test_metrics_and_alarms_are_scoped_as_their_endpoints(
    teams: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = teams

    def on(endpoint: str) -> dict[str, Any]:
        return {
            "Namespace": "AWS/SageMaker", "MetricName": "Invocation5XXErrors",
            "Dimensions": [{"Name": "EndpointName", "Value": endpoint},
                           {"Name": "VariantName", "Value": "v1"}],
            "Statistic": "Sum", "Period": 60, "EvaluationPeriods": 1, "Threshold": 1.0,
            "ComparisonOperator": "GreaterThanThreshold",
        }  # fmt: skip

    ops = client(gw, "cloudwatch")
    ops.put_metric_alarm(AlarmName="team-b-errors", **on("team-b-x"))
    aas = client(gw, "application-autoscaling")
    aas.register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId="endpoint/team-b-x/variant/v1",
        ScalableDimension="sagemaker:variant:DesiredInstanceCount", MinCapacity=1, MaxCapacity=2,
    )  # fmt: skip
    policy = aas.put_scaling_policy(
        PolicyName="b", ServiceNamespace="sagemaker", ResourceId="endpoint/team-b-x/variant/v1",
        ScalableDimension="sagemaker:variant:DesiredInstanceCount", PolicyType="StepScaling",
        StepScalingPolicyConfiguration={"AdjustmentType": "ChangeInCapacity",
                                        "StepAdjustments": [{"MetricIntervalLowerBound": 0,
                                                             "ScalingAdjustment": 1}]},
    )["PolicyARN"]  # fmt: skip
    cw = client(gw, "cloudwatch", WATCHER, WATCHER_SECRET)
    cw.put_metric_alarm(AlarmName="team-a-errors", **on("team-a-x"))

    def denied(call: Any) -> None:
        code, status, _ = error_code(call)
        assert (code, status) == ("AccessDeniedException", 403)

    denied(lambda: cw.put_metric_alarm(AlarmName="team-a-spy", **on("team-b-x")))
    denied(lambda: cw.put_metric_alarm(AlarmName="team-b-errors", **on("team-a-x")))
    denied(lambda: cw.put_metric_alarm(AlarmName="team-a-hijack", AlarmActions=[policy],
                                       **on("team-a-x")))  # fmt: skip
    denied(lambda: cw.set_alarm_state(AlarmName="team-b-errors", StateValue="ALARM",
                                      StateReason="x"))  # fmt: skip
    denied(lambda: cw.delete_alarms(AlarmNames=["team-a-errors", "team-b-errors"]))
    denied(lambda: cw.describe_alarm_history(AlarmName="team-b-errors"))
    arn = ops.describe_alarms(AlarmNames=["team-b-errors"])["MetricAlarms"][0]["AlarmArn"]
    denied(lambda: cw.list_tags_for_resource(ResourceARN=arn))
    denied(lambda: cw.get_metric_statistics(
        Namespace="AWS/SageMaker", MetricName="Invocations",
        Dimensions=[{"Name": "EndpointName", "Value": "team-b-x"}],
        StartTime=0, EndTime=60, Period=60, Statistics=["Sum"]))  # fmt: skip
    assert [a["AlarmName"] for a in cw.describe_alarms()["MetricAlarms"]] == ["team-a-errors"]
    every = [a["AlarmName"] for a in ops.describe_alarms()["MetricAlarms"]]
    assert sorted(every) == ["team-a-errors", "team-b-errors"]
    history = cw.describe_alarm_history()["AlarmHistoryItems"]
    assert {h["AlarmName"] for h in history} == {"team-a-errors"}
    cw.set_alarm_state(AlarmName="team-a-errors", StateValue="ALARM", StateReason="a drill")
    cw.delete_alarms(AlarmNames=["team-a-errors"])
    ops.delete_alarms(AlarmNames=["team-b-errors"])


def test_a_namespace_is_a_resource_to_put_or_read_a_metric(
    teams: tuple[GatewayProcess, Path],
) -> None:
    """Team b's guardrail alarm watches its own namespace: a key of team a's puts no
    datum there (which would roll back team b's deployment), nor reads it."""
    gw, _ = teams
    ops = client(gw, "cloudwatch")
    guard = {
        "Namespace": "TeamB", "MetricName": "Errors", "Statistic": "Sum", "Period": 60,
        "EvaluationPeriods": 1, "Threshold": 0.0, "ComparisonOperator": "GreaterThanThreshold",
    }  # fmt: skip
    ops.put_metric_alarm(AlarmName="team-b-guard", **guard)
    ops.put_metric_data(Namespace="TeamB", MetricData=[{"MetricName": "Errors", "Value": 0}])
    cw = client(gw, "cloudwatch", WATCHER, WATCHER_SECRET)
    now = time.time()

    def denied(call: Any, resource: str) -> None:
        code, status, message = error_code(call)
        assert (code, status) == ("AccessDeniedException", 403), message
        assert resource in message, message

    team_b = "arn:aws:cloudwatch:us-east-1:000000000000:namespace/TeamB"
    errors = [{"MetricName": "Errors", "Value": 100}]
    denied(lambda: cw.put_metric_data(Namespace="TeamB", MetricData=errors), team_b)
    denied(lambda: cw.get_metric_statistics(
        Namespace="TeamB", MetricName="Errors", StartTime=now - 60, EndTime=now + 60,
        Period=60, Statistics=["Sum"]), team_b)  # fmt: skip
    denied(lambda: cw.get_metric_data(
        MetricDataQueries=[{"Id": "b", "MetricStat": {
            "Metric": {"Namespace": "TeamB", "MetricName": "Errors"},
            "Period": 60, "Stat": "Sum"}}],
        StartTime=now - 60, EndTime=now + 60), team_b)  # fmt: skip
    denied(lambda: cw.list_metrics(Namespace="TeamB"), team_b)
    denied(lambda: cw.put_metric_alarm(AlarmName="team-a-spy", **guard), team_b)
    # The gateway's own namespaces are the gateway's: put only by nobody.
    denied(lambda: cw.put_metric_data(
        Namespace="/aws/sagemaker/Endpoints",
        MetricData=[{"MetricName": "CPUUtilization", "Value": 100,
                     "Dimensions": [{"Name": "EndpointName", "Value": "team-a-x"}]}]),
        "namespace//aws/sagemaker/Endpoints")  # fmt: skip
    # Its own namespaces, it puts into and reads.
    cw.put_metric_data(Namespace="TeamA/Shop", MetricData=[{"MetricName": "Orders", "Value": 3}])
    listed = cw.list_metrics()["Metrics"]
    assert {m["Namespace"] for m in listed if not m["Namespace"].lower().startswith(
        ("aws/", "/aws/"))} == {"TeamA/Shop"}  # fmt: skip
    stats = cw.get_metric_statistics(
        Namespace="TeamA/Shop", MetricName="Orders", StartTime=now - 120, EndTime=now + 120,
        Period=240, Statistics=["Sum"])["Datapoints"]  # fmt: skip
    assert [p["Sum"] for p in stats] == [3.0]
    assert "TeamB" in {m["Namespace"] for m in ops.list_metrics()["Metrics"]}
    ops.delete_alarms(AlarmNames=["team-b-guard"])


def test_the_query_protocol_is_authorised_by_the_action_its_signed_body_names(
    teams: tuple[GatewayProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import botocore.model
    from botocore.exceptions import ClientError

    gw, _ = teams
    monkeypatch.setattr(botocore.model, "PRIORITY_ORDERED_SUPPORTED_PROTOCOLS", ("query",))
    watcher = client(gw, "cloudwatch", WATCHER, WATCHER_SECRET)
    assert watcher.meta.service_model.resolved_protocol == "query"
    assert isinstance(watcher.describe_alarms()["MetricAlarms"], list)
    with pytest.raises(ClientError) as refused:  # the team key may not call CloudWatch
        client(gw, "cloudwatch", TEAM, TEAM_SECRET).describe_alarms()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_a_query_form_runs_only_as_the_action_it_names(teams: tuple[GatewayProcess, Path]) -> None:
    """An empty X-Amz-Target was authorised as sagemaker:UnknownOperation at the edge, and
    the door then ran the CloudWatch action the form named: a sagemaker:* key deleted an
    alarm. The door now authorises the action it runs."""
    gw, _ = teams
    ops = client(gw, "cloudwatch")
    ops.put_metric_alarm(
        AlarmName="ops-guard", Namespace="Ops", MetricName="m", Statistic="Sum", Period=60,
        EvaluationPeriods=1, Threshold=1.0, ComparisonOperator="GreaterThanThreshold",
    )  # fmt: skip
    body = b"Action=DeleteAlarms&Version=2010-08-01&AlarmNames.member.1=ops-guard"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for target in ({"X-Amz-Target": ""}, {}):
        status, _, out = signed_http(
            gw, "POST", "/", body, key=SMADMIN, secret=SMADMIN_SECRET, **form, **target
        )
        assert status == 403 and b"AccessDenied" in out, out
    assert [a["AlarmName"] for a in ops.describe_alarms()["MetricAlarms"]] == ["ops-guard"]
    ops.delete_alarms(AlarmNames=["ops-guard"])


def test_an_unsigned_query_form_over_tls_runs_only_as_the_action_it_names(
    tmp_path: Path,
) -> None:
    """The edge never reads an unsigned body, so it authorised the form as
    sagemaker:UnknownOperation; the door now authorises the action it runs."""
    import ssl
    import urllib.error
    import urllib.request

    from tests.e2e.test_tls import client as tls_client
    from tests.e2e.test_tls import self_signed, start_https_gateway

    cert, key = self_signed(tmp_path / "tls")
    stack = {
        "auth": {
            "keys": [
                {"access_key_id": OPS, "secret_access_key_env": "SHIPYARD_KEY_OPS"},
                {
                    "access_key_id": APP,
                    "secret_access_key_env": "SHIPYARD_KEY_APP",
                    "allow": ["sagemaker:*"],
                },
            ]
        }
    }
    (tmp_path / "stack.yaml").write_text(json.dumps(stack))
    args = ["--config", str(tmp_path / "stack.yaml"), "--tls-cert", str(cert)]
    args += ["--tls-key", str(key)]
    gw = start_https_gateway(tmp_path / "home", cert, args)
    try:
        ops = tls_client(gw, "cloudwatch", cert)
        ops.put_metric_alarm(
            AlarmName="ops-guard", Namespace="Ops", MetricName="m", Statistic="Sum",
            Period=60, EvaluationPeriods=1, Threshold=1.0,
            ComparisonOperator="GreaterThanThreshold",
        )  # fmt: skip
        body = b"Action=DeleteAlarms&Version=2010-08-01&AlarmNames.member.1=ops-guard"
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
        }
        request = AWSRequest(method="POST", url=gw.url + "/", data=body, headers=headers)
        SigV4Auth(Credentials(APP, APP_SECRET), "monitoring", "us-east-1").add_auth(request)
        sent = urllib.request.Request(
            gw.url + "/", data=body, method="POST", headers=dict(request.headers.items())
        )
        context = ssl.create_default_context(cafile=str(cert))
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(sent, timeout=30, context=context)
        assert refused.value.code == 403
        assert [a["AlarmName"] for a in ops.describe_alarms()["MetricAlarms"]] == ["ops-guard"]
    finally:
        gw.stop()


def test_an_adapter_must_reach_its_base_component(teams: tuple[GatewayProcess, Path]) -> None:
    """Specification.BaseInferenceComponentName names a resource: a builder scoped to
    team-a-* cannot load its adapter into team B's component's copies."""
    gw, tarball = teams
    builder = client(gw, "sagemaker", BUILDER, BUILDER_SECRET)
    code, status, message = error_code(
        lambda: builder.create_inference_component(
            InferenceComponentName="team-a-lora",
            EndpointName="team-a-x",
            Specification={
                "BaseInferenceComponentName": "team-b-ic",
                "Container": {"ArtifactUrl": tarball.as_uri()},
            },
        )
    )
    assert (code, status) == ("AccessDeniedException", 403), message
    assert "inference-component/team-b-ic" in message


def test_the_metrics_page_keeps_to_the_endpoints_the_key_reaches(
    teams: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = teams
    client(gw, "sagemaker-runtime", TEAM, TEAM_SECRET).invoke_endpoint(
        EndpointName="team-a-x", ContentType="application/json", Body=b'{"instances": [[1]]}'
    )
    status, _, out = signed_http(gw, "GET", "/metrics", key=VIEWER, secret=VIEWER_SECRET)
    assert status == 200
    text = out.decode()
    assert 'endpoint="team-a-x"' in text and "team-b-x" not in text
    assert "shipyard_" in text  # and the gateway's own series
    status, _, out = signed_http(gw, "GET", "/metrics")  # the operator's key: everything
    assert status == 200 and 'endpoint="team-b-x"' in out.decode()


@pytest.mark.parametrize("path", ["/console/api/endpoints/logs", "/console/api/endpoints/metrics"])
def test_a_console_view_of_a_resource_named_like_a_view_is_a_view_of_it(
    teams: tuple[GatewayProcess, Path], path: str
) -> None:
    """An endpoint named "logs" is described, not read as its logs: a key that may read
    logs only is refused the description."""
    gw, _ = teams
    status, _, out = signed_http(gw, "GET", path, key=LOGSONLY, secret=LOGSONLY_SECRET)
    assert status == 403 and b"sagemaker:DescribeEndpoint" in out, out


def test_a_deployments_rollback_alarms_are_resources_too(
    teams: tuple[GatewayProcess, Path],
) -> None:
    """An alarm named to roll a deployment back is one the key must reach: another
    team's alarm could otherwise drive one's rollbacks, or its existence be learnt."""
    gw, _ = teams
    builder = client(gw, "sagemaker", BUILDER, BUILDER_SECRET)
    code, status, message = error_code(
        lambda: builder.create_endpoint(
            EndpointName="team-a-rolled",
            EndpointConfigName="team-a-x",
            DeploymentConfig={
                "BlueGreenUpdatePolicy": {
                    "TrafficRoutingConfiguration": {
                        "Type": "ALL_AT_ONCE",
                        "WaitIntervalInSeconds": 0,
                    }
                },
                "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "team-b-errors"}]},
            },
        )
    )
    assert (code, status) == ("AccessDeniedException", 403), message
    assert "alarm:team-b-errors" in message
