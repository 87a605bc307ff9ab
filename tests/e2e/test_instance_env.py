"""What instances and jobs are given: their own variables, never the gateway's.

The gateway below carries secrets in its environment (an ``auth:`` key, a database
password, AWS keys); none may reach a model's code. Processes that use ``s3://`` get the
gateway's S3 access as explicit credentials, resolved once (here from a profile file),
never its profile or credential files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import MODELS, Bucket, GatewayProcess, deploy, make_tarball, unique
from tests.e2e.test_jobs import ENV as JOB_ENV
from tests.e2e.test_jobs import job_request, wait_final

SECRETS = {
    "MY_DB_PASSWORD": "hunter2",
    "SHIPYARD_KEY_OPS": "ops-secret",
    "DATABASE_URL": "postgresql://shipyard:hunter2@db.internal/shipyard",
}
GATEWAY_AWS = {"AWS_ACCESS_KEY_ID": "AKIDGATEWAY", "AWS_SECRET_ACCESS_KEY": "gateway-aws-secret"}


def profile_credentials(tmp_path: Path, endpoint_url: str) -> dict[str, str]:
    """A gateway environment whose AWS credentials come from a profile in a file."""
    path = tmp_path / "aws-credentials"
    path.write_text(
        "[shipyard-test]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = from-file\n"
    )
    return {
        # Empty keys count as unset for botocore, so the profile is what resolves.
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_PROFILE": "shipyard-test",
        "AWS_SHARED_CREDENTIALS_FILE": str(path),
        "SHIPYARD_S3_ENDPOINT_URL": endpoint_url,
    }


def assert_no_gateway_secrets(env: dict[str, str]) -> None:
    for name in SECRETS:
        assert name not in env, name
    for name in ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        assert name not in env, name
    assert "gateway-aws-secret" not in env.values()


def job_environment(gw: GatewayProcess, name: str) -> dict[str, Any]:
    logs = "".join(p.read_text() for p in gw.home.glob(f"jobs/{name}/**/*.log"))
    seen: dict[str, Any] = json.loads(logs.split("ENV ", 1)[1].splitlines()[0])
    return seen


def test_an_instance_gets_its_own_variables_not_the_gateways(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory(extra_env={**SECRETS, **GATEWAY_AWS})
    name = unique("env")
    deploy(gw.sm, name, (MODELS / "env_dump").as_uri(), environment={"MODEL_SETTING": "on"})
    out = gw.rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=b"{}")
    env = json.loads(out["Body"].read())
    assert_no_gateway_secrets(env)
    # A model served from a folder reads no s3:// itself: no credentials at all.
    assert "AWS_ACCESS_KEY_ID" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["MODEL_SETTING"] == "on"
    assert env["SHIPYARD_INSTANCE_ID"] and env["SAGEMAKER_BIND_TO_PORT"] and env["PATH"]
    assert env["HOME"].startswith(str(gw.home))
    # OpenBLAS's threads sleep once a call ends rather than spin beside the gateway, and
    # glibc keeps large buffers in its heap...
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "4"
    assert env["MALLOC_MMAP_THRESHOLD_"] == "33554432"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "33554432"
    # ... unless the model says otherwise.
    spins = unique("envspin")
    own = {"OPENBLAS_THREAD_TIMEOUT": "28", "MALLOC_TRIM_THRESHOLD_": "131072"}
    deploy(gw.sm, spins, (MODELS / "env_dump").as_uri(), environment=own)
    out = gw.rt.invoke_endpoint(EndpointName=spins, ContentType="application/json", Body=b"{}")
    assert json.loads(out["Body"].read()).items() >= own.items()


def test_a_multi_model_instance_on_s3_gets_explicit_credentials(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    bucket.put("models/env.tar.gz", make_tarball("env_dump", tmp_path / "env.tar.gz"))
    gw = gateway_factory(
        extra_env={**SECRETS, **profile_credentials(tmp_path, bucket.endpoint_url)}
    )
    name = unique("envmme")
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": "shipyard/python",
            "Mode": "MultiModel",
            "ModelDataUrl": f"s3://{bucket.name}/models/",
        },
    )
    deploy_variant = {"VariantName": "v1", "ModelName": name, "InstanceType": "ml.m5.large"}
    gw.sm.create_endpoint_config(
        EndpointConfigName=name, ProductionVariants=[{**deploy_variant, "InitialInstanceCount": 1}]
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    gw.sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )
    # The instance downloads the model from S3 itself: that works only with the access.
    out = gw.rt.invoke_endpoint(
        EndpointName=name, ContentType="application/json", Body=b"{}", TargetModel="env.tar.gz"
    )
    env = json.loads(out["Body"].read())
    assert_no_gateway_secrets(env)
    assert env["AWS_ACCESS_KEY_ID"] == "AKIDPROFILE"
    assert env["AWS_SECRET_ACCESS_KEY"] == "from-file"
    assert env["SHIPYARD_S3_ENDPOINT_URL"] == bucket.endpoint_url


def test_a_model_on_s3_is_fetched_by_its_instance(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    """The spec carries the artifact's URI, not a folder of the gateway: the instance
    fetches it itself, into its host's cache, with the S3 access it is given."""
    bucket.put("single/model.tar.gz", make_tarball("env_dump", tmp_path / "env.tar.gz"))
    gw = gateway_factory(
        extra_env={**SECRETS, **profile_credentials(tmp_path, bucket.endpoint_url)}
    )
    name = unique("envs3")
    deploy(gw.sm, name, f"s3://{bucket.name}/single/model.tar.gz")
    out = gw.rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=b"{}")
    env = json.loads(out["Body"].read())
    assert_no_gateway_secrets(env)
    assert env["AWS_ACCESS_KEY_ID"] == "AKIDPROFILE"
    assert env["SHIPYARD_S3_ENDPOINT_URL"] == bucket.endpoint_url
    cached = [p for p in (gw.home / "models").iterdir() if (p / "code").is_dir()]
    assert len(cached) == 1, "one copy, in the host's artifact cache"


def test_a_job_script_gets_its_own_variables_not_the_gateways(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env={**SECRETS, **GATEWAY_AWS, **JOB_ENV})
    name = unique("envjob")
    request = job_request(name, tmp_path / "out", mode="env")
    request["Environment"] = {"JOB_SETTING": "on"}
    # s3:// where the job opens nothing: its tags lend no credentials.
    request["Tags"] = [{"Key": "source", "Value": "s3://somewhere/else"}]
    gw.sm.create_training_job(**request)
    job = wait_final(gw.sm, name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    seen = job_environment(gw, name)
    assert_no_gateway_secrets(seen)
    assert "AWS_ACCESS_KEY_ID" not in seen  # none of its locations is in S3
    assert seen["JOB_SETTING"] == "on"
    assert "SM_MODEL_DIR" in seen


def _job_with_profile(
    gateway_factory: Callable[..., GatewayProcess],
    bucket: Bucket,
    tmp_path: Path,
    **changes: Any,
) -> tuple[str, dict[str, Any]]:
    """A completed job (``changes`` made to its request) of a gateway whose AWS
    credentials come from a profile; its name, and the environment its script saw."""
    gw = gateway_factory(
        extra_env={**SECRETS, **JOB_ENV, **profile_credentials(tmp_path, bucket.endpoint_url)}
    )
    name = unique("envjob")
    request = {**job_request(name, tmp_path / "out", mode="env"), **changes}
    gw.sm.create_training_job(**request)
    job = wait_final(gw.sm, name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    seen = job_environment(gw, name)
    assert_no_gateway_secrets(seen)
    return name, seen


def test_a_job_on_s3_gets_explicit_credentials(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    output = {"S3OutputPath": f"s3://{bucket.name}/out"}
    name, seen = _job_with_profile(gateway_factory, bucket, tmp_path, OutputDataConfig=output)
    assert seen["AWS_ACCESS_KEY_ID"] == "AKIDPROFILE"
    # The runner uploaded the job's model to S3 with those credentials.
    listed = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix=f"out/{name}/")
    assert any(o["Key"].endswith("model.tar.gz") for o in listed.get("Contents", []))


def test_a_job_given_s3_in_a_variable_gets_explicit_credentials(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    """Its script reads S3 by itself (the location in a variable it is given):
    credentials, though its channels and output are local."""
    variables = {"DATA_LOCATION": f"s3://{bucket.name}/d"}
    _, seen = _job_with_profile(gateway_factory, bucket, tmp_path, Environment=variables)
    assert seen["AWS_ACCESS_KEY_ID"] == "AKIDPROFILE"
