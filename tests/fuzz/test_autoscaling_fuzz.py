"""Application Auto Scaling's door (``AnyScaleFrontendService.*``) never answers 5xx or
hangs, whatever it is sent.

Requests are built from botocore's ``application-autoscaling`` model for every action the
gateway implements, mostly aimed at a real endpoint's variant, then mutated, as the
control-plane fuzz does for ``SageMaker.*`` (whose checks this module reuses).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest

from shipyard.gateway.api.actions.autoscaling import ACTIONS
from tests.conftest import GatewayProcess, make_tarball, start_gateway, wait_in_service
from tests.fuzz.shapes import MISSING, Request, Skeletons, mutate
from tests.fuzz.test_control_plane_fuzz import SEED, assert_clean, post
from tests.fuzz.wire import rss_kib

MUTATIONS_PER_ACTION = 120
VALID_PER_ACTION = 10
RSS_GROWTH_BOUND_KIB = 64 * 1024
ENDPOINT = "fuzz-scaled"
PREFIX = "AnyScaleFrontendService."


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("fuzz-autoscaling")
    gateway = start_gateway(home / "home", extra_env={"SHIPYARD_AUTOSCALING_PERIOD_S": "0.2"})
    try:
        model = make_tarball("echo", home / "echo.tar.gz").as_uri()
        sm = gateway.sm
        container = {"Image": "shipyard/python", "ModelDataUrl": model}
        sm.create_model(ModelName=ENDPOINT, PrimaryContainer=container)
        sm.create_endpoint_config(EndpointConfigName=ENDPOINT, ProductionVariants=[{
            "VariantName": "v1", "ModelName": ENDPOINT, "InstanceType": "ml.m5.large",
            "InitialInstanceCount": 1}])  # fmt: skip
        sm.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName=ENDPOINT)
        wait_in_service(sm, ENDPOINT)
        yield gateway
    finally:
        gateway.stop()


_MOSTLY: dict[str, Any] = {
    "ServiceNamespace": "sagemaker",
    "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
    "ResourceId": f"endpoint/{ENDPOINT}/variant/v1",
    "PolicyType": "TargetTrackingScaling",
    "NextToken": None,
    # Mostly a policy shipyard takes, so that valid ones reach the autoscaler.
    "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance",
    "CustomizedMetricSpecification": None,
    "StepScalingPolicyConfiguration": None,
    "TargetValue": 1000.0,
    "ResourceLabel": None,
}
"""Members mostly given this value (None: left out), and now and then a random one."""


def _override(op: str, path: tuple[Any, ...], name: str, rng: random.Random) -> Any:
    roll = rng.random()
    if name in _MOSTLY:
        return _MOSTLY[name] if roll < 0.95 else MISSING
    if name == "ResourceIds":
        return [_MOSTLY["ResourceId"]]
    if name in ("MinCapacity", "MaxCapacity"):
        return 1 if roll < 0.95 else rng.choice([0, 2, 5, 10_000])
    if name in ("ScaleInCooldown", "ScaleOutCooldown"):
        return rng.choice([0, 1, 60, 300]) if roll < 0.95 else MISSING
    return MISSING


def _requests(rng: random.Random) -> Iterator[Request]:
    model = botocore.session.get_session().get_service_model("application-autoscaling")
    always = {"TargetTrackingScalingPolicyConfiguration", "PredefinedMetricSpecification",
              "MinCapacity", "MaxCapacity"}  # fmt: skip
    skeletons = Skeletons(model, rng, _override, always=frozenset(always))
    operations = sorted(ACTIONS)
    for index in range(VALID_PER_ACTION + MUTATIONS_PER_ACTION):
        rng.shuffle(operations)
        for op in operations:
            request, shapes = skeletons.build(op, full=rng.random() < 0.3)
            yield request if index < VALID_PER_ACTION else mutate(request, shapes, rng)


def test_no_request_built_from_the_autoscaling_model_gets_a_5xx_or_hangs(
    gw: GatewayProcess,
) -> None:
    rng = random.Random(SEED)
    pid = gw.process.pid
    before = rss_kib(pid)
    started = time.monotonic()
    statuses: Counter[str] = Counter()
    for request in _requests(rng):
        answer = post(gw, request.body(), PREFIX + request.operation)
        assert_clean(answer, f"{request.operation} {request.mutation}")
        statuses[f"{request.operation} {answer.status} {answer.json().get('__type', '')}"] += 1
    for target in (PREFIX, PREFIX + "Nope", PREFIX + "ACTIONS", PREFIX + "A" * 5_000):
        assert_clean(post(gw, b"{}", target), target)
    assert gw.get("/healthz")[0] == 200
    grown = rss_kib(pid) - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"RSS grew by {grown} KiB"
    failed = [line for line in gw.log().splitlines() if "request failed" in line]
    assert failed == [], failed[:3]
    assert "autoscaling pass failed" not in gw.log()
    # Whatever the fuzzed policies said, the endpoint is still there and answers.
    wait_answer = gw.rt.invoke_endpoint(EndpointName=ENDPOINT, Body=b'{"x": 1}',
                                        ContentType="application/json")  # fmt: skip
    assert json.loads(wait_answer["Body"].read()) == {"x": 1}
    count = sum(statuses.values())
    print(f"{count} requests in {time.monotonic() - started:.1f} s: {statuses}")
