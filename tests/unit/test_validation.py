"""RequestValidator: SageMaker's constraints, read from botocore's model, worded as AWS."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from shipyard.errors import (
    InvalidParameter,
    SerializationException,
    UnknownOperation,
    ValidationException,
)
from shipyard.gateway.wire.validation import RequestValidator

NAME_PATTERN = "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"


@pytest.fixture(scope="module")
def validator() -> RequestValidator:
    return RequestValidator()


def full_endpoint_config() -> dict[str, Any]:
    """A CreateEndpointConfig as boto3 sends it, touching most kinds of shape."""
    return {
        "EndpointConfigName": "cfg-1",
        "ProductionVariants": [
            {
                "VariantName": "blue",
                "ModelName": "model-a",
                "InitialInstanceCount": 2,
                "InstanceType": "ml.m5.large",
                "InitialVariantWeight": 0.5,
                "VolumeSizeInGB": 30,
                "EnableSSMAccess": False,
                "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
            },
            {
                "VariantName": "green",
                "ModelName": "model-b",
                "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 5},
            },
        ],
        "DataCaptureConfig": {
            "EnableCapture": True,
            "InitialSamplingPercentage": 50,
            "DestinationS3Uri": "s3://bucket/capture",
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
            "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]},
        },
        "AsyncInferenceConfig": {
            "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
            "OutputConfig": {"S3OutputPath": "s3://bucket/out", "S3FailurePath": "s3://b/f"},
        },
        "Tags": [{"Key": "team", "Value": "ml platform"}],
        "KmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/abc",
        "EnableNetworkIsolation": False,
        "UnknownMemberAwsIgnores": {"anything": [1, 2]},
    }


def message_of(validator: RequestValidator, operation: str, params: object) -> str:
    with pytest.raises(InvalidParameter) as caught:
        validator.validate(operation, params)
    return caught.value.message


def test_a_full_endpoint_config_passes(validator: RequestValidator) -> None:
    validator.validate("CreateEndpointConfig", full_endpoint_config())


def test_has_operation_knows_the_models_actions_only(validator: RequestValidator) -> None:
    assert validator.has_operation("CreateEndpoint")
    assert validator.has_operation("ListTrainingJobs")
    assert not validator.has_operation("CreateEndpointPlease")
    assert not validator.has_operation("SageMaker.CreateEndpoint")


def test_an_unknown_operation_is_refused(validator: RequestValidator) -> None:
    with pytest.raises(UnknownOperation):
        validator.validate("CreateEndpointPlease", {})


def test_a_missing_required_member_is_null(validator: RequestValidator) -> None:
    message = message_of(validator, "CreateEndpoint", {"EndpointConfigName": "cfg"})
    assert message == (
        "1 validation error detected: Value null at 'endpointName' failed to satisfy "
        "constraint: Member must not be null"
    )


def test_json_null_counts_as_missing(validator: RequestValidator) -> None:
    message = message_of(
        validator, "CreateEndpoint", {"EndpointName": None, "EndpointConfigName": "cfg"}
    )
    assert "Value null at 'endpointName'" in message


def test_a_name_breaking_the_pattern_is_reported_with_awss_wording(
    validator: RequestValidator,
) -> None:
    message = message_of(
        validator, "CreateEndpoint", {"EndpointName": "bad name!", "EndpointConfigName": "c"}
    )
    assert message == (
        "1 validation error detected: Value 'bad name!' at 'endpointName' failed to "
        f"satisfy constraint: Member must satisfy regular expression pattern: {NAME_PATTERN}"
    )


def test_the_pattern_must_match_the_whole_value(validator: RequestValidator) -> None:
    """'ok-' starts with a match; SageMaker (Java's matches()) still refuses it."""
    message = message_of(
        validator, "CreateEndpoint", {"EndpointName": "ok-", "EndpointConfigName": "c"}
    )
    assert "Value 'ok-' at 'endpointName'" in message


def test_a_64_character_name_breaks_both_max_length_and_pattern(
    validator: RequestValidator,
) -> None:
    name = "a" * 64
    message = message_of(
        validator, "CreateEndpoint", {"EndpointName": name, "EndpointConfigName": "c"}
    )
    assert message.startswith("2 validation errors detected: ")
    assert (
        f"Value '{name}' at 'endpointName' failed to satisfy constraint: "
        "Member must have length less than or equal to 63"
    ) in message
    assert f"Member must satisfy regular expression pattern: {NAME_PATTERN}" in message


def test_a_63_character_name_is_fine(validator: RequestValidator) -> None:
    validator.validate("CreateEndpoint", {"EndpointName": "a" * 63, "EndpointConfigName": "c"})


def test_an_instance_count_of_zero_is_under_the_minimum(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialInstanceCount"] = 0
    message = message_of(validator, "CreateEndpointConfig", params)
    assert message == (
        "1 validation error detected: Value '0' at "
        "'productionVariants.1.member.initialInstanceCount' failed to satisfy constraint: "
        "Member must have value greater than or equal to 1"
    )


def test_a_value_over_an_integer_maximum_is_reported(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["VolumeSizeInGB"] = 513
    message = message_of(validator, "CreateEndpointConfig", params)
    assert (
        "Value '513' at 'productionVariants.1.member.volumeSizeInGB' failed to satisfy "
        "constraint: Member must have value less than or equal to 512"
    ) in message


@pytest.mark.parametrize("count", ["1", 1.5, True, [1], {"n": 1}])
def test_a_non_integer_instance_count_is_a_serialization_error(
    validator: RequestValidator, count: object
) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialInstanceCount"] = count
    with pytest.raises(SerializationException) as caught:
        validator.validate("CreateEndpointConfig", params)
    assert "'productionVariants.1.member.initialInstanceCount'" in caught.value.message


def test_a_string_for_an_integer_uses_awss_wording(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialInstanceCount"] = "one"
    with pytest.raises(SerializationException) as caught:
        validator.validate("CreateEndpointConfig", params)
    assert caught.value.message.startswith("STRING_VALUE can not be converted to an Integer")


def test_an_integral_float_is_accepted_as_an_integer(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialInstanceCount"] = 3.0
    validator.validate("CreateEndpointConfig", params)


def test_an_integer_outside_32_bits_cannot_be_an_integer(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialInstanceCount"] = 2**31
    with pytest.raises(SerializationException):
        validator.validate("CreateEndpointConfig", params)


def test_a_list_over_its_maximum_length_is_reported(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    variant = params["ProductionVariants"][0]
    params["ProductionVariants"] = [
        {**copy.deepcopy(variant), "VariantName": f"v{i}"} for i in range(11)
    ]
    message = message_of(validator, "CreateEndpointConfig", params)
    assert message.startswith("1 validation error detected: Value '[{VariantName=v0, ")
    assert message.endswith(
        "' at 'productionVariants' failed to satisfy constraint: "
        "Member must have length less than or equal to 10"
    )


def test_an_empty_list_is_under_its_minimum_length(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"] = []
    message = message_of(validator, "CreateEndpointConfig", params)
    assert message == (
        "1 validation error detected: Value '[]' at 'productionVariants' failed to "
        "satisfy constraint: Member must have length greater than or equal to 1"
    )


def test_an_enum_violation_lists_the_allowed_values(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["RoutingConfig"]["RoutingStrategy"] = "FASTEST"
    message = message_of(validator, "CreateEndpointConfig", params)
    assert message.startswith(
        "1 validation error detected: Value 'FASTEST' at "
        "'productionVariants.1.member.routingConfig.routingStrategy' failed to satisfy "
        "constraint: Member must satisfy enum value set: ["
    )
    assert "LEAST_OUTSTANDING_REQUESTS" in message
    assert "RANDOM" in message


def test_paths_nest_through_structures_and_lists(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["DataCaptureConfig"]["CaptureOptions"][1]["CaptureMode"] = "Sideways"
    params["ProductionVariants"][1]["ServerlessConfig"]["MaxConcurrency"] = 0
    message = message_of(validator, "CreateEndpointConfig", params)
    assert "at 'productionVariants.2.member.serverlessConfig.maxConcurrency'" in message
    assert "at 'dataCaptureConfig.captureOptions.2.member.captureMode'" in message


def test_a_missing_member_of_a_nested_structure_has_a_full_path(
    validator: RequestValidator,
) -> None:
    params = full_endpoint_config()
    del params["AsyncInferenceConfig"]["OutputConfig"]
    message = message_of(validator, "CreateEndpointConfig", params)
    assert message == (
        "1 validation error detected: Value null at 'asyncInferenceConfig.outputConfig' "
        "failed to satisfy constraint: Member must not be null"
    )


def test_a_null_list_element_must_not_be_null(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["Tags"].append(None)
    message = message_of(validator, "CreateEndpointConfig", params)
    assert "Value null at 'tags.2.member' failed to satisfy constraint" in message


def test_every_error_is_counted_and_listed_in_order(validator: RequestValidator) -> None:
    params = {
        "ProductionVariants": [{"VariantName": "bad_name", "InitialInstanceCount": 0}],
    }
    message = message_of(validator, "CreateEndpointConfig", params)
    assert message == (
        "3 validation errors detected: "
        "Value null at 'endpointConfigName' failed to satisfy constraint: "
        "Member must not be null; "
        "Value 'bad_name' at 'productionVariants.1.member.variantName' failed to satisfy "
        f"constraint: Member must satisfy regular expression pattern: {NAME_PATTERN}; "
        "Value '0' at 'productionVariants.1.member.initialInstanceCount' failed to satisfy "
        "constraint: Member must have value greater than or equal to 1"
    )


def test_map_entries_are_reported_on_the_map_with_every_constraint(
    validator: RequestValidator,
) -> None:
    params = {
        "ModelName": "m",
        "PrimaryContainer": {"Image": "shipyard/python", "Environment": {"1BAD": "x"}},
    }
    message = message_of(validator, "CreateModel", params)
    assert message.startswith(
        "1 validation error detected: Value '{1BAD=x}' at 'primaryContainer.environment' "
        "failed to satisfy constraint: Map keys must satisfy constraint: ["
    )
    assert "Member must have length less than or equal to 1024" in message
    assert "Member must satisfy regular expression pattern: ^[a-zA-Z_][a-zA-Z0-9_]*" in message


def test_a_map_with_too_many_entries_is_reported(validator: RequestValidator) -> None:
    environment = {f"K{i}": "v" for i in range(101)}
    params = {"ModelName": "m", "PrimaryContainer": {"Environment": environment}}
    message = message_of(validator, "CreateModel", params)
    assert message.endswith(
        "at 'primaryContainer.environment' failed to satisfy constraint: "
        "Member must have length less than or equal to 100"
    )


def test_an_invalid_parameter_is_a_validation_exception(validator: RequestValidator) -> None:
    with pytest.raises(ValidationException) as caught:
        validator.validate("CreateEndpoint", {})
    assert caught.value.wire_type == "ValidationException"
    assert caught.value.status_code == 400


@pytest.mark.parametrize("body", [[], "CreateEndpoint", 3, None, True])
def test_a_body_that_is_not_an_object_is_a_serialization_error(
    validator: RequestValidator, body: object
) -> None:
    with pytest.raises(SerializationException):
        validator.validate("CreateEndpoint", body)


@pytest.mark.parametrize(
    ("value", "wording"),
    [
        ({"a": 1}, "Start of structure or map found where not expected."),
        (["a"], "Start of list found where not expected."),
        (5, "NUMBER_VALUE can not be converted to a String"),
        (False, "BOOLEAN_VALUE can not be converted to a String"),
    ],
)
def test_a_string_member_of_the_wrong_json_type_is_a_serialization_error(
    validator: RequestValidator, value: object, wording: str
) -> None:
    with pytest.raises(SerializationException) as caught:
        validator.validate("CreateEndpoint", {"EndpointName": value, "EndpointConfigName": "c"})
    assert caught.value.message == f"{wording} (at 'endpointName')"


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("ProductionVariants", {"VariantName": "v"}),
        ("Tags", "team=ml"),
        ("EnableNetworkIsolation", "true"),
        ("DataCaptureConfig", ["x"]),
    ],
)
def test_containers_and_booleans_of_the_wrong_json_type_are_serialization_errors(
    validator: RequestValidator, member: str, value: object
) -> None:
    params = full_endpoint_config()
    params[member] = value
    with pytest.raises(SerializationException):
        validator.validate("CreateEndpointConfig", params)


def test_timestamps_are_epoch_seconds(validator: RequestValidator) -> None:
    validator.validate("ListEndpoints", {"CreationTimeAfter": 1_700_000_000.5})
    with pytest.raises(SerializationException):
        validator.validate("ListEndpoints", {"CreationTimeAfter": "yesterday"})


@pytest.mark.parametrize("moment", [10**400, 1e300, -1e300, 253_402_300_800, float("inf")])
def test_a_timestamp_no_date_can_hold_is_a_serialization_error(
    validator: RequestValidator, moment: float
) -> None:
    """ListEndpoints filtered on such a moment answered 500 (float() overflowed)."""
    with pytest.raises(SerializationException) as caught:
        validator.validate("ListEndpoints", {"CreationTimeAfter": moment})
    assert "can not be converted to a Timestamp (at 'creationTimeAfter')" in caught.value.message


def test_an_integer_no_double_can_hold_is_a_serialization_error(
    validator: RequestValidator,
) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialVariantWeight"] = 10**400
    with pytest.raises(SerializationException) as caught:
        validator.validate("CreateEndpointConfig", params)
    assert "NUMBER_VALUE can not be converted to a Float" in caught.value.message


def test_list_paging_members_enforce_their_range(validator: RequestValidator) -> None:
    message = message_of(validator, "ListEndpoints", {"MaxResults": 101})
    assert message == (
        "1 validation error detected: Value '101' at 'maxResults' failed to satisfy "
        "constraint: Member must have value less than or equal to 100"
    )


def test_floats_enforce_their_minimum(validator: RequestValidator) -> None:
    params = full_endpoint_config()
    params["ProductionVariants"][0]["InitialVariantWeight"] = -0.5
    message = message_of(validator, "CreateEndpointConfig", params)
    assert "Value '-0.5' at 'productionVariants.1.member.initialVariantWeight'" in message


def test_patterns_python_cannot_compile_are_skipped_not_fatal(
    validator: RequestValidator,
) -> None:
    """Tag values use Java's \\p{L} classes; their lengths are still enforced."""
    params = full_endpoint_config()
    params["Tags"] = [{"Key": "équipe", "Value": "données 2024"}]
    validator.validate("CreateEndpointConfig", params)
    params["Tags"] = [{"Key": "k", "Value": "v" * 257}]
    message = message_of(validator, "CreateEndpointConfig", params)
    assert "at 'tags.1.member.value' failed to satisfy constraint: Member must have length" in (
        message
    )


def test_operations_without_required_members_accept_an_empty_object(
    validator: RequestValidator,
) -> None:
    validator.validate("ListEndpoints", {})


def test_a_null_map_value_is_reported_on_the_map(validator: RequestValidator) -> None:
    params = {"ModelName": "m", "PrimaryContainer": {"Environment": {"A": None}}}
    message = message_of(validator, "CreateModel", params)
    assert message.startswith(
        "1 validation error detected: Value '{A=null}' at 'primaryContainer.environment' "
        "failed to satisfy constraint: Map value must satisfy constraint: "
        "[Member must not be null, "
    )


def test_structured_map_values_are_walked_under_their_key(validator: RequestValidator) -> None:
    good = {"TrialComponentName": "t", "Parameters": {"lr": {"NumberValue": 0.1}}}
    validator.validate("CreateTrialComponent", good)
    message = message_of(validator, "CreateTrialComponent", {**good, "Parameters": {"lr": None}})
    assert "Value null at 'parameters.lr' failed to satisfy constraint" in message
    with pytest.raises(SerializationException) as caught:
        bad = {**good, "Parameters": {"lr": {"NumberValue": "0.1"}}}
        validator.validate("CreateTrialComponent", bad)
    assert caught.value.message == (
        "STRING_VALUE can not be converted to a Double (at 'parameters.lr.numberValue')"
    )


def test_other_services_blobs_are_base64_and_sensitive_values_stay_hidden() -> None:
    """KMS's Plaintext is a sensitive blob: its decoded length counts, its value is never shown."""
    kms = RequestValidator("kms")
    kms.validate("Encrypt", {"KeyId": "k", "Plaintext": base64.b64encode(b"x").decode()})
    with pytest.raises(SerializationException):
        kms.validate("Encrypt", {"KeyId": "k", "Plaintext": "not base64!!"})
    too_long = base64.b64encode(b"x" * 4097).decode()
    message = message_of(kms, "Encrypt", {"KeyId": "k", "Plaintext": too_long})
    assert message == (
        "1 validation error detected: Value at 'plaintext' failed to satisfy constraint: "
        "Member must have length less than or equal to 4096"
    )
