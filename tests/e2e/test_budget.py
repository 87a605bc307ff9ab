"""The gateway's total budget: instances, and their memory by InstanceType (finding 9)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, deploy


def limit_exceeded(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as info:
        call()
    assert info.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    return str(info.value.response["Error"]["Message"])


def config(sm: Any, name: str, count: int, instance_type: str = "ml.t2.medium") -> None:
    sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[{"VariantName": "v1", "ModelName": "sum",
                             "InstanceType": instance_type, "InitialInstanceCount": count}],
    )  # fmt: skip


def test_endpoints_cannot_ask_for_more_instances_than_the_gateway_allows(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_MAX_INSTANCES": "3"})
    sm = gw.sm
    deploy(sm, "sum", (MODELS / "sum").as_uri(), count=2)
    config(sm, "two", 2)
    message = limit_exceeded(lambda: sm.create_endpoint(EndpointName="b", EndpointConfigName="two"))
    assert "4 instances" in message and "limit is 3" in message
    limit_exceeded(
        lambda: sm.update_endpoint_weights_and_capacities(
            EndpointName="sum",
            DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 4}],
        )
    )
    config(sm, "one", 1)
    sm.create_endpoint(EndpointName="c", EndpointConfigName="one")  # 3 in all: allowed
    sm.get_waiter("endpoint_in_service").wait(EndpointName="c", WaiterConfig={"Delay": 0.2})
    sm.delete_endpoint(EndpointName="c")
    sm.get_waiter("endpoint_deleted").wait(EndpointName="c", WaiterConfig={"Delay": 0.2})
    sm.create_endpoint(EndpointName="d", EndpointConfigName="one")  # its share is free again


def test_the_memory_of_the_instance_types_is_capped_when_asked(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_MAX_INSTANCE_MEMORY_BYTES": str(20 << 30)})
    sm = gw.sm
    deploy(sm, "sum", (MODELS / "sum").as_uri(), count=2)  # 2 x ml.m5.large = 16 GiB
    config(sm, "big", 1, "ml.m5.large")
    message = limit_exceeded(lambda: sm.create_endpoint(EndpointName="b", EndpointConfigName="big"))
    assert "24.0 GiB" in message
    config(sm, "small", 1, "ml.t2.medium")  # 4 GiB more: 20 GiB in all
    sm.create_endpoint(EndpointName="s", EndpointConfigName="small")
