"""Inference components end to end, driven by boto3: an endpoint config without a model,
components packed onto its instances by their compute needs, invoked by name, scaled,
updated, deleted, refused when they cannot fit, and kept across a gateway restart."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, wait_in_service, wait_until
from tests.e2e.processes import instance_pids

ROLE = "arn:aws:iam::123456789012:role/x"


def component_endpoint(
    sm: Any, name: str, *, count: int = 2, managed: dict[str, Any] | None = None
) -> None:
    variant: dict[str, Any] = {
        "VariantName": "AllTraffic",
        "InstanceType": "ml.m5.large",  # 2 vCPUs, 8 GiB
        "InitialInstanceCount": count,
        "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
    }
    if managed:
        variant["ManagedInstanceScaling"] = managed
    sm.create_endpoint_config(
        EndpointConfigName=name, ExecutionRoleArn=ROLE, ProductionVariants=[variant]
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(sm, name)


def create_component(
    sm: Any,
    name: str,
    endpoint: str,
    *,
    copies: int,
    cpus: float = 1,
    memory_mb: int = 1024,
    model: str | None = None,
    container: dict[str, Any] | None = None,
) -> None:
    spec: dict[str, Any] = {
        "ComputeResourceRequirements": {
            "NumberOfCpuCoresRequired": cpus,
            "MinMemoryRequiredInMb": memory_mb,
        }
    }
    if model is not None:
        spec["ModelName"] = model
    if container is not None:
        spec["Container"] = container
    sm.create_inference_component(
        InferenceComponentName=name,
        EndpointName=endpoint,
        VariantName="AllTraffic",
        Specification=spec,
        RuntimeConfig={"CopyCount": copies},
    )


def wait_component(sm: Any, name: str, status: str = "InService", timeout_s: float = 90) -> Any:
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(sm.describe_inference_component(InferenceComponentName=name))
        if found["InferenceComponentStatus"] == "Failed" and status != "Failed":
            raise AssertionError(f"{name} failed: {found.get('FailureReason')}")
        return bool(found["InferenceComponentStatus"] == status)

    wait_until(reached, f"inference component {name} {status}", timeout_s=timeout_s)
    return found


def env_of(rt: Any, endpoint: str, component: str) -> dict[str, str]:
    out = rt.invoke_endpoint(
        EndpointName=endpoint, InferenceComponentName=component, Body=b"{}",
        ContentType="application/json",
    )  # fmt: skip
    assert out["InvokedProductionVariant"] == "AllTraffic"
    env: dict[str, str] = json.loads(out["Body"].read())
    return env


@pytest.fixture
def env_model(gateway: GatewayProcess, model_tarball: Callable[[str], str]) -> str:
    gateway.sm.create_model(
        ModelName="envdump",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("env_dump")},
        ExecutionRoleArn=ROLE,
    )
    return model_tarball("env_dump")


def test_components_are_packed_invoked_by_name_scaled_and_deleted(
    gateway: GatewayProcess, env_model: str
) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "shared")
    # 2 instances of 2 cores: a (1 core, 2 copies) and b (1 core, 2 copies) fill them.
    create_component(sm, "a", "shared", copies=2, memory_mb=2048, model="envdump")
    create_component(
        sm, "b", "shared", copies=2,
        container={"Image": "shipyard/python", "ArtifactUrl": env_model,
                   "Environment": {"WHO": "b"}},
    )  # fmt: skip
    a = wait_component(sm, "a")
    wait_component(sm, "b")
    assert a["RuntimeConfig"] == {"DesiredCopyCount": 2, "CurrentCopyCount": 2}
    assert a["Specification"]["ModelName"] == "envdump"
    assert a["EndpointName"] == "shared" and a["VariantName"] == "AllTraffic"
    b = sm.describe_inference_component(InferenceComponentName="b")
    assert b["Specification"]["Container"]["DeployedImage"]["SpecifiedImage"] == "shipyard/python"

    assert env_of(rt, "shared", "a")["SHIPYARD_INFERENCE_COMPONENT"] == "a"
    answered_b = env_of(rt, "shared", "b")
    assert answered_b["SHIPYARD_INFERENCE_COMPONENT"] == "b" and answered_b["WHO"] == "b"
    described = sm.describe_endpoint(EndpointName="shared")
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 2

    with pytest.raises(ClientError) as missing:
        rt.invoke_endpoint(EndpointName="shared", Body=b"{}")
    assert missing.value.response["Error"]["Code"] == "ValidationError"
    assert "Inference Component Name header is required" in str(missing.value)
    with pytest.raises(ClientError) as unknown:
        rt.invoke_endpoint(EndpointName="shared", InferenceComponentName="nope", Body=b"{}")
    assert unknown.value.response["Error"]["Code"] == "ValidationError"
    assert "nope" in str(unknown.value)

    # No core is left: c stays Creating, and says why.
    create_component(sm, "c", "shared", copies=1, model="envdump")
    wait_until(
        lambda: (
            "Insufficient capacity"
            in (
                sm.describe_inference_component(InferenceComponentName="c").get("FailureReason")
                or ""
            )
        ),
        "c refused for capacity",
    )
    assert (
        sm.describe_inference_component(InferenceComponentName="c")["InferenceComponentStatus"]
        == "Creating"
    )
    # One copy of a fewer makes room for it.
    sm.update_inference_component_runtime_config(
        InferenceComponentName="a", DesiredRuntimeConfig={"CopyCount": 1}
    )
    assert wait_component(sm, "a")["RuntimeConfig"]["CurrentCopyCount"] == 1
    wait_component(sm, "c")
    assert env_of(rt, "shared", "c")["SHIPYARD_INFERENCE_COMPONENT"] == "c"

    listed = sm.list_inference_components(EndpointNameEquals="shared", SortBy="Name",
                                          SortOrder="Ascending")["InferenceComponents"]  # fmt: skip
    assert [c["InferenceComponentName"] for c in listed] == ["a", "b", "c"]
    assert (
        sm.list_inference_components(NameContains="b")["InferenceComponents"][0][
            "InferenceComponentName"
        ]
        == "b"
    )

    sm.delete_inference_component(InferenceComponentName="c")

    def gone() -> bool:
        try:
            sm.describe_inference_component(InferenceComponentName="c")
        except ClientError as exc:
            assert "Could not find inference component" in str(exc)
            return True
        return False

    wait_until(gone, "c deleted")
    with pytest.raises(ClientError):
        rt.invoke_endpoint(EndpointName="shared", InferenceComponentName="c", Body=b"{}")


def test_a_new_specification_replaces_copies_without_failing_requests(
    gateway: GatewayProcess, env_model: str
) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "rolling", count=1)
    container = {"Image": "shipyard/python", "ArtifactUrl": env_model,
                 "Environment": {"VERSION": "1"}}  # fmt: skip
    create_component(sm, "m", "rolling", copies=1, cpus=0.5, container=container)
    wait_component(sm, "m")
    errors: list[Exception] = []
    versions: set[str] = set()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                versions.add(env_of(rt, "rolling", "m")["VERSION"])
            except Exception as exc:  # every failure counts
                errors.append(exc)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        sm.update_inference_component(
            InferenceComponentName="m",
            Specification={
                "Container": {**container, "Environment": {"VERSION": "2"}},
                "ComputeResourceRequirements": {
                    "NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 1024,
                },
            },
        )  # fmt: skip
        assert (
            sm.describe_inference_component(InferenceComponentName="m")["InferenceComponentStatus"]
            == "Updating"
        )
        wait_component(sm, "m")
        wait_until(lambda: "2" in versions, "the new specification answering")
    finally:
        stop.set()
        worker.join(timeout=30)
    assert errors == []
    assert env_of(rt, "rolling", "m")["VERSION"] == "2"
    # The same specification again (a stack file applied twice) replaces nothing.
    before = sm.describe_inference_component(InferenceComponentName="m")
    sm.update_inference_component(
        InferenceComponentName="m",
        Specification={
            "Container": {**container, "Environment": {"VERSION": "2"}},
            "ComputeResourceRequirements": {
                "NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 1024,
            },
        },
    )  # fmt: skip
    after = sm.describe_inference_component(InferenceComponentName="m")
    assert after["InferenceComponentStatus"] == "InService"
    assert after["LastModifiedTime"] == before["LastModifiedTime"]


def test_a_specification_that_fails_to_start_is_tried_once(
    gateway: GatewayProcess, env_model: str, model_tarball: Callable[[str], str]
) -> None:
    """Its copies fail to load: the previous copies serve on, Describe shows the
    specification they run (Describe shows a new one, InService, only once it serves) with
    the failure recorded, and no more copies of it are started until it is sent again."""
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "tried", count=1)
    container = {"Image": "shipyard/python", "ArtifactUrl": env_model}
    create_component(sm, "t", "tried", copies=1, cpus=0.5, container=container)
    wait_component(sm, "t")
    needs = {"NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 1024}
    broken = {"Image": "shipyard/python", "ArtifactUrl": model_tarball("load_fails")}
    sm.update_inference_component(
        InferenceComponentName="t",
        Specification={"Container": broken, "ComputeResourceRequirements": needs},
    )
    wait_until(
        lambda: (
            "failed"
            in (
                sm.describe_inference_component(InferenceComponentName="t").get("FailureReason")
                or ""
            )
        ),
        "the failed update recorded",
    )
    first = sm.describe_inference_component(InferenceComponentName="t")
    assert first["InferenceComponentStatus"] == "InService"
    assert first["Specification"]["Container"]["ArtifactUrl"] == env_model  # rolled back
    started = len(instance_pids(gateway.process.pid))
    time.sleep(2)  # a loop would have started more copies and rewritten the reason by now
    again = sm.describe_inference_component(InferenceComponentName="t")
    assert again["FailureReason"] == first["FailureReason"]
    assert again["LastModifiedTime"] == first["LastModifiedTime"]
    assert len(instance_pids(gateway.process.pid)) <= started  # none started since
    assert "SHIPYARD_INSTANCE_ID" in env_of(rt, "tried", "t")  # the previous copy serves
    # The specification serving, sent again, replaces nothing.
    sm.update_inference_component(
        InferenceComponentName="t",
        Specification={"Container": container, "ComputeResourceRequirements": needs},
    )
    same = sm.describe_inference_component(InferenceComponentName="t")
    assert same["LastModifiedTime"] == first["LastModifiedTime"]
    # The failed one sent again is tried again, and rolled back again.
    sm.update_inference_component(
        InferenceComponentName="t",
        Specification={"Container": broken, "ComputeResourceRequirements": needs},
    )
    retried = sm.describe_inference_component(InferenceComponentName="t")
    assert retried["Specification"]["Container"]["ArtifactUrl"] == broken["ArtifactUrl"]

    def rolled_back_again() -> bool:
        now = sm.describe_inference_component(InferenceComponentName="t")
        return bool(
            now["InferenceComponentStatus"] == "InService"
            and now["Specification"]["Container"]["ArtifactUrl"] == env_model
            and now["LastModifiedTime"] > retried["LastModifiedTime"]
        )

    wait_until(rolled_back_again, "the failed specification tried again and rolled back")
    assert "SHIPYARD_INSTANCE_ID" in env_of(rt, "tried", "t")
    # A new specification is tried again.
    sm.update_inference_component(
        InferenceComponentName="t",
        Specification={"Container": {**container, "Environment": {"V": "2"}},
                       "ComputeResourceRequirements": needs},
    )  # fmt: skip
    wait_until(lambda: env_of(rt, "tried", "t").get("V") == "2", "the new specification")


def test_managed_instance_scaling_grows_and_shrinks_the_variant(
    gateway: GatewayProcess, env_model: str
) -> None:
    sm = gateway.sm
    component_endpoint(
        sm, "elastic", count=1,
        managed={"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 3},
    )  # fmt: skip
    create_component(sm, "big", "elastic", copies=2, cpus=2, model="envdump")
    wait_component(sm, "big")

    def instances() -> int:
        described = sm.describe_endpoint(EndpointName="elastic")
        return int(described["ProductionVariants"][0]["CurrentInstanceCount"])

    assert instances() == 2  # one 2-core copy per instance
    (variant,) = sm.describe_endpoint(EndpointName="elastic")["ProductionVariants"]
    assert variant["ManagedInstanceScaling"] == {
        "Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 3,
    }  # fmt: skip
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    sm.update_inference_component_runtime_config(
        InferenceComponentName="big", DesiredRuntimeConfig={"CopyCount": 1}
    )
    wait_until(lambda: instances() == 1, "the empty instance released")
    # Past MaxInstanceCount: 4 copies of 2 cores need 4 instances, 3 may be had.
    sm.update_inference_component_runtime_config(
        InferenceComponentName="big", DesiredRuntimeConfig={"CopyCount": 4}
    )
    wait_until(
        lambda: "MaxInstanceCount (3)"
        in (sm.describe_inference_component(InferenceComponentName="big").get("FailureReason")
            or ""),
        "the fourth copy refused",
    )  # fmt: skip
    assert instances() == 3
    assert (
        sm.describe_inference_component(InferenceComponentName="big")["RuntimeConfig"][
            "CurrentCopyCount"
        ]
        == 3
    )


def test_bad_inputs_are_refused_with_validation_errors(
    gateway: GatewayProcess, env_model: str, model_tarball: Callable[[str], str]
) -> None:
    sm, rt = gateway.sm, gateway.rt
    deploy(sm, "plain", model_tarball("echo"))
    component_endpoint(sm, "hosts", count=1)

    def refused(call: Callable[[], object], words: str) -> None:
        with pytest.raises(ClientError) as error:
            call()
        assert error.value.response["Error"]["Code"] == "ValidationException", error.value
        assert words in str(error.value), error.value

    refused(
        lambda: create_component(sm, "x", "plain", copies=1, model="envdump"),
        "inference components need an endpoint whose production variants name no ModelName",
    )
    refused(
        lambda: create_component(sm, "x", "hosts", copies=1, cpus=4, model="envdump"),
        "an instance of ml.m5.large has 2 cores",
    )
    refused(
        lambda: create_component(sm, "x", "hosts", copies=1, model="missing"),
        'Could not find model "arn:aws:sagemaker:',
    )
    refused(
        lambda: create_component(sm, "x", "nowhere", copies=1, model="envdump"),
        "Could not find endpoint",
    )
    refused(
        lambda: sm.create_endpoint_config(
            EndpointConfigName="norole",
            ProductionVariants=[
                {"VariantName": "v", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}
            ],
        ),  # fmt: skip
        "ExecutionRoleArn is required",
    )
    refused(
        lambda: sm.create_endpoint_config(
            EndpointConfigName="mixed",
            ExecutionRoleArn=ROLE,
            ProductionVariants=[
                {"VariantName": "v", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1},
                {
                    "VariantName": "w",
                    "ModelName": "envdump",
                    "InstanceType": "ml.m5.large",
                    "InitialInstanceCount": 1,
                },
            ],
        ),  # fmt: skip
        "must leave out ModelName",
    )
    refused(
        lambda: sm.update_inference_component_runtime_config(
            InferenceComponentName="ghost", DesiredRuntimeConfig={"CopyCount": 1}
        ),
        "Could not find inference component",
    )
    with pytest.raises(ClientError) as not_hosting:
        rt.invoke_endpoint(EndpointName="plain", InferenceComponentName="a", Body=b"x")
    assert not_hosting.value.response["Error"]["Code"] == "ValidationError"
    assert "not allowed for endpoints" in str(not_hosting.value)
    # An update that would leave a component no variant to run on.
    create_component(sm, "kept", "hosts", copies=0, model="envdump")
    refused(
        lambda: sm.update_endpoint(EndpointName="hosts", EndpointConfigName="plain"),
        "Delete the inference components first",
    )


def test_a_restarted_gateway_brings_components_back(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    first = gateway_factory()
    home = first.home
    first.sm.create_model(
        ModelName="envdump",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("env_dump")},
        ExecutionRoleArn=ROLE,
    )
    component_endpoint(first.sm, "kept", count=1)
    create_component(first.sm, "k", "kept", copies=2, cpus=0.5, model="envdump")
    wait_component(first.sm, "k")
    first.stop()

    second = gateway_factory(home=home)
    started = time.monotonic()
    k = wait_component(second.sm, "k")
    wait_until(
        lambda: (
            second.sm.describe_inference_component(InferenceComponentName="k")["RuntimeConfig"][
                "CurrentCopyCount"
            ]
            == 2
        ),
        "both copies back",
    )
    assert k["RuntimeConfig"]["DesiredCopyCount"] == 2
    assert env_of(second.rt, "kept", "k")["SHIPYARD_INFERENCE_COMPONENT"] == "k"
    assert time.monotonic() - started < 90


COPIES = "sagemaker:inference-component:DesiredCopyCount"


def _track_concurrency(aas: Any, resource: str) -> None:
    """A target-tracking policy: one request in flight per copy, no cooldowns."""
    aas.put_scaling_policy(
        PolicyName="p", ServiceNamespace="sagemaker", ResourceId=resource,
        ScalableDimension=COPIES, PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": 1.0, "ScaleOutCooldown": 0, "ScaleInCooldown": 0,
            "PredefinedMetricSpecification": {"PredefinedMetricType":
                "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}},
    )  # fmt: skip


def test_copies_follow_a_target_tracking_policy_without_failing_a_request(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(
        extra_env={"SHIPYARD_AUTOSCALING_PERIOD_S": "0.3", "SHIPYARD_AUTOSCALING_WINDOW_S": "3"}
    )
    sm, rt = gw.sm, gw.rt
    aas = gw.client("application-autoscaling")
    sm.create_model(
        ModelName="sleepy",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("sleepy")},
        ExecutionRoleArn=ROLE,
    )
    component_endpoint(sm, "tracked", count=1)
    create_component(sm, "auto", "tracked", copies=1, cpus=0.25, memory_mb=256, model="sleepy")
    wait_component(sm, "auto")
    resource = "inference-component/auto"
    with pytest.raises(ClientError) as mismatched:
        aas.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId=resource, MinCapacity=1, MaxCapacity=3,
            ScalableDimension="sagemaker:variant:DesiredInstanceCount",
        )  # fmt: skip
    assert "does not go with resource ID" in str(mismatched.value)
    with pytest.raises(ClientError) as unknown:
        aas.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId="inference-component/nope",
            ScalableDimension=COPIES, MinCapacity=1, MaxCapacity=3,
        )  # fmt: skip
    assert 'could not find inference component "nope"' in str(unknown.value)
    aas.register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=resource, ScalableDimension=COPIES,
        MinCapacity=1, MaxCapacity=3,
    )  # fmt: skip
    # ScalableDimension filters what is described; MaxResults is held to 1-50.
    listed = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ScalableDimension=COPIES)
    assert [t["ResourceId"] for t in listed["ScalableTargets"]] == [resource]
    variants = aas.describe_scalable_targets(
        ServiceNamespace="sagemaker", ScalableDimension="sagemaker:variant:DesiredInstanceCount"
    )
    assert variants["ScalableTargets"] == []
    with pytest.raises(ClientError) as too_many:
        aas.describe_scalable_targets(ServiceNamespace="sagemaker", MaxResults=51)
    assert "between 1 and 50" in str(too_many.value)
    with pytest.raises(ClientError) as wrong_metric:
        aas.put_scaling_policy(
            PolicyName="p", ServiceNamespace="sagemaker", ResourceId=resource,
            ScalableDimension=COPIES, PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={"TargetValue": 1.0,
                "PredefinedMetricSpecification": {
                    "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}},
        )  # fmt: skip
    assert "not supported for sagemaker:inference-component:DesiredCopyCount" in str(
        wrong_metric.value
    )
    _track_concurrency(aas, resource)

    def copies() -> int:
        described = sm.describe_inference_component(InferenceComponentName="auto")
        return int(described["RuntimeConfig"]["DesiredCopyCount"])

    errors: list[Exception] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                rt.invoke_endpoint(
                    EndpointName="tracked", InferenceComponentName="auto",
                    Body=json.dumps({"sleep": 0.2}), ContentType="application/json",
                )  # fmt: skip
            except Exception as exc:  # every failure counts
                errors.append(exc)

    clients = [threading.Thread(target=client) for _ in range(3)]
    for thread in clients:
        thread.start()
    try:
        wait_until(lambda: copies() == 3, "three copies under three clients", timeout_s=60)
        wait_component(sm, "auto")
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=30)
    assert errors == []
    wait_until(lambda: copies() == 1, "back to one copy once idle", timeout_s=60)
    described = aas.describe_scaling_activities(ServiceNamespace="sagemaker", ResourceId=resource)
    activities = described["ScalingActivities"]
    assert any(
        a["StatusCode"] == "Successful" and "desired copy count to 3" in a["Description"]
        for a in activities
    ), activities
    assert all(a["ScalableDimension"] == COPIES for a in activities)


def test_a_component_at_zero_copies_answers_its_next_request(
    gateway: GatewayProcess, env_model: str
) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "sleeper", count=1)
    create_component(sm, "idle", "sleeper", copies=0, model="envdump")
    described = wait_component(sm, "idle")
    assert described["RuntimeConfig"] == {"DesiredCopyCount": 0, "CurrentCopyCount": 0}
    # Held, not refused: the request starts a copy and waits for it.
    assert env_of(rt, "sleeper", "idle")["SHIPYARD_INFERENCE_COMPONENT"] == "idle"
    assert wait_component(sm, "idle")["RuntimeConfig"] == {
        "DesiredCopyCount": 1,
        "CurrentCopyCount": 1,
    }
    # Back to zero, and again: several requests at once share the one copy started.
    sm.update_inference_component_runtime_config(
        InferenceComponentName="idle", DesiredRuntimeConfig={"CopyCount": 0}
    )
    wait_until(
        lambda: wait_component(sm, "idle")["RuntimeConfig"]["CurrentCopyCount"] == 0,
        "no copy left",
    )
    answers: list[str] = []
    errors: list[Exception] = []

    def one() -> None:
        try:
            answers.append(env_of(rt, "sleeper", "idle")["SHIPYARD_INFERENCE_COMPONENT"])
        except Exception as exc:  # every failure counts
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and answers == ["idle"] * 4
    assert wait_component(sm, "idle")["RuntimeConfig"]["DesiredCopyCount"] == 1


def test_an_endpoint_update_keeps_its_components_serving(
    gateway: GatewayProcess, env_model: str
) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "moving", count=1)
    create_component(sm, "stays", "moving", copies=1, cpus=1.5, model="envdump")
    wait_component(sm, "stays")
    pid = env_of(rt, "moving", "stays")["SHIPYARD_INSTANCE_ID"]
    sm.create_endpoint_config(
        EndpointConfigName="moving-2", ExecutionRoleArn=ROLE,
        ProductionVariants=[{"VariantName": "AllTraffic", "InstanceType": "ml.m5.large",
                             "InitialInstanceCount": 2}],
    )  # fmt: skip
    errors: list[Exception] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                env_of(rt, "moving", "stays")
            except Exception as exc:  # every failure counts
                errors.append(exc)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        sm.update_endpoint(EndpointName="moving", EndpointConfigName="moving-2")
        wait_in_service(sm, "moving")
        # The new config's second instance makes room for a second 1.5-core copy.
        sm.update_inference_component_runtime_config(
            InferenceComponentName="stays", DesiredRuntimeConfig={"CopyCount": 2}
        )
        wait_until(
            lambda: wait_component(sm, "stays")["RuntimeConfig"]["CurrentCopyCount"] == 2,
            "two copies on two instances",
        )
    finally:
        stop.set()
        worker.join(timeout=30)
    assert errors == []
    described = sm.describe_endpoint(EndpointName="moving")
    assert described["EndpointConfigName"] == "moving-2"
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    # The copy that served before the update still serves after it.
    seen = {env_of(rt, "moving", "stays")["SHIPYARD_INSTANCE_ID"] for _ in range(20)}
    assert pid in seen
    # A weight change on a variant of components settles, and leaves the copies alone.
    sm.update_endpoint_weights_and_capacities(
        EndpointName="moving",
        DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic", "DesiredWeight": 2.0}],
    )
    wait_in_service(sm, "moving")
    assert wait_component(sm, "stays")["RuntimeConfig"]["CurrentCopyCount"] == 2


def test_copies_past_the_capacity_are_taken_back_in_by_their_policy(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    """More copies asked than fit: the component stays Updating, short of capacity, and
    its policy still takes it back in once idle, rather than leaving it stuck there."""
    gw = gateway_factory(
        extra_env={"SHIPYARD_AUTOSCALING_PERIOD_S": "0.3", "SHIPYARD_AUTOSCALING_WINDOW_S": "3"}
    )
    sm, aas = gw.sm, gw.client("application-autoscaling")
    sm.create_model(
        ModelName="echo",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("echo")},
        ExecutionRoleArn=ROLE,
    )
    component_endpoint(sm, "full", count=1)  # 2 cores: four copies of half a core
    create_component(sm, "wide", "full", copies=1, cpus=0.5, memory_mb=256, model="echo")
    wait_component(sm, "wide")
    sm.update_inference_component_runtime_config(
        InferenceComponentName="wide", DesiredRuntimeConfig={"CopyCount": 6}
    )
    wait_until(
        lambda: (
            "Insufficient capacity"
            in (
                sm.describe_inference_component(InferenceComponentName="wide").get("FailureReason")
                or ""
            )
        ),
        "the copies short of capacity",
    )
    resource = "inference-component/wide"
    aas.register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=resource, ScalableDimension=COPIES,
        MinCapacity=1, MaxCapacity=6,
    )  # fmt: skip
    _track_concurrency(aas, resource)
    described = wait_component(sm, "wide", timeout_s=60)
    assert described["RuntimeConfig"]["DesiredCopyCount"] <= 4
