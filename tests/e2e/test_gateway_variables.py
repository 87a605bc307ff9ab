"""The gateway's own variables are never a caller's to set, on a gateway without ``auth:``
too (issue 65, item 3): ``SHIPYARD_ADAPTERS_TOKEN`` in a CreateTransformJob's
Environment once gave another model's instance the code-loading ``/adapters`` route,
with a token the caller chose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, unique
from tests.e2e.test_jobs import job_request

ROLE = "arn:aws:iam::123456789012:role/x"


def refusal(call: Any) -> str:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    return str(error["Message"])


@pytest.mark.parametrize("variable", ["SHIPYARD_ADAPTERS_TOKEN", "SHIPYARD_INSTANCE_ID"])
def test_a_gateway_without_auth_refuses_its_own_variables(
    gateway: GatewayProcess, tmp_path: Path, variable: str
) -> None:
    sm = gateway.sm
    environment = {variable: "chosen-by-the-caller"}
    message = refusal(
        lambda: sm.create_model(
            ModelName=unique("own"),
            PrimaryContainer={
                "Image": "shipyard/python",
                "ModelDataUrl": (MODELS / "echo").as_uri(),
                "Environment": environment,
            },
            ExecutionRoleArn=ROLE,
        )
    )
    assert f"PrimaryContainer.Environment: '{variable}'" in message

    model = unique("plain")
    sm.create_model(
        ModelName=model,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": (MODELS / "echo").as_uri()},
        ExecutionRoleArn=ROLE,
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.json").write_text("[1]")
    message = refusal(
        lambda: sm.create_transform_job(
            TransformJobName=unique("own"),
            ModelName=model,
            TransformInput={
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": (tmp_path / "data").as_uri(),
                    }
                }
            },
            TransformOutput={"S3OutputPath": (tmp_path / "out").as_uri()},
            TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
            Environment=environment,
        )
    )
    assert f"Environment: '{variable}'" in message
    assert sm.list_transform_jobs()["TransformJobSummaries"] == []

    request = job_request(unique("own"), tmp_path / "out")
    message = refusal(lambda: sm.create_training_job(**request, Environment=environment))
    assert f"Environment: '{variable}'" in message
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []
