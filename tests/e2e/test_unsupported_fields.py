"""Members botocore's model has and the gateway does not do are refused by name, through
boto3, when their value asks for what is not done; harmless values of them, and what the
sagemaker SDK sends for a plain deploy, are accepted. ModelDataDownloadTimeoutInSeconds
is honoured: it lengthens an instance's start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, start_gateway, unique, wait_until

_S3 = {"S3Uri": "s3://bucket/model/", "S3DataType": "S3Prefix", "CompressionType": "None"}
_CAPTURE = {
    "EnableCapture": True,
    "InitialSamplingPercentage": 100,
    "DestinationS3Uri": "s3://bucket/capture",
    "CaptureOptions": [{"CaptureMode": "Input"}],
}
_VPC = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]}

# (where the member goes, the member(s), the field the refusal names; None: accepted)
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("variant", {"InstancePools": [{"InstanceType": "ml.m5.large", "Priority": 1}]},
     "ProductionVariants.1.InstancePools"),
    ("variant", {"VariantInstanceProvisionTimeoutInSeconds": 600},
     "ProductionVariants.1.VariantInstanceProvisionTimeoutInSeconds"),
    ("variant", {"AcceleratorType": "ml.eia1.medium"}, "ProductionVariants.1.AcceleratorType"),
    ("variant", {"CoreDumpConfig": {"DestinationS3Uri": "s3://bucket/dumps"}},
     "ProductionVariants.1.CoreDumpConfig"),
    ("variant", {"VolumeSizeInGB": 30}, "ProductionVariants.1.VolumeSizeInGB"),
    ("variant", {"EnableSSMAccess": True}, "ProductionVariants.1.EnableSSMAccess"),
    ("shadow", {"EnableSSMAccess": True}, "ShadowProductionVariants.1.EnableSSMAccess"),
    ("variant", {"InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-2"},
     "ProductionVariants.1.InferenceAmiVersion"),
    ("variant",
     {"CapacityReservationConfig": {"CapacityReservationPreference": "capacity-reservations-only"}},
     "ProductionVariants.1.CapacityReservationConfig"),
    ("variant",
     {"ManagedInstanceScaling": {"Status": "ENABLED",
                                 "ScaleInPolicy": {"Strategy": "IDLE_RELEASE"}}},
     "ProductionVariants.1.ManagedInstanceScaling.ScaleInPolicy"),
    ("variant",
     {"RoutingConfig": {"RoutingStrategy": "RANDOM",
                        "PrefixAwareRoutingConfig": {"PrefixLength": 1024}}},
     "ProductionVariants.1.RoutingConfig.PrefixAwareRoutingConfig"),
    ("config", {"KmsKeyId": "alias/endpoints"}, "KmsKeyId"),
    ("config", {"DataCaptureConfig": {**_CAPTURE, "KmsKeyId": "alias/capture"}},
     "DataCaptureConfig.KmsKeyId"),
    ("config",
     {"AsyncInferenceConfig": {"OutputConfig": {"S3OutputPath": "s3://bucket/out",
                                                "KmsKeyId": "alias/out"}}},
     "AsyncInferenceConfig.OutputConfig.KmsKeyId"),
    ("config",
     {"ExplainerConfig": {"ClarifyExplainerConfig": {
         "ShapConfig": {"ShapBaselineConfig": {"ShapBaseline": "1,2"}}}}},
     "ExplainerConfig"),
    ("config", {"VpcConfig": _VPC}, "VpcConfig"),
    ("config", {"EnableNetworkIsolation": True}, "EnableNetworkIsolation"),
    ("config", {"MetricsConfig": {"EnableEnhancedMetrics": True}},
     "MetricsConfig.EnableEnhancedMetrics"),
    ("config", {"MetricsConfig": {"EnableDetailedObservability": True}},
     "MetricsConfig.EnableDetailedObservability"),
    ("config", {"MetricsConfig": {"MetricPublishFrequencyInSeconds": 60}},
     "MetricsConfig.MetricPublishFrequencyInSeconds"),
    ("model", {"VpcConfig": _VPC}, "VpcConfig"),
    ("model", {"EnableNetworkIsolation": True}, "EnableNetworkIsolation"),
    ("container", {"ImageConfig": {"RepositoryAccessMode": "Vpc"}},
     "PrimaryContainer.ImageConfig.RepositoryAccessMode"),
    ("container",
     {"ImageConfig": {"RepositoryAccessMode": "Platform", "RepositoryAuthConfig": {
         "RepositoryCredentialsProviderArn": "arn:aws:lambda:us-east-1:123456789012:function:f"}}},
     "PrimaryContainer.ImageConfig.RepositoryAuthConfig"),
    ("container", {"ModelDataSource": {"S3DataSource": _S3}}, "PrimaryContainer.ModelDataSource"),
    ("containers", {"ModelDataSource": {"S3DataSource": _S3}}, "Containers.1.ModelDataSource"),
    ("container",
     {"AdditionalModelDataSources": [{"ChannelName": "extra", "S3DataSource": _S3}]},
     "PrimaryContainer.AdditionalModelDataSources"),
    ("container", {"ModelPackageName": "scores"}, "PrimaryContainer.ModelPackageName"),
    ("container", {"InferenceSpecificationName": "spec"},
     "PrimaryContainer.InferenceSpecificationName"),
    ("container",
     {"ContainerMetricsConfig": {"MetricsEndpoints": [{"MetricsEndpointPath": "/metrics"}]}},
     "PrimaryContainer.ContainerMetricsConfig"),
    # Harmless values: what happens here anyway.
    ("variant", {"EnableSSMAccess": False}, None),
    ("shadow", {"EnableSSMAccess": False}, None),
    ("variant", {"ContainerStartupHealthCheckTimeoutInSeconds": 600,
                 "ModelDataDownloadTimeoutInSeconds": 600}, None),
    ("variant", {"RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}}, None),
    ("config", {"EnableNetworkIsolation": False}, None),
    ("config", {"MetricsConfig": {"EnableEnhancedMetrics": False,
                                  "EnableDetailedObservability": False}}, None),
    ("config", {"ExecutionRoleArn": "arn:aws:iam::123456789012:role/x"}, None),
    ("model", {"EnableNetworkIsolation": False}, None),
    ("container", {"ImageConfig": {"RepositoryAccessMode": "Platform"}}, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = start_gateway(tmp_path_factory.mktemp("unsupported") / "home")
    yield gateway
    gateway.stop()


def _requests(name: str, where: str, extra: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """CreateModel's and CreateEndpointConfig's parameters, ``extra`` placed ``where``."""
    container = {"Image": "shipyard/python", "ModelDataUrl": (MODELS / "echo").as_uri()}
    model: dict[str, Any] = {
        "ModelName": name,
        "ExecutionRoleArn": "arn:aws:iam::123456789012:role/x",
        **(extra if where == "model" else {}),
    }
    if where == "containers":
        model["Containers"] = [{**container, **extra}]
    else:
        model["PrimaryContainer"] = {**container, **(extra if where == "container" else {})}
    variant = {
        "VariantName": "v1",
        "ModelName": name,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }
    config: dict[str, Any] = {
        "EndpointConfigName": name,
        "ProductionVariants": [{**variant, **(extra if where == "variant" else {})}],
        **(extra if where == "config" else {}),
    }
    if where == "shadow":
        config["ShadowProductionVariants"] = [{**variant, "VariantName": "s1", **extra}]
    return model, config


def _code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


@pytest.mark.parametrize(
    ("where", "extra", "refused"),
    CASES,
    ids=[f"{w}-{r or 'accepted:' + ','.join(e)}" for w, e, r in CASES],
)
def test_members_not_done_here_are_refused_by_name_and_harmless_values_accepted(
    gw: GatewayProcess, where: str, extra: dict[str, Any], refused: str | None
) -> None:
    sm = gw.sm
    name = unique("fields")
    model, config = _requests(name, where, extra)
    refused_model = refused is not None and where in ("model", "container", "containers")
    if refused_model:
        with pytest.raises(ClientError) as err:
            sm.create_model(**model)
        assert _code(err) == "ValidationException"
        assert f"{refused} is not supported" in str(err.value), err.value
        with pytest.raises(ClientError) as err:
            sm.describe_model(ModelName=name)
        assert _code(err) == "ValidationException"  # nothing was created
        return
    sm.create_model(**model)
    if refused is None:
        sm.create_endpoint_config(**config)
        described = sm.describe_endpoint_config(EndpointConfigName=name)
        assert described["EndpointConfigName"] == name
        return
    with pytest.raises(ClientError) as err:
        sm.create_endpoint_config(**config)
    assert _code(err) == "ValidationException"
    assert f"{refused} is not supported" in str(err.value), err.value
    with pytest.raises(ClientError) as err:
        sm.describe_endpoint_config(EndpointConfigName=name)
    assert _code(err) == "ValidationException"  # nothing was created


def test_what_the_sagemaker_sdk_sends_for_a_plain_deploy_is_accepted(gw: GatewayProcess) -> None:
    session = pytest.importorskip("sagemaker.session")
    sm = gw.sm
    name = unique("sdkvariant")
    sm.create_model(ModelName=name, PrimaryContainer={"Image": "shipyard/python"})
    variant = session.production_variant(
        model_name=name, instance_type="ml.m5.large", initial_instance_count=1
    )
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant])
    assert sm.describe_endpoint_config(EndpointConfigName=name)["ProductionVariants"]


def test_model_data_download_timeout_lengthens_an_instances_start(tmp_path: Path) -> None:
    """The gateway gives instances 2 s to pass /ping and the model takes 4 s to load: its
    endpoint fails, unless its variant allows a download of 60 s as well."""
    gateway = start_gateway(tmp_path / "home", extra_env={"SHIPYARD_INSTANCE_START_TIMEOUT_S": "2"})
    try:
        sm = gateway.sm
        sm.create_model(
            ModelName="slow",
            PrimaryContainer={
                "Image": "shipyard/python",
                "ModelDataUrl": (MODELS / "sleepy").as_uri(),
                "Environment": {"SLEEPY_LOAD_S": "4"},
            },
        )
        variant = {
            "VariantName": "v1",
            "ModelName": "slow",
            "InstanceType": "ml.m5.large",
            "InitialInstanceCount": 1,
        }
        for name, extra in (("plain", {}), ("download", {"ModelDataDownloadTimeoutInSeconds": 60})):
            sm.create_endpoint_config(
                EndpointConfigName=name, ProductionVariants=[{**variant, **extra}]
            )
            sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
        waiter = sm.get_waiter("endpoint_in_service")
        waiter.wait(EndpointName="download", WaiterConfig={"Delay": 0.5, "MaxAttempts": 240})
        wait_until(
            lambda: sm.describe_endpoint(EndpointName="plain")["EndpointStatus"] != "Creating",
            "the plain endpoint's start to end",
        )
        plain = sm.describe_endpoint(EndpointName="plain")
        assert plain["EndpointStatus"] == "Failed", plain
        assert "within 2 s" in plain["FailureReason"], plain
    finally:
        gateway.stop()
