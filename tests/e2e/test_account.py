"""The account id in ARNs: from the stack file, overridden by SHIPYARD_ACCOUNT_ID, and
shown in the gateway's start-up line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from tests.conftest import MODELS, GatewayProcess, wait_until


def _model_arn(gw: GatewayProcess) -> str:
    out = gw.sm.create_model(
        ModelName="m", PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": str(MODELS)}
    )
    return str(out["ModelArn"])


def test_the_stack_file_sets_the_account_id(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"account_id": "123456789012"}))
    gw = gateway_factory(args=["--config", str(stack)])
    assert _model_arn(gw) == "arn:aws:sagemaker:us-east-1:123456789012:model/m"
    wait_until(lambda: "account 123456789012, region us-east-1" in gw.log(), "start-up line")


def test_the_variable_overrides_the_stack_file(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"account_id": "123456789012"}))
    gw = gateway_factory(
        args=["--config", str(stack)], extra_env={"SHIPYARD_ACCOUNT_ID": "111122223333"}
    )
    assert _model_arn(gw) == "arn:aws:sagemaker:us-east-1:111122223333:model/m"
