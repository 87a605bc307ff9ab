"""The autoscaler's guards, on real gateways driven by boto3: PutScalingPolicy
refuses a TargetValue or step adjustments Application Auto Scaling refuses, a stored
policy that cannot be computed never stops the other targets scaling in the same pass,
and a real-time variant never scales below one instance whatever MinCapacity it kept
from an asynchronous config (an asynchronous variant still scales to zero).

A policy PutScalingPolicy refuses now (one stored before it did) is written into the
gateway's SQLite store while the gateway is stopped, with ``shipyard.storage``'s own
classes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from tests.conftest import (
    MODELS,
    GatewayProcess,
    deploy,
    start_gateway,
    unique,
    wait_in_service,
    wait_until,
)

DIMENSION = "sagemaker:variant:DesiredInstanceCount"
FAST = {"SHIPYARD_AUTOSCALING_PERIOD_S": "0.3", "SHIPYARD_AUTOSCALING_WINDOW_S": "3"}
PER_INSTANCE = {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}
CONCURRENCY = {"PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"}
ECHO = (MODELS / "echo").as_uri()


def rid(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/v1"


def scaling(gw: GatewayProcess) -> Any:
    return gw.client("application-autoscaling")


def register(gw: GatewayProcess, endpoint: str, low: int, high: int) -> None:
    scaling(gw).register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=rid(endpoint), ScalableDimension=DIMENSION,
        MinCapacity=low, MaxCapacity=high,
    )  # fmt: skip


def put_policy(
    gw: GatewayProcess, endpoint: str, kind: str, config: dict[str, Any], name: str = "p"
) -> str:
    key = (
        "TargetTrackingScalingPolicyConfiguration"
        if kind == "TargetTrackingScaling"
        else "StepScalingPolicyConfiguration"
    )
    answer = scaling(gw).put_scaling_policy(
        PolicyName=name, ServiceNamespace="sagemaker", ResourceId=rid(endpoint),
        ScalableDimension=DIMENSION, PolicyType=kind, **{key: config},
    )  # fmt: skip
    return str(answer["PolicyARN"])


def tracking(goal: float, metric: dict[str, str] = PER_INSTANCE) -> dict[str, Any]:
    return {"TargetValue": goal, "PredefinedMetricSpecification": metric,
            "ScaleInCooldown": 0, "ScaleOutCooldown": 0}  # fmt: skip


def refusal(call: Callable[[], object]) -> dict[str, Any]:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    return dict(caught.value.response["Error"])


def counts(gw: GatewayProcess, endpoint: str) -> tuple[int, int]:
    """(CurrentInstanceCount, DesiredInstanceCount) of the endpoint's variant v1."""
    variant = gw.sm.describe_endpoint(EndpointName=endpoint)["ProductionVariants"][0]
    return variant.get("CurrentInstanceCount", -1), variant["DesiredInstanceCount"]


def activities(gw: GatewayProcess, endpoint: str) -> list[dict[str, Any]]:
    listed = scaling(gw).describe_scaling_activities(
        ServiceNamespace="sagemaker", ResourceId=rid(endpoint)
    )
    return list(listed["ScalingActivities"])


def invoke(gw: GatewayProcess, endpoint: str) -> bool:
    answer = gw.rt.invoke_endpoint(
        EndpointName=endpoint, Body=b"{}", ContentType="application/json"
    )
    answer["Body"].read()
    return True


def asynchronous(tmp_path: Path) -> dict[str, Any]:
    return {"OutputConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}}


# -- PutScalingPolicy's refusals: one gateway and endpoint for the module -----------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str]]:
    """A gateway with one real-time endpoint registered as a scalable target (1..2)."""
    gw = start_gateway(tmp_path_factory.mktemp("guards") / "home")
    try:
        deploy(gw.sm, "guarded", ECHO)
        register(gw, "guarded", 1, 2)
        yield gw, "guarded"
    finally:
        gw.stop()


@pytest.mark.parametrize(
    ("goal", "code"),
    [
        *((goal, "ValidationException") for goal in (5e-324, 1e-200, 2.0**-361, 1e300, 2.0**361)),
        (float("inf"), "SerializationException"),
        (float("nan"), "SerializationException"),
    ],
)
def test_a_target_value_whose_use_cannot_be_computed_is_refused(
    guarded: tuple[GatewayProcess, str], goal: float, code: str
) -> None:
    """botocore sends Infinity and NaN (its validation takes any float) as the strings
    "Infinity" and "NaN", and the gateway's request validation refuses them before
    PutScalingPolicy sees them, as a Java deserialiser does: SerializationException
    (gateway/wire/validation.py). A finite value out of 2^-360..2^360 is PutScalingPolicy's
    ValidationException."""
    gw, name = guarded
    config = {"TargetValue": goal, "PredefinedMetricSpecification": PER_INSTANCE}
    error = refusal(lambda: put_policy(gw, name, "TargetTrackingScaling", config, "tracking"))
    assert error["Code"] == code, (goal, error)
    assert "targetvalue" in error["Message"].lower(), (goal, error)
    described = scaling(gw).describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=rid(name), PolicyNames=["tracking"]
    )
    kept = [p["TargetTrackingScalingPolicyConfiguration"] for p in described["ScalingPolicies"]]
    assert all(c["TargetValue"] != goal for c in kept), (goal, kept)


@pytest.mark.parametrize("goal", [2.0**-360, 1e-6, 0.5, 1000.0, 2.0**360])
def test_a_target_value_within_application_auto_scalings_range_is_taken(
    guarded: tuple[GatewayProcess, str], goal: float
) -> None:
    gw, name = guarded
    config = {"TargetValue": goal, "PredefinedMetricSpecification": PER_INSTANCE}
    put_policy(gw, name, "TargetTrackingScaling", config, "tracking")
    described = scaling(gw).describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=rid(name), PolicyNames=["tracking"]
    )
    (policy,) = described["ScalingPolicies"]
    assert policy["TargetTrackingScalingPolicyConfiguration"] == config


def steps(*bounds: tuple[float | None, float | None]) -> dict[str, Any]:
    adjustments = []
    for low, high in bounds:
        step: dict[str, Any] = {"ScalingAdjustment": 1}
        if low is not None:
            step["MetricIntervalLowerBound"] = low
        if high is not None:
            step["MetricIntervalUpperBound"] = high
        adjustments.append(step)
    return {"AdjustmentType": "ChangeInCapacity", "StepAdjustments": adjustments}


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (steps((None, None)), "both"),
        (steps((0, 10), (10, None), (None, 0), (None, None)), "both"),
        (steps((0, 5), (6, None)), "gap"),
        (steps((None, -5), (0, None)), "gap"),
        (steps((0, 5), (4, None)), "overlap"),
        (steps((-10, 0), (0, None)), "null lower bound"),
        (steps((0, 10)), "null upper bound"),
        (steps((None, 0), (0, 10)), "null upper bound"),
    ],
)
def test_step_adjustments_application_auto_scaling_refuses_are_refused(
    guarded: tuple[GatewayProcess, str], config: dict[str, Any], words: str
) -> None:
    gw, name = guarded
    error = refusal(lambda: put_policy(gw, name, "StepScaling", config, "steps"))
    assert error["Code"] == "ValidationException", (config, error)
    assert words in error["Message"], (config, error)


@pytest.mark.parametrize(
    "config",
    [
        steps((0, None)),
        steps((None, 0)),
        steps((None, 0), (0, 10), (10, None)),
        steps((None, -5), (-5, 0)),
        steps((5, 10), (10, None)),
        steps((-10, -5), (None, -10)),
    ],
)
def test_step_adjustments_without_gap_or_open_end_are_taken(
    guarded: tuple[GatewayProcess, str], config: dict[str, Any]
) -> None:
    gw, name = guarded
    put_policy(gw, name, "StepScaling", config, "steps")
    described = scaling(gw).describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=rid(name), PolicyNames=["steps"]
    )
    (policy,) = described["ScalingPolicies"]
    taken = policy["StepScalingPolicyConfiguration"]["StepAdjustments"]
    assert taken == config["StepAdjustments"], (config, taken)


# -- a policy that cannot be computed --------------------------------------------------


def beside_a_broken_policy(
    gateway_factory: Callable[..., GatewayProcess], home: Path, broken: dict[str, Any]
) -> tuple[GatewayProcess, str, str]:
    """Endpoints ``a`` (1..4) and ``b`` (1..3), each with a target tracking policy on its
    invocations per instance, ``a``'s changed in the store to ``broken`` (as one stored
    before PutScalingPolicy refused it); then both driven until ``b`` scales out to its
    MaxCapacity, which its policy (TargetValue 1 a minute) asks for at any traffic.
    Both are invoked alike, ``a`` first: whenever ``b`` has a value, so has ``a``; and
    ``a`` was registered first, so each pass evaluates it before ``b``."""
    from shipyard.storage.metadata import MetadataStore
    from shipyard.storage.scaling import ScalingStore

    gw = gateway_factory(home=home, extra_env=FAST)
    a, b = unique("broken"), unique("healthy")
    deploy(gw.sm, a, ECHO, wait=False)
    deploy(gw.sm, b, ECHO)
    wait_in_service(gw.sm, a)
    register(gw, a, 1, 4)
    register(gw, b, 1, 3)
    put_policy(gw, a, "TargetTrackingScaling", tracking(10.0))
    put_policy(gw, b, "TargetTrackingScaling", tracking(1.0))
    gw.stop()
    meta = MetadataStore(f"sqlite:///{home / 'shipyard.db'}")
    store = ScalingStore(meta.engine)
    (policy,) = store.list_policies(rid(a))
    store.put_policy(replace(policy, config={**policy.config, **broken}))
    meta.engine.dispose()

    gw = gateway_factory(home=home, extra_env=FAST)
    # Each in service again, with its instance started anew.
    wait_until(lambda: counts(gw, a) == counts(gw, b) == (1, 1), "both instances back")
    wait_until(
        lambda: invoke(gw, a) and invoke(gw, b) and counts(gw, b)[1] == 3,
        f"{b} scaled out to 3 under load beside {a}",
        timeout_s=60,
    )
    return gw, a, b


def first_line(gw: GatewayProcess, words: str) -> int:
    """Where the gateway's log first says ``words`` (a line number; fails if nowhere)."""
    lines = gw.log().splitlines()
    found = next((n for n, line in enumerate(lines) if words in line), None)
    assert found is not None, f"{words!r} not in the gateway's log:\n{gw.log()}"
    return found


def test_a_stored_policy_with_a_tiny_target_value_asks_for_nothing(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """A policy stored before its TargetValue was checked: its quotient is infinite, so it
    asks for nothing, and the pass goes on to the next target."""
    gw, a, b = beside_a_broken_policy(gateway_factory, tmp_path / "home", {"TargetValue": 5e-324})
    assert counts(gw, a) == (1, 1)
    assert activities(gw, a) == []
    said = f"policy p of {rid(a)}: SageMakerVariantInvocationsPerInstance "
    warned = [line for line in gw.log().splitlines() if said in line]
    assert all("over TargetValue 4.94066e-324 is not a number of" in w for w in warned), warned
    assert first_line(gw, said) < first_line(gw, f"scaling {rid(b)} from 1 to 3")


def test_one_target_that_fails_does_not_stop_the_others(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """A stored TargetValue of 0 (PutScalingPolicy refuses it now): the pass divides by
    it, fails for that target, logs it and goes on."""
    gw, a, b = beside_a_broken_policy(gateway_factory, tmp_path / "home", {"TargetValue": 0})
    assert counts(gw, a) == (1, 1)
    assert activities(gw, a) == []
    failed = first_line(gw, f"autoscaling {rid(a)} failed; evaluating the others")
    assert failed < first_line(gw, f"scaling {rid(b)} from 1 to 3")
    assert "ZeroDivisionError" in gw.log()


# -- a real-time variant keeps one instance ---------------------------------------------


def to_real_time(gw: GatewayProcess, endpoint: str, *, retain: bool = False) -> None:
    """UpdateEndpoint to a real-time config of one instance (or of the count it has now)."""
    config = f"{endpoint}-rt"
    gw.sm.create_endpoint_config(
        EndpointConfigName=config,
        ProductionVariants=[{"VariantName": "v1", "ModelName": endpoint,
                             "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}],
    )  # fmt: skip
    gw.sm.update_endpoint(
        EndpointName=endpoint, EndpointConfigName=config, RetainAllVariantProperties=retain
    )


def is_real_time(gw: GatewayProcess, endpoint: str) -> bool:
    described = gw.sm.describe_endpoint(EndpointName=endpoint)
    return bool(
        described["EndpointStatus"] == "InService"
        and described["EndpointConfigName"] == f"{endpoint}-rt"
    )


def test_a_real_time_variant_never_scales_below_one_whatever_its_min_capacity(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Registered with MinCapacity 0 while the endpoint was asynchronous, then moved to a
    real-time config by UpdateEndpoint: a policy asking for none leaves it at one, and a
    variant found at zero is brought back to one (even one whose MaxCapacity is 0).

    ``idle``'s policy (on requests in flight, and it has had none since it went
    real-time) asks for none in every pass. A real-time ``witness`` at two instances with
    the same policy (and MinCapacity 1) steps down in the first pass that reads it: once
    that step has ended, a whole pass read ``idle``'s policy asking for none too."""
    gw = gateway_factory(extra_env=FAST)
    idle, empty, capped, witness = (unique(n) for n in ("idle", "empty", "capped", "witness"))
    for name in (idle, empty, capped):
        deploy(gw.sm, name, ECHO, async_config=asynchronous(tmp_path), wait=False)
    deploy(gw.sm, witness, ECHO, count=2, wait=False)
    for name in (idle, empty, capped, witness):
        wait_in_service(gw.sm, name)
    register(gw, idle, 0, 2)
    register(gw, empty, 0, 2)
    register(gw, capped, 0, 0)  # asynchronous: taken to its MaxCapacity 0 at once
    gw.sm.update_endpoint_weights_and_capacities(
        EndpointName=empty,
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 0}],
    )
    wait_until(lambda: counts(gw, empty) == (0, 0), f"{empty} at zero instances by hand")
    wait_until(lambda: counts(gw, capped) == (0, 0), f"{capped} at its MaxCapacity 0")
    wait_until(
        lambda: activities(gw, capped)[0]["StatusCode"] != "InProgress", f"{capped}'s step ended"
    )
    to_real_time(gw, idle)
    to_real_time(gw, empty, retain=True)  # at zero instances, as it is now
    to_real_time(gw, capped)
    wait_until(
        lambda: all(is_real_time(gw, n) for n in (idle, empty, capped)),
        "all three real-time and in service",
    )

    put_policy(gw, idle, "TargetTrackingScaling", tracking(1.0, CONCURRENCY))
    register(gw, witness, 1, 2)
    put_policy(gw, witness, "TargetTrackingScaling", tracking(1.0, CONCURRENCY))
    wait_until(
        lambda: [a["StatusCode"] for a in activities(gw, witness)] == ["Successful"],
        f"{witness} stepped down to one instance",
    )
    assert counts(gw, witness)[1] == 1
    wait_until(lambda: counts(gw, empty) == (1, 1), f"{empty} brought back to one instance")
    (back,) = activities(gw, empty)
    assert back["Description"] == "Setting desired instance count to 1."
    assert "below the minimum capacity 1" in back["Cause"], back
    assert counts(gw, idle) == (1, 1)
    assert activities(gw, idle) == []
    assert counts(gw, capped) == (1, 1)
    assert len(activities(gw, capped)) == 1  # its step to zero while asynchronous
    assert all(invoke(gw, n) for n in (idle, empty, capped))  # each serves, real-time


def test_an_asynchronous_variant_still_scales_to_zero(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env=FAST)
    name = unique("queue")
    deploy(gw.sm, name, ECHO, async_config=asynchronous(tmp_path))
    register(gw, name, 0, 2)
    backlog = {
        "MetricName": "ApproximateBacklogSizePerInstance", "Namespace": "AWS/SageMaker",
        "Dimensions": [{"Name": "EndpointName", "Value": name}], "Statistic": "Average",
    }  # fmt: skip
    put_policy(gw, name, "TargetTrackingScaling", {
        "TargetValue": 10.0, "CustomizedMetricSpecification": backlog, "ScaleInCooldown": 0,
    })  # fmt: skip
    wait_until(lambda: counts(gw, name) == (0, 0), "zero instances with an empty queue")
    (step,) = activities(gw, name)
    assert step["Description"] == "Setting desired instance count to 0."


def test_a_step_policy_keeps_a_real_time_variant_at_one(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """An alarm runs a step policy asking for exactly zero instances of a variant that
    went real-time with MinCapacity 0: it is set to one."""
    gw = gateway_factory(extra_env=FAST)
    name = unique("rt")
    deploy(gw.sm, name, ECHO, count=2, async_config=asynchronous(tmp_path))
    register(gw, name, 0, 4)
    to_real_time(gw, name, retain=True)  # keeps its two instances
    wait_until(lambda: is_real_time(gw, name), "real-time and in service")
    assert counts(gw, name) == (2, 2)
    step = {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 0}
    arn = put_policy(gw, name, "StepScaling", {
        "AdjustmentType": "ExactCapacity", "Cooldown": 0, "StepAdjustments": [step],
    }, "s")  # fmt: skip
    cloudwatch = gw.client("cloudwatch")
    cloudwatch.put_metric_alarm(
        AlarmName=f"{name}-alarm", Namespace="AWS/SageMaker", MetricName="Invocations",
        Dimensions=[{"Name": "EndpointName", "Value": name},
                    {"Name": "VariantName", "Value": "v1"}],
        Statistic="Sum", Period=60, EvaluationPeriods=1, Threshold=1e9,
        ComparisonOperator="GreaterThanThreshold", AlarmActions=[arn],
    )  # fmt: skip
    cloudwatch.set_alarm_state(AlarmName=f"{name}-alarm", StateValue="ALARM", StateReason="a drill")
    wait_until(lambda: counts(gw, name) == (1, 1), "one instance left")
    (stepped,) = activities(gw, name)
    assert stepped["Description"] == "Setting desired instance count to 1."
    assert f"monitor alarm {name}-alarm in state ALARM triggered policy s" in stepped["Cause"]
