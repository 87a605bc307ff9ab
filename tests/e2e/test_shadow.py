"""Shadow variants: copies of production requests go to the shadow off the
client's path; its answers, errors and latency are in /metrics under its own name."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from shipyard import autogroup
from tests.conftest import (
    MODELS,
    GatewayProcess,
    needs_autogroups,
    start_gateway,
    unique,
    wait_until,
)
from tests.e2e.processes import instance_pids

ECHO = (MODELS / "echo").as_uri()
SHADOW = (MODELS / "shadow_log").as_uri()
ROLE = "arn:aws:iam::123456789012:role/x"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the module: each test has endpoints of its own on it. Its bound on
    pending copies is above any test's count of requests, so that a shadow slowed down
    by a busy machine drops none of them (the bound has a test of its own)."""
    gateway = start_gateway(
        tmp_path_factory.mktemp("shadow") / "home",
        extra_env={"SHIPYARD_SHADOW_MAX_PENDING_COPIES": "1000"},
    )
    yield gateway
    gateway.stop()


def model(gw: GatewayProcess, name: str, url: str, env: dict[str, str] | None = None) -> str:
    container: dict[str, Any] = {"Image": "shipyard/python", "ModelDataUrl": url}
    if env:
        container["Environment"] = env
    gw.sm.create_model(ModelName=name, PrimaryContainer=container, ExecutionRoleArn=ROLE)
    return name


def variant(name: str, model_name: str, weight: float = 1.0, count: int = 1) -> dict[str, Any]:
    return {
        "VariantName": name,
        "ModelName": model_name,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": count,
        "InitialVariantWeight": weight,
    }


def shadowed(
    gw: GatewayProcess, tmp_path: Path, *, weight: float = 1.0, **env: str
) -> tuple[str, Path]:
    """An endpoint of an echo model with a shadow that records what it gets; returns its
    name and the shadow's record file."""
    name = unique("sh")
    log = tmp_path / f"{name}.log"
    log.touch()
    prod = model(gw, f"{name}-prod", ECHO)
    shadow = model(gw, f"{name}-shadow", SHADOW, {"SHADOW_LOG": str(log), **env})
    gw.sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[variant("prod", prod)],
        ShadowProductionVariants=[variant("shadow", shadow, weight)],
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gw, name)
    return name, log


def wait_in_service(gw: GatewayProcess, name: str) -> None:
    gw.sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )


def invoke_many(gw: GatewayProcess, name: str, count: int, start: int = 0) -> list[float]:
    """``count`` invocations over one keep-alive connection, bodies ``{"i": start}`` on,
    each answered 200 by the production variant; returns their latencies in seconds."""
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    try:
        for i in range(start, start + count):
            body = json.dumps({"i": i}).encode()
            started = time.perf_counter()
            conn.request(
                "POST",
                f"/endpoints/{name}/invocations",
                body,
                {"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            answer = response.read()
            latencies.append(time.perf_counter() - started)
            assert response.status == 200, answer
            assert response.getheader("x-Amzn-Invoked-Production-Variant") == "prod"
            assert json.loads(answer) == {"i": i}
    finally:
        conn.close()
    return latencies


def metric(gw: GatewayProcess, name: str, endpoint: str, variant: str) -> float:
    """One sample of /metrics (a counter's _total, a histogram's _count); 0 when absent."""
    status, body = gw.get("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"endpoint": endpoint, "variant": variant}:
                return float(sample.value)
    return 0.0


def lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def copied_before_sentinel(gw: GatewayProcess, name: str, log: Path) -> list[Any]:
    """The bodies the shadow got, once every copy made so far has been answered.

    The shadow's weight is set to the production variant's, so that the next request is
    copied for sure, and that request (the sentinel) is sent. A shadow of one instance
    gets its copies in order, one exchange at a time, and /metrics counts an exchange's
    copies when it is answered: once the sentinel is in the log and the count equals the
    log's lines, every copy made before it has been answered. No time bound is assumed
    beyond wait_until's generous one.
    """
    gw.sm.update_endpoint_weights_and_capacities(
        EndpointName=name,
        DesiredWeightsAndCapacities=[{"VariantName": "shadow", "DesiredWeight": 1.0}],
    )
    wait_in_service(gw, name)
    gw.rt.invoke_endpoint(EndpointName=name, Body=b'"sentinel"', ContentType="application/json")
    wait_until(
        lambda: (
            b'"sentinel"' in log.read_bytes().splitlines()
            and metric(gw, "shipyard_invocations_total", name, "shadow") == lines(log)
        ),
        "the sentinel's copy answered",
        timeout_s=300,
    )
    assert metric(gw, "shipyard_shadow_copies_dropped_total", name, "shadow") == 0
    bodies = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert bodies[-1] == "sentinel", bodies
    return bodies[:-1]


def test_equal_weights_copy_every_request(gw: GatewayProcess, tmp_path: Path) -> None:
    via = tmp_path / "via.log"
    name, log = shadowed(gw, tmp_path, SHADOW_VIA=str(via))
    invoke_many(gw, name, 40)
    wait_until(lambda: metric(gw, "shipyard_invocations_total", name, "shadow") == 40, "copies")
    # The built-in runtime takes its copies together (POST /copies), never one by one.
    assert via.read_bytes().splitlines() == [b"copies"] * 40
    assert sorted(json.loads(line)["i"] for line in log.read_bytes().splitlines()) == list(
        range(40)
    )
    assert metric(gw, "shipyard_invocations_total", name, "prod") == 40
    assert metric(gw, "shipyard_model_latency_seconds_count", name, "shadow") == 40
    assert metric(gw, "shipyard_invocation_5xx_errors_total", name, "shadow") == 0
    assert metric(gw, "shipyard_shadow_copies_dropped_total", name, "shadow") == 0


def test_describe_endpoint_and_config_report_the_shadow(gw: GatewayProcess, tmp_path: Path) -> None:
    name, _ = shadowed(gw, tmp_path, weight=0.5)
    described = gw.sm.describe_endpoint(EndpointName=name)
    assert [v["VariantName"] for v in described["ProductionVariants"]] == ["prod"]
    (shadow,) = described["ShadowProductionVariants"]
    assert shadow["VariantName"] == "shadow"
    assert shadow["CurrentWeight"] == shadow["DesiredWeight"] == 0.5
    assert shadow["CurrentInstanceCount"] == shadow["DesiredInstanceCount"] == 1
    assert shadow["DeployedImages"][0]["SpecifiedImage"] == "shipyard/python"
    config = gw.sm.describe_endpoint_config(EndpointConfigName=name)
    assert [v["VariantName"] for v in config["ProductionVariants"]] == ["prod"]
    assert config["ShadowProductionVariants"] == [variant("shadow", f"{name}-shadow", 0.5)]


def test_shadow_instances_run_at_a_lower_cpu_priority(gw: GatewayProcess, tmp_path: Path) -> None:
    name, log = shadowed(gw, tmp_path)
    niceness = {}
    for pid in instance_pids(gw.process.pid):
        process = psutil.Process(pid)
        niceness[process.environ().get("SHADOW_LOG")] = process.nice()
    gateway = psutil.Process(gw.process.pid).nice()
    assert niceness[str(log)] == gateway + 10
    assert niceness[None] == gateway  # the production instances (echo models)


@needs_autogroups
def test_shadow_instances_lead_sessions_whose_groups_run_lower(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    # Each instance leads a session of its own, and the kernel shares the CPU between
    # sessions' groups: the shadow's process nice value alone would rank it only within
    # its own group.
    name, log = shadowed(gw, tmp_path)
    found = {}  # each instance's: shadows' (the other tests' too) at 10, others at 0
    for pid in instance_pids(gw.process.pid):
        assert autogroup.leads_session(pid)
        found[pid] = (psutil.Process(pid).environ().get("SHADOW_LOG"), autogroup.nice(pid))
    logs = {shadow_log for shadow_log, _ in found.values()}
    assert str(log) in logs and None in logs
    assert all(nice == (0 if shadow_log is None else 10) for shadow_log, nice in found.values()), (
        found
    )


def test_target_variant_cannot_name_the_shadow(gw: GatewayProcess, tmp_path: Path) -> None:
    name, log = shadowed(gw, tmp_path)
    with pytest.raises(ClientError) as err:
        gw.rt.invoke_endpoint(
            EndpointName=name, Body=b"{}", ContentType="application/json", TargetVariant="shadow"
        )
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "shadow variant" in err.value.response["Error"]["Message"]
    out = gw.rt.invoke_endpoint(
        EndpointName=name, Body=b"{}", ContentType="application/json", TargetVariant="prod"
    )
    assert out["InvokedProductionVariant"] == "prod"
    wait_until(lambda: lines(log) == 1, "the copy of the request to prod")


def test_half_weight_copies_about_half(gw: GatewayProcess, tmp_path: Path) -> None:
    name, log = shadowed(gw, tmp_path, weight=0.5)
    invoke_many(gw, name, 400)
    # Each request is copied with probability 0.5, whatever the time the shadow takes:
    # Binomial(400, 0.5) has mean 200 and standard deviation 10; five of them either
    # side fail one run in about 1.7 million.
    copied = copied_before_sentinel(gw, name, log)
    assert 150 <= len(copied) <= 250, len(copied)
    ids = [body["i"] for body in copied]
    assert len(set(ids)) == len(ids) and set(ids) <= set(range(400)), ids


def test_a_shadow_of_ones_own_server_gets_its_copies_one_by_one(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """A ``cmd:`` server knows only the container contract: its copies come as plain
    invocations (this one answers any POST 200, so a ``POST /copies`` sent to it would
    come back unreadable and count as 5xx)."""
    name = unique("own")
    prod = model(gw, f"{name}-prod", ECHO)
    server = MODELS / "cmd_headers" / "server.py"
    gw.sm.create_model(
        ModelName=f"{name}-shadow",
        PrimaryContainer={"Image": f"cmd:python {server}", "ModelDataUrl": ECHO},
        ExecutionRoleArn=ROLE,
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[variant("prod", prod)],
        ShadowProductionVariants=[variant("shadow", f"{name}-shadow")],
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gw, name)
    invoke_many(gw, name, 25)
    wait_until(lambda: metric(gw, "shipyard_invocations_total", name, "shadow") == 25, "copies")
    assert metric(gw, "shipyard_invocation_5xx_errors_total", name, "shadow") == 0
    assert metric(gw, "shipyard_model_latency_seconds_count", name, "shadow") == 25


def test_a_failing_shadow_never_fails_the_client(gw: GatewayProcess, tmp_path: Path) -> None:
    name, _ = shadowed(gw, tmp_path, SHADOW_FAIL="1")
    invoke_many(gw, name, 30)
    wait_until(
        lambda: metric(gw, "shipyard_invocation_5xx_errors_total", name, "shadow") == 30,
        "the shadow's errors in /metrics",
    )
    assert metric(gw, "shipyard_invocations_total", name, "shadow") == 30
    assert metric(gw, "shipyard_invocations_total", name, "prod") == 30
    assert metric(gw, "shipyard_invocation_5xx_errors_total", name, "prod") == 0
    assert metric(gw, "shipyard_invocation_4xx_errors_total", name, "prod") == 0


def test_the_shadow_weight_changes_in_place(gw: GatewayProcess, tmp_path: Path) -> None:
    """UpdateEndpointWeightsAndCapacities sets the share copied: weight 0, none."""
    name, log = shadowed(gw, tmp_path)
    gw.sm.update_endpoint_weights_and_capacities(
        EndpointName=name,
        DesiredWeightsAndCapacities=[{"VariantName": "shadow", "DesiredWeight": 0.0}],
    )
    wait_in_service(gw, name)
    (shadow,) = gw.sm.describe_endpoint(EndpointName=name)["ShadowProductionVariants"]
    assert shadow["DesiredWeight"] == 0.0
    invoke_many(gw, name, 20)
    assert copied_before_sentinel(gw, name, log) == []
    assert metric(gw, "shipyard_invocations_total", name, "prod") == 21


def test_update_endpoint_adds_and_removes_the_shadow(gw: GatewayProcess, tmp_path: Path) -> None:
    name, log = shadowed(gw, tmp_path)
    plain = f"{name}-plain"
    gw.sm.create_endpoint_config(
        EndpointConfigName=plain, ProductionVariants=[variant("prod", f"{name}-prod")]
    )
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=plain)
    wait_until(
        lambda: gw.sm.describe_endpoint(EndpointName=name)["EndpointConfigName"] == plain,
        "the update without the shadow",
    )
    wait_in_service(gw, name)
    assert "ShadowProductionVariants" not in gw.sm.describe_endpoint(EndpointName=name)
    invoke_many(gw, name, 10)
    gw.sm.update_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_until(
        lambda: gw.sm.describe_endpoint(EndpointName=name)["EndpointConfigName"] == name,
        "the update back to the shadow",
    )
    wait_in_service(gw, name)
    (shadow,) = gw.sm.describe_endpoint(EndpointName=name)["ShadowProductionVariants"]
    assert shadow["CurrentInstanceCount"] == 1
    invoke_many(gw, name, 10, start=100)
    # Only the requests sent while the shadow was there were copied.
    assert [body["i"] for body in copied_before_sentinel(gw, name, log)] == list(range(100, 110))


def test_a_slow_shadow_never_slows_the_client_and_extra_copies_are_dropped(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    slow = gateway_factory(extra_env={"SHIPYARD_SHADOW_MAX_PENDING_COPIES": "2"})
    name, log = shadowed(slow, tmp_path, SHADOW_SLEEP_S="2")
    latencies = invoke_many(slow, name, 20)
    # Each copy takes the shadow 2 s; the client's answers do not wait for them.
    assert max(latencies) < 1.0, latencies
    assert sum(latencies) < 2.0, latencies
    # Only 2 copies may be pending at once; the 20 answers came well within the 2 s the
    # first copy takes, so the other 18 were dropped and counted.
    dropped = metric(slow, "shipyard_shadow_copies_dropped_total", name, "shadow")
    assert dropped == 18
    wait_until(
        lambda: metric(slow, "shipyard_invocations_total", name, "shadow") == 2,
        "the two copies answered",
        timeout_s=15,
    )
    assert lines(log) == 2
    assert metric(slow, "shipyard_model_latency_seconds_sum", name, "shadow") >= 4.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["ShadowProductionVariants"].append(variant("s2", c["_shadow"])), "one shadow"),
        (lambda c: c["ProductionVariants"].append(variant("p2", c["_prod"])), "one production"),
        (lambda c: c["ShadowProductionVariants"][0].update(VariantName="prod"), "unique"),
        (lambda c: c["ShadowProductionVariants"][0].pop("InitialInstanceCount"), "Initial"),
        (lambda c: c["ShadowProductionVariants"][0].update(ModelName="nope"), "nope"),
        (
            lambda c: c["ShadowProductionVariants"][0].update(
                ServerlessConfig={"MemorySizeInMB": 1024, "MaxConcurrency": 1},
                InstanceType=None,
                InitialInstanceCount=None,
            ),
            "ServerlessConfig",
        ),
        (
            lambda c: c.update(
                AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": "file:///tmp/out"}}
            ),
            "AsyncInferenceConfig",
        ),
        (lambda c: c["ShadowProductionVariants"].clear(), "shadowProductionVariants"),
    ],
    ids=[
        "two-shadows",
        "two-production",
        "name-taken",
        "no-count",
        "unknown-model",
        "serverless",
        "async",
        "empty-list",
    ],
)
def test_bad_shadow_configs_are_validation_exceptions(
    gw: GatewayProcess, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    name = unique("bad")
    prod = model(gw, f"{name}-p", ECHO)
    shadow = model(gw, f"{name}-s", SHADOW)
    request: dict[str, Any] = {
        "EndpointConfigName": name,
        "ProductionVariants": [variant("prod", prod)],
        "ShadowProductionVariants": [variant("shadow", shadow)],
        "_prod": prod,
        "_shadow": shadow,
    }
    change(request)
    request = {k: _without_none(v) for k, v in request.items() if not k.startswith("_")}
    with pytest.raises(ClientError) as err:
        gw.client("sagemaker", config_validation=False).create_endpoint_config(**request)
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert message in err.value.response["Error"]["Message"]


def _without_none(value: Any) -> Any:
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value
