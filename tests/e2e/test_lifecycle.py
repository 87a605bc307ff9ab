"""Endpoint lifecycle across updates, scaling and gateway restarts."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, wait_in_service, wait_until
from tests.e2e.processes import alive, instance_pids
from tests.e2e.test_invocations import wait_for_instance_count


class Hammer(threading.Thread):
    """Invokes an endpoint in a loop and records every outcome."""

    def __init__(self, gw: GatewayProcess, name: str) -> None:
        super().__init__(daemon=True)
        # No retries: a failed request must show up here, not be hidden by boto3.
        self.rt = gw.client("sagemaker-runtime", max_attempts=1)
        self.name = name
        self.stop_event = threading.Event()
        self.answers: list[Any] = []
        self.failures: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            try:
                out = self.rt.invoke_endpoint(
                    EndpointName=self.name, Body=b'{"instances": [[1, 2]]}'
                )
                self.answers.append(json.loads(out["Body"].read()))
            except ClientError as exc:
                self.failures.append(str(exc))

    def finish(self) -> None:
        self.stop_event.set()
        self.join(10)


def _config_with_new_model(sm: Any, config: str, url: str, *, variant: str, count: int) -> None:
    """A model called ``config`` at ``url`` and an endpoint config ``config`` serving it."""
    sm.create_model(
        ModelName=config, PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url}
    )
    sm.create_endpoint_config(
        EndpointConfigName=config,
        ProductionVariants=[
            {
                "VariantName": variant,
                "ModelName": config,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": count,
            }
        ],
    )


def _scaled(sm: Any, name: str, *, count: int, weight: float) -> None:
    """Variant v1 of ``name`` set to ``count`` instances and ``weight``, and in service."""
    sm.update_endpoint_weights_and_capacities(
        EndpointName=name,
        DesiredWeightsAndCapacities=[
            {"VariantName": "v1", "DesiredInstanceCount": count, "DesiredWeight": weight}
        ],
    )
    wait_in_service(sm, name)


def test_update_endpoint_is_blue_green_with_zero_failed_requests(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    sm = gateway.sm
    deploy(sm, "bg", model_tarball("echo"), count=2)
    old_pids = instance_pids(gateway.process.pid)
    _config_with_new_model(sm, "bg-2", model_tarball("sum"), variant="v2", count=2)
    hammer = Hammer(gateway, "bg")
    hammer.start()
    wait_until(lambda: hammer.answers, "answers from the old model")
    sm.update_endpoint(EndpointName="bg", EndpointConfigName="bg-2")
    assert sm.describe_endpoint(EndpointName="bg")["EndpointStatus"] == "Updating"
    wait_in_service(sm, "bg")
    wait_until(lambda: hammer.answers[-1] != hammer.answers[0], "answers from the new model")
    hammer.finish()
    assert hammer.failures == []
    assert hammer.answers[0] == {"instances": [[1, 2]]}  # the old model echoed
    assert hammer.answers[-1] != hammer.answers[0]  # the new model answers now
    described = sm.describe_endpoint(EndpointName="bg")
    assert described["EndpointConfigName"] == "bg-2"
    assert described["ProductionVariants"][0]["VariantName"] == "v2"
    deadline = time.monotonic() + 30
    while any(alive(p) for p in old_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in old_pids)


def test_failed_update_rolls_back_and_keeps_serving(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    sm = gateway.sm
    deploy(sm, "rb", model_tarball("echo"))
    _config_with_new_model(sm, "rb-2", model_tarball("load_fails"), variant="v1", count=1)
    sm.update_endpoint(EndpointName="rb", EndpointConfigName="rb-2")
    wait_in_service(sm, "rb")
    described = sm.describe_endpoint(EndpointName="rb")
    assert described["EndpointConfigName"] == "rb"
    assert "weights missing" in described["FailureReason"]
    out = gateway.rt.invoke_endpoint(EndpointName="rb", Body=b'{"a": 1}')
    assert json.loads(out["Body"].read()) == {"a": 1}


def test_weights_and_capacities_scale_in_place(gateway: GatewayProcess, model_tarball: Any) -> None:
    sm = gateway.sm
    deploy(sm, "scale", model_tarball("echo"), count=1)
    _scaled(sm, "scale", count=3, weight=2.0)
    variant = sm.describe_endpoint(EndpointName="scale")["ProductionVariants"][0]
    assert variant["CurrentInstanceCount"] == 3 and variant["DesiredWeight"] == 2.0
    assert len(instance_pids(gateway.process.pid)) == 3
    sm.update_endpoint_weights_and_capacities(
        EndpointName="scale",
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 1}],
    )
    wait_in_service(sm, "scale")
    wait_for_instance_count(gateway, "scale", 1)
    try:
        sm.update_endpoint_weights_and_capacities(
            EndpointName="scale",
            DesiredWeightsAndCapacities=[{"VariantName": "nope", "DesiredInstanceCount": 1}],
        )
        raise AssertionError("unknown variant accepted")
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "ValidationException"


def test_restart_on_the_same_home_brings_endpoints_back(
    gateway_factory: Any, model_tarball: Any
) -> None:
    gw = gateway_factory()
    deploy(gw.sm, "durable", model_tarball("echo"), count=2)
    pids = instance_pids(gw.process.pid)
    assert len(pids) == 2
    assert gw.stop() in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    assert not any(alive(p) for p in pids), "SIGTERM must stop the instance processes"
    again = gateway_factory(home=gw.home)
    wait_in_service(again.sm, "durable")
    wait_for_instance_count(again, "durable", 2)
    out = again.client("sagemaker-runtime", max_attempts=8).invoke_endpoint(
        EndpointName="durable", Body=b'{"back": true}'
    )
    assert json.loads(out["Body"].read()) == {"back": True}


def test_after_a_restart_an_endpoint_not_up_yet_is_not_ready_rather_than_unknown(
    gateway_factory: Any, model_tarball: Any
) -> None:
    """The store says InService at once; until its instances are back, clients hear 429
    ModelNotReadyException (which boto3 retries), never "endpoint not found"."""
    gw = gateway_factory()
    deploy(gw.sm, "slowstart", model_tarball("sleepy"), environment={"SLEEPY_LOAD_S": "4"})
    assert gw.stop() in (0, -15)
    again = gateway_factory(home=gw.home)
    rt = again.client("sagemaker-runtime", max_attempts=1)
    with pytest.raises(ClientError) as refused:
        rt.invoke_endpoint(EndpointName="slowstart", Body=b"{}")
    error = refused.value.response
    assert error["Error"]["Code"] == "ModelNotReadyException", error
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 429
    wait_for_instance_count(again, "slowstart", 1)
    out = rt.invoke_endpoint(EndpointName="slowstart", Body=b"{}")
    assert json.loads(out["Body"].read())["slept"] == 0


def test_stopping_the_gateway_mid_creation_leaves_no_instances(
    gateway_factory: Any, model_tarball: Any
) -> None:
    gw = gateway_factory()
    deploy(
        gw.sm,
        "slow-load",
        model_tarball("sleepy"),
        count=2,
        wait=False,
        environment={"SLEEPY_LOAD_S": "30"},
    )
    deadline = time.monotonic() + 20
    while len(instance_pids(gw.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = instance_pids(gw.process.pid)
    assert len(pids) == 2
    assert gw.sm.describe_endpoint(EndpointName="slow-load")["EndpointStatus"] == "Creating"
    gw.stop()
    assert not any(alive(p) for p in pids)


def test_an_update_retaining_variant_properties_keeps_the_scaled_count_and_weight(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    """RetainAllVariantProperties: a variant scaled by hand (or by autoscaling) keeps its
    instance count and weight through an update to a config that says otherwise;
    ExcludeRetainedVariantProperties takes the named ones from the new config."""
    sm = gateway.sm
    deploy(sm, "keep", model_tarball("echo"), count=1)
    _scaled(sm, "keep", count=2, weight=0.5)
    _config_with_new_model(sm, "keep-2", model_tarball("sum"), variant="v1", count=1)
    sm.update_endpoint(
        EndpointName="keep", EndpointConfigName="keep-2", RetainAllVariantProperties=True
    )
    pending = sm.describe_endpoint(EndpointName="keep")["PendingDeploymentSummary"]
    assert pending["ProductionVariants"][0]["DesiredInstanceCount"] == 2
    wait_in_service(sm, "keep")
    (variant,) = sm.describe_endpoint(EndpointName="keep")["ProductionVariants"]
    assert (variant["DesiredInstanceCount"], variant["DesiredWeight"]) == (2, 0.5)
    assert variant["CurrentInstanceCount"] == 2
    # The old fleet's instances drain and stop: the new fleet's two stay.
    wait_until(lambda: len(instance_pids(gateway.process.pid)) == 2, "two instances left")
    # Back to the first config, its count taken from it, its weight still kept.
    sm.update_endpoint(
        EndpointName="keep",
        EndpointConfigName="keep",
        RetainAllVariantProperties=True,
        ExcludeRetainedVariantProperties=[{"VariantPropertyType": "DesiredInstanceCount"}],
    )
    wait_in_service(sm, "keep")
    described = sm.describe_endpoint(EndpointName="keep")
    assert described["EndpointConfigName"] == "keep"
    (variant,) = described["ProductionVariants"]
    assert (variant["DesiredInstanceCount"], variant["DesiredWeight"]) == (1, 0.5)
    assert "PendingDeploymentSummary" not in described
