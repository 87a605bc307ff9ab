"""CreateEndpointConfig refuses variant names given twice, compared as SageMaker compares
them: across ProductionVariants and ShadowProductionVariants, whatever their case."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess

ECHO = (MODELS / "echo").as_uri()
ROLE = "arn:aws:iam::123456789012:role/x"


def variant(name: str) -> dict[str, Any]:
    return {
        "VariantName": name,
        "ModelName": "echo",
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }


@pytest.mark.parametrize(
    ("production", "shadow"),
    [
        (["p1", "p1"], []),
        (["p1", "P1"], []),
        (["p1"], ["p1"]),
        (["p1"], ["P1"]),
    ],
)
def test_variant_names_given_twice_are_refused(
    gateway: GatewayProcess, production: list[str], shadow: list[str]
) -> None:
    gateway.sm.create_model(
        ModelName="echo",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": ECHO},
        ExecutionRoleArn=ROLE,
    )
    extra = {"ShadowProductionVariants": [variant(n) for n in shadow]} if shadow else {}
    with pytest.raises(ClientError) as err:
        gateway.sm.create_endpoint_config(
            EndpointConfigName="twice",
            ProductionVariants=[variant(n) for n in production],
            **extra,
        )
    error = err.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert "Variant names must be unique within an endpoint config" in error["Message"]
    with pytest.raises(ClientError):
        gateway.sm.describe_endpoint_config(EndpointConfigName="twice")
