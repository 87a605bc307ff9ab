"""Tags: on Create calls and through AddTags / ListTags / DeleteTags, per resource ARN."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, deploy

TEAM = {"Key": "team", "Value": "search"}


def _tags(sm: Any, arn: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}


def test_tags_given_at_creation_are_listed_changed_and_deleted(gateway: GatewayProcess) -> None:
    sm = gateway.sm
    arn = sm.create_model(
        ModelName="Tagged",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": str(MODELS / "echo")},
        Tags=[TEAM, {"Key": "cost-center", "Value": "42"}],
    )["ModelArn"]
    assert _tags(sm, arn) == {"team": "search", "cost-center": "42"}
    sm.add_tags(
        ResourceArn=arn, Tags=[{"Key": "team", "Value": "ads"}, {"Key": "env", "Value": ""}]
    )
    assert _tags(sm, arn) == {"team": "ads", "cost-center": "42", "env": ""}
    sm.delete_tags(ResourceArn=arn, TagKeys=["cost-center", "never-set"])
    assert _tags(sm, arn) == {"team": "ads", "env": ""}
    sm.delete_model(ModelName="Tagged")
    with pytest.raises(ClientError) as gone:
        sm.list_tags(ResourceArn=arn)
    assert gone.value.response["Error"]["Code"] == "ValidationException"
    assert arn in gone.value.response["Error"]["Message"]


def test_every_resource_kind_takes_tags(gateway: GatewayProcess, model_tarball: Any) -> None:
    sm = gateway.sm
    deploy(sm, "kinds", model_tarball("echo"))
    described = sm.describe_endpoint(EndpointName="kinds")
    config_arn = sm.describe_endpoint_config(EndpointConfigName="kinds")["EndpointConfigArn"]
    for arn in (described["EndpointArn"], config_arn):
        sm.add_tags(ResourceArn=arn, Tags=[TEAM])
        assert _tags(sm, arn) == {"team": "search"}


def test_at_most_fifty_tags(gateway: GatewayProcess) -> None:
    sm = gateway.sm
    tags = [{"Key": f"k{n:02d}", "Value": str(n)} for n in range(50)]
    arn = sm.create_model(
        ModelName="many",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": str(MODELS / "echo")},
        Tags=tags,
    )["ModelArn"]
    with pytest.raises(ClientError) as over:
        sm.add_tags(ResourceArn=arn, Tags=[{"Key": "one-more", "Value": "x"}])
    assert over.value.response["Error"]["Code"] == "ValidationException"
    assert "50" in over.value.response["Error"]["Message"]
    listed = sm.list_tags(ResourceArn=arn, MaxResults=50)  # boto3's smallest page
    assert [t["Key"] for t in listed["Tags"]] == [t["Key"] for t in tags]
    assert "NextToken" not in listed


def test_bad_tags_and_arns_are_refused(gateway: GatewayProcess) -> None:
    """Checked by the gateway itself, as by SageMaker (boto3's own checks are off here)."""
    sm = gateway.client("sagemaker", config_validation=False)
    arn = sm.create_model(
        ModelName="plain",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": str(MODELS / "echo")},
    )["ModelArn"]
    for call in (
        lambda: sm.add_tags(ResourceArn=arn, Tags=[{"Key": "", "Value": "x"}]),
        lambda: sm.add_tags(ResourceArn=arn, Tags=[{"Key": "k" * 129, "Value": "x"}]),
        lambda: sm.list_tags(ResourceArn="arn:aws:s3:::bucket"),
        lambda: sm.list_tags(ResourceArn=arn.replace("plain", "nothing")),
        # Tag's pattern, of Unicode classes (letters, separators, numbers, _.:/=+-@)
        lambda: sm.add_tags(ResourceArn=arn, Tags=[{"Key": "bad#key!", "Value": "x"}]),
        lambda: sm.add_tags(ResourceArn=arn, Tags=[{"Key": "k", "Value": "tab\there"}]),
        # "Tag keys must be unique per resource"; aws: is AWS's prefix
        lambda: sm.add_tags(
            ResourceArn=arn, Tags=[{"Key": "d", "Value": "1"}, {"Key": "d", "Value": "2"}]
        ),  # fmt: skip
        lambda: sm.add_tags(ResourceArn=arn, Tags=[{"Key": "aws:owner", "Value": "x"}]),
    ):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError) as refused:  # refused before the model is made
        sm.create_model(
            ModelName="twice-tagged",
            PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": str(MODELS / "echo")},
            Tags=[{"Key": "d", "Value": "1"}, {"Key": "d", "Value": "2"}],
        )
    assert "must be unique" in refused.value.response["Error"]["Message"]
    assert "twice-tagged" not in [m["ModelName"] for m in sm.list_models()["Models"]]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "équipe 2", "Value": "café:bleu/=+-@"}])
    assert _tags(sm, arn) == {"équipe 2": "café:bleu/=+-@"}


def test_a_training_job_keeps_the_tags_it_was_created_with(
    gateway: GatewayProcess, tmp_path: Any
) -> None:
    from tests.e2e.test_jobs import job_request

    request = job_request("tagged-job", tmp_path / "out", mode="sleep", seconds="0")
    arn = gateway.sm.create_training_job(**request, Tags=[TEAM])["TrainingJobArn"]
    assert _tags(gateway.sm, arn) == {"team": "search"}
