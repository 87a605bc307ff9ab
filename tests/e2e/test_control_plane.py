"""The SageMaker control plane, driven by boto3 against a real gateway."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, WaiterError

from tests.conftest import GatewayProcess, deploy, unique, wait_until
from tests.e2e.processes import instance_pids


def _code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


def _raw(gw: GatewayProcess, target: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/x-amz-json-1.1"}
    if target:
        headers["X-Amz-Target"] = target
    req = urllib.request.Request(gw.url + "/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_model_lifecycle_with_sagemaker_shapes(gateway: GatewayProcess) -> None:
    sm = gateway.sm
    arn = sm.create_model(
        ModelName="My-Model",
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": "file:///nowhere",
            "Environment": {"A": "1"},
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )["ModelArn"]
    assert arn == "arn:aws:sagemaker:us-east-1:000000000000:model/my-model"
    described = sm.describe_model(ModelName="My-Model")
    assert described["PrimaryContainer"]["Environment"] == {"A": "1"}
    assert described["CreationTime"].tzinfo is not None
    with pytest.raises(ClientError) as err:
        sm.create_model(ModelName="My-Model", PrimaryContainer={"Image": "shipyard/python"})
    assert _code(err) == "ValidationException"
    assert (
        err.value.response["Error"]["Message"] == f'Cannot create already existing model "{arn}".'
    )
    sm.delete_model(ModelName="My-Model")
    with pytest.raises(ClientError) as err:
        sm.describe_model(ModelName="My-Model")
    assert _code(err) == "ValidationException"
    assert 'Could not find model "My-Model".' in str(err.value)


def test_names_differing_only_in_case_are_one_name(gateway: GatewayProcess) -> None:
    """SageMaker's names are unique whatever their case (its ARNs are lower-case): a
    second create spelt otherwise is refused, so no two resources share an ARN or tags."""
    sm = gateway.sm
    base = unique("Case")
    container = {"Image": "shipyard/python", "ModelDataUrl": "file:///nowhere"}
    arn = sm.create_model(ModelName=base, PrimaryContainer=container)["ModelArn"]
    with pytest.raises(ClientError) as err:
        sm.create_model(ModelName=base.lower(), PrimaryContainer=container)
    assert _code(err) == "ValidationException"
    assert err.value.response["Error"]["Message"] == (
        f'Cannot create already existing model "{arn}".'
    )
    variant = {"VariantName": "v1", "ModelName": base, "InitialInstanceCount": 1,
               "InstanceType": "ml.m5.large"}  # fmt: skip
    sm.create_endpoint_config(EndpointConfigName=base, ProductionVariants=[variant])
    with pytest.raises(ClientError) as err:
        sm.create_endpoint_config(EndpointConfigName=base.upper(), ProductionVariants=[variant])
    assert "already existing endpoint configuration" in str(err.value)
    sm.create_endpoint(EndpointName=base, EndpointConfigName=base)
    with pytest.raises(ClientError) as err:
        sm.create_endpoint(EndpointName=base.lower(), EndpointConfigName=base)
    assert "already existing endpoint" in str(err.value)
    sm.delete_endpoint(EndpointName=base)
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "team", "Value": "a"}])
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "a"}]
    sm.delete_endpoint_config(EndpointConfigName=base)
    sm.delete_model(ModelName=base)
    # Gone, the name is free again in any case.
    sm.create_model(ModelName=base.upper(), PrimaryContainer=container)
    sm.delete_model(ModelName=base.upper())


def test_list_pages_filters_and_sorts(gateway: GatewayProcess) -> None:
    sm = gateway.sm
    for i in range(5):
        sm.create_model(ModelName=f"alpha-{i}", PrimaryContainer={"Image": "shipyard/python"})
    sm.create_model(ModelName="beta-0", PrimaryContainer={"Image": "shipyard/python"})
    first = sm.list_models(MaxResults=2, SortBy="Name", SortOrder="Ascending")
    assert [m["ModelName"] for m in first["Models"]] == ["alpha-0", "alpha-1"]
    names = [
        m["ModelName"]
        for page in sm.get_paginator("list_models").paginate(
            NameContains="alpha",
            SortBy="Name",
            SortOrder="Descending",
            PaginationConfig={"PageSize": 2},
        )
        for m in page["Models"]
    ]
    assert names == ["alpha-4", "alpha-3", "alpha-2", "alpha-1", "alpha-0"]
    with pytest.raises(ClientError) as err:
        sm.list_models(NextToken="garbage")
    assert _code(err) == "ValidationException"


def test_a_page_goes_on_after_the_last_item_it_listed(gateway: GatewayProcess) -> None:
    """Items deleted or created between two pages neither skip nor repeat others: a
    token names where its page ended, and only for the list it came from."""
    sm = gateway.sm
    stem = unique("pg")
    for i in range(8):
        sm.create_model(ModelName=f"{stem}-{i}", PrimaryContainer={"Image": "shipyard/python"})
    asked = {"NameContains": stem, "SortBy": "Name", "SortOrder": "Ascending", "MaxResults": 3}
    first = sm.list_models(**asked)
    assert [m["ModelName"] for m in first["Models"]] == [f"{stem}-{i}" for i in range(3)]
    sm.delete_model(ModelName=f"{stem}-0")
    sm.delete_model(ModelName=f"{stem}-1")
    sm.create_model(ModelName=f"{stem}-00", PrimaryContainer={"Image": "shipyard/python"})
    second = sm.list_models(**asked, NextToken=first["NextToken"])
    assert [m["ModelName"] for m in second["Models"]] == [f"{stem}-{i}" for i in range(3, 6)]
    with pytest.raises(ClientError) as err:  # another list's token
        sm.list_endpoint_configs(NameContains=stem, SortBy="Name", SortOrder="Ascending",
                                 NextToken=first["NextToken"])  # fmt: skip
    assert _code(err) == "ValidationException"
    with pytest.raises(ClientError) as err:  # the same list, other filters
        sm.list_models(**{**asked, "NameContains": "other"}, NextToken=first["NextToken"])
    assert _code(err) == "ValidationException"


def test_endpoint_config_validates_models_and_limits(gateway: GatewayProcess) -> None:
    sm = gateway.sm
    variant = {
        "VariantName": "v1",
        "ModelName": "absent",
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }
    with pytest.raises(ClientError) as err:
        sm.create_endpoint_config(EndpointConfigName="c", ProductionVariants=[variant])
    assert _code(err) == "ValidationException" and "Could not find model" in str(err.value)
    sm.create_model(ModelName="m", PrimaryContainer={"Image": "shipyard/python"})
    with pytest.raises(ClientError) as err:
        sm.create_endpoint_config(
            EndpointConfigName="c",
            ProductionVariants=[{**variant, "ModelName": "m", "InitialInstanceCount": 1000}],
        )
    assert _code(err) == "ResourceLimitExceeded"
    with pytest.raises(ClientError) as err:  # a maximum boto3 does not check client-side
        sm.create_endpoint_config(
            EndpointConfigName="c" * 64, ProductionVariants=[{**variant, "ModelName": "m"}]
        )
    assert _code(err) == "ValidationException"
    sm.create_endpoint_config(
        EndpointConfigName="c",
        ProductionVariants=[
            {
                **variant,
                "ModelName": "m",
                "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
            }
        ],
    )
    described = sm.describe_endpoint_config(EndpointConfigName="c")
    assert described["ProductionVariants"][0]["RoutingConfig"] == {
        "RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"
    }
    assert described["ProductionVariants"][0]["InitialVariantWeight"] == 1.0
    with pytest.raises(ClientError) as err:
        sm.create_endpoint_config(
            EndpointConfigName="c", ProductionVariants=[{**variant, "ModelName": "m"}]
        )
    assert _code(err) == "ValidationException"
    assert "Cannot create already existing endpoint configuration" in str(err.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"InstancePools": [{"InstanceType": "ml.m5.large", "Priority": 1}]},
        {"VariantInstanceProvisionTimeoutInSeconds": 600},
    ],
    ids=["instance-pools", "provision-timeout"],
)
@pytest.mark.parametrize("key", ["ProductionVariants", "ShadowProductionVariants"])
def test_variant_fields_this_gateway_cannot_honour_are_refused_by_name(
    gateway: GatewayProcess, extra: dict[str, Any], key: str
) -> None:
    """botocore's model has them (capacity-aware instance pools); accepting them and then
    doing otherwise would be worse than saying so."""
    sm = gateway.sm
    name = unique("pools")
    sm.create_model(ModelName=name, PrimaryContainer={"Image": "shipyard/python"})
    variant = {
        "VariantName": "v1",
        "ModelName": name,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }
    variants = {"ProductionVariants": [{**variant, **extra}]}
    if key == "ShadowProductionVariants":
        variants = {
            "ProductionVariants": [variant],
            key: [{**variant, "VariantName": "s", **extra}],
        }
    with pytest.raises(ClientError) as err:
        sm.create_endpoint_config(EndpointConfigName=name, **variants)
    assert _code(err) == "ValidationException"
    (field,) = extra
    assert f"{field} is not supported" in str(err.value)
    with pytest.raises(ClientError) as err:
        sm.describe_endpoint_config(EndpointConfigName=name)
    assert _code(err) == "ValidationException"


def test_bad_requests_get_aws_errors_and_the_gateway_stays_up(gateway: GatewayProcess) -> None:
    status, body = _raw(gateway, "SageMaker.CreateModel", b"{not json")
    assert status == 400 and body["__type"] == "SerializationException"
    status, body = _raw(gateway, "SageMaker.LaunchRockets", b"{}")
    assert status == 400 and body["__type"] == "UnknownOperationException"
    status, body = _raw(gateway, None, b"{}")
    assert status == 400 and body["__type"] == "UnknownOperationException"
    status, body = _raw(gateway, "SageMaker.CreateModel", b"[1, 2]")
    assert status == 400 and body["__type"] == "SerializationException"
    status, body = _raw(gateway, "SageMaker.CreateEndpoint", b"{}")
    assert status == 400 and body["__type"] == "ValidationException"
    assert "Member must not be null" in body["message"]
    with pytest.raises(ClientError) as err:
        gateway.sm.describe_endpoint(EndpointName="nope")
    assert _code(err) == "ValidationException"
    assert 'Could not find endpoint "nope".' in str(err.value)
    assert gateway.get("/healthz")[0] == 200


def test_create_describe_list_delete_endpoint(gateway: GatewayProcess, model_tarball: Any) -> None:
    sm = gateway.sm
    name = unique("ep")
    deploy(sm, name, model_tarball("echo"), count=2)
    described = sm.describe_endpoint(EndpointName=name)
    assert described["EndpointStatus"] == "InService"
    variant = described["ProductionVariants"][0]
    assert variant["CurrentInstanceCount"] == 2 and variant["DesiredInstanceCount"] == 2
    assert variant["DeployedImages"][0]["SpecifiedImage"] == "shipyard/python"
    assert variant["RoutingConfig"] == {"RoutingStrategy": "RANDOM"}  # SageMaker's default
    listed = sm.list_endpoints(StatusEquals="InService", NameContains=name[:6])["Endpoints"]
    assert [e["EndpointName"] for e in listed] == [name]
    with pytest.raises(ClientError) as err:
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    assert _code(err) == "ValidationException"
    assert "Cannot create already existing endpoint" in str(err.value)
    sm.delete_endpoint(EndpointName=name)
    sm.get_waiter("endpoint_deleted").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
    )
    assert sm.list_endpoints()["Endpoints"] == []


def test_endpoint_with_missing_config_is_refused(gateway: GatewayProcess) -> None:
    with pytest.raises(ClientError) as err:
        gateway.sm.create_endpoint(EndpointName="e", EndpointConfigName="nope")
    assert _code(err) == "ValidationException"
    assert "Could not find endpoint configuration" in str(err.value)


def test_model_whose_model_fn_fails_fails_the_endpoint(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    sm = gateway.sm
    deploy(sm, "broken", model_tarball("load_fails"), wait=False)
    with pytest.raises(WaiterError):
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="broken", WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
        )
    described = sm.describe_endpoint(EndpointName="broken")
    assert described["EndpointStatus"] == "Failed"
    assert "weights missing" in described["FailureReason"]
    assert gateway.get("/healthz")[0] == 200


def test_container_images_need_an_engine(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any, tmp_path: Path
) -> None:
    gateway = gateway_factory(extra_env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    sm = gateway.sm
    deploy(
        sm,
        "docker",
        model_tarball("echo"),
        image="123.dkr.ecr.us-east-1.amazonaws.com/x:1",
        wait=False,
    )
    with pytest.raises(WaiterError):
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName="docker", WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )
    reason = sm.describe_endpoint(EndpointName="docker")["FailureReason"]
    assert f"No container engine answers at unix://{tmp_path}/none.sock" in reason
    assert "podman system service" in reason


def test_responses_carry_a_request_id(gateway: GatewayProcess) -> None:
    out = gateway.sm.list_endpoints()
    assert len(out["ResponseMetadata"]["RequestId"]) == 36
    with pytest.raises(ClientError) as err:
        gateway.sm.describe_model(ModelName="nope")
    assert len(err.value.response["ResponseMetadata"]["RequestId"]) == 36


def test_endpoint_is_described_after_its_config_and_model_are_deleted(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    sm = gateway.sm
    deploy(sm, "orphan", model_tarball("echo"))
    sm.delete_endpoint_config(EndpointConfigName="orphan")
    sm.delete_model(ModelName="orphan")
    described = sm.describe_endpoint(EndpointName="orphan")
    assert described["EndpointStatus"] == "InService"
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 1
    images = described["ProductionVariants"][0]["DeployedImages"]  # what it runs
    assert images[0]["SpecifiedImage"] == "shipyard/python"


def test_an_endpoint_whose_config_and_model_were_deleted_scales_and_survives_a_restart(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any, tmp_path: Path
) -> None:
    """They were gone from the store: the endpoint could not be scaled, and a restart
    left it Failed ("Could not find endpoint configuration")."""
    home = tmp_path / "home"
    gw = gateway_factory(home=home)
    sm = gw.sm
    deploy(sm, "kept", model_tarball("echo"))
    sm.delete_endpoint_config(EndpointConfigName="kept")
    sm.delete_model(ModelName="kept")
    for gone in (
        lambda: sm.describe_endpoint_config(EndpointConfigName="kept"),
        lambda: sm.describe_model(ModelName="kept"),
    ):
        with pytest.raises(ClientError) as err:
            gone()
        assert _code(err) == "ValidationException"
    sm.update_endpoint_weights_and_capacities(
        EndpointName="kept",
        DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredInstanceCount": 2}],
    )
    wait_until(
        lambda: (
            sm.describe_endpoint(EndpointName="kept")["ProductionVariants"][0].get(
                "CurrentInstanceCount"
            )
            == 2
        ),
        "scaled to two instances",
    )
    # A new model and config under the names take nothing from the endpoint.
    sm.create_model(ModelName="kept", PrimaryContainer={"Image": "shipyard/python",
                    "ModelDataUrl": model_tarball("sleepy")})  # fmt: skip
    sm.create_endpoint_config(
        EndpointConfigName="kept",
        ProductionVariants=[{"VariantName": "other", "ModelName": "kept",
                             "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}],
    )  # fmt: skip
    gw.stop()
    gw = gateway_factory(home=home)
    wait_until(
        lambda: gw.sm.describe_endpoint(EndpointName="kept")["EndpointStatus"] == "InService",
        "in service again after the restart",
    )
    described = gw.sm.describe_endpoint(EndpointName="kept")
    assert described["EndpointConfigName"] == "kept"
    assert described["ProductionVariants"][0]["DesiredInstanceCount"] == 2

    def answered() -> bool:
        try:
            answer = gw.rt.invoke_endpoint(
                EndpointName="kept", Body=b'{"a": 1}', ContentType="application/json"
            )
        except ClientError as exc:  # its instances still starting: ModelNotReady
            assert exc.response["Error"]["Code"] == "ModelNotReadyException", exc
            return False
        assert json.loads(answer["Body"].read()) == {"a": 1}
        return True

    wait_until(answered, "answered by what it ran before the restart")
    # The console names them as the user did, not by the names they are kept under.
    for path in ("/console/api/endpoints", "/console/api/endpoints/kept"):
        with urllib.request.urlopen(gw.url + path, timeout=30) as page:
            shown = page.read().decode()
        assert "kept" in shown and "~" not in shown, (path, shown)


def test_deleting_a_creating_endpoint_stops_its_start(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    """The create step was waiting on an instance whose model takes minutes to load:
    the delete waited for it (up to the start timeout), the instance running on."""
    sm = gateway.sm
    deploy(sm, "slowload", model_tarball("sleepy"), environment={"SLEEPY_LOAD_S": "600"},
           wait=False)  # fmt: skip
    wait_until(lambda: instance_pids(gateway.process.pid), "the instance started")
    started = instance_pids(gateway.process.pid)
    sm.delete_endpoint(EndpointName="slowload")

    def gone() -> bool:
        names = [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]
        return "slowload" not in names

    wait_until(gone, "the endpoint deleted", timeout_s=30)
    wait_until(
        lambda: not set(started) & set(instance_pids(gateway.process.pid)),
        "its instance stopped",
        timeout_s=30,
    )


def test_deleting_a_creating_endpoint_stops_an_instance_that_ignores_sigterm(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    """Its stop waits 10 s for SIGTERM before SIGKILL: the step was cancelled again on
    every pass meanwhile, a cancel landing in that wait, and the instance ran on after the
    gateway itself stopped."""
    sm = gateway.sm
    pid_file = tmp_path / "pid"
    sm.create_model(
        ModelName="deaf",
        PrimaryContainer={
            "Image": f"cmd:bash -c 'echo $$ > {pid_file}; trap \"\" TERM; exec sleep 600'"
        },
    )
    sm.create_endpoint_config(
        EndpointConfigName="deaf",
        ProductionVariants=[{"VariantName": "v1", "ModelName": "deaf",
                             "InstanceType": "ml.m5.large", "InitialInstanceCount": 1,
                             "ContainerStartupHealthCheckTimeoutInSeconds": 600}],
    )  # fmt: skip
    sm.create_endpoint(EndpointName="deaf", EndpointConfigName="deaf")
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the instance started")
    pid = int(pid_file.read_text())
    sm.delete_endpoint(EndpointName="deaf")

    def gone() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        return state == "Z"

    wait_until(gone, "its instance killed after SIGTERM went unheard", timeout_s=40)


def test_changing_a_missing_resource_names_it_by_arn(gateway: GatewayProcess) -> None:
    """SageMaker names the resource by ARN where a call changes or deletes it, and by
    name where it describes it (what boto3's waiters match)."""
    sm = gateway.sm
    arn = "arn:aws:sagemaker:us-east-1:000000000000"
    calls = [
        (lambda: sm.delete_model(ModelName="Gone"), f'model "{arn}:model/gone"'),
        (
            lambda: sm.delete_endpoint_config(EndpointConfigName="gone"),
            f'endpoint configuration "{arn}:endpoint-config/gone"',
        ),
        (lambda: sm.delete_endpoint(EndpointName="gone"), f'endpoint "{arn}:endpoint/gone"'),
        (
            lambda: sm.update_endpoint_weights_and_capacities(
                EndpointName="gone",
                DesiredWeightsAndCapacities=[{"VariantName": "v1", "DesiredWeight": 1.0}],
            ),
            f'endpoint "{arn}:endpoint/gone"',
        ),
    ]
    for call, named in calls:
        with pytest.raises(ClientError) as err:
            call()
        assert _code(err) == "ValidationException"
        assert err.value.response["Error"]["Message"] == f"Could not find {named}."


def test_a_failed_start_is_logged_and_told_in_the_users_terms(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    url = model_tarball("echo")
    deploy(gateway.sm, "noprog", url, environment={"SAGEMAKER_PROGRAM": "missing.py"}, wait=False)
    with pytest.raises(WaiterError):
        gateway.sm.get_waiter("endpoint_in_service").wait(
            EndpointName="noprog", WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
        )
    reason = gateway.sm.describe_endpoint(EndpointName="noprog")["FailureReason"]
    assert f"SAGEMAKER_PROGRAM missing.py is not in the model's code/ folder ({url}/code)" in reason
    assert str(gateway.home) not in reason  # the user never saw the gateway's folders
    assert "WARNING" in gateway.log() and "endpoint noprog failed" in gateway.log()
