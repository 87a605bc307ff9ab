"""Framework models as the sagemaker SDK makes them: the model's files in ModelDataUrl, its
code uploaded apart as sourcedir.tar.gz and named by SAGEMAKER_SUBMIT_DIRECTORY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import MODELS, Bucket, GatewayProcess, deploy, make_tarball

FRAMEWORK = MODELS / "framework"


def sourcedir(dest: Path) -> Path:
    """The SDK's sourcedir.tar.gz: the source folder's files at the archive's root."""
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted((FRAMEWORK / "source").iterdir()):
            tar.add(path, arcname=path.name)
    return dest


def test_the_submit_directory_is_fetched_and_its_program_loaded(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    model = make_tarball("framework/artifact", tmp_path / "model.tar.gz").as_uri()
    code = sourcedir(tmp_path / "sourcedir.tar.gz").as_uri()
    environment = {"SAGEMAKER_PROGRAM": "inference.py", "SAGEMAKER_SUBMIT_DIRECTORY": code}
    deploy(gateway.sm, "fw", model, environment=environment)
    out = gateway.rt.invoke_endpoint(
        EndpointName="fw", ContentType="application/json", Body=b"[[1, 2], [3, 4]]"
    )
    assert json.loads(out["Body"].read()) == [30, 70]


def test_opt_model_code_means_the_models_own_code_folder(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    """A repacked model (the SDK's other way) carries its code under code/."""
    folder = tmp_path / "repacked"
    (folder / "code").mkdir(parents=True)
    for path in (FRAMEWORK / "source").iterdir():
        (folder / "code" / path.name).write_bytes(path.read_bytes())
    (folder / "weights.json").write_text('{"factor": 2}')
    environment = {
        "SAGEMAKER_PROGRAM": "inference.py",
        "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
    }
    deploy(gateway.sm, "repacked", folder.as_uri(), environment=environment)
    out = gateway.rt.invoke_endpoint(
        EndpointName="repacked", ContentType="application/json", Body=b"[[1, 2]]"
    )
    assert json.loads(out["Body"].read()) == [6]


SDK_DEPLOY = """
import json, sys
import boto3, sagemaker
from sagemaker.deserializers import JSONDeserializer
from sagemaker.serializers import JSONSerializer
from sagemaker.sklearn import SKLearnModel

bucket, model_data, source_dir = sys.argv[1:4]
session = sagemaker.Session(boto_session=boto3.Session(region_name="us-east-1"),
                            default_bucket=bucket)
model = SKLearnModel(
    model_data=model_data, role="arn:aws:iam::123456789012:role/x",
    entry_point="inference.py", source_dir=source_dir, framework_version="1.2-1",
    sagemaker_session=session, name="sdk-framework",
)
model.deploy(initial_instance_count=1, instance_type="ml.m5.large",
             endpoint_name="sdk-framework", wait=False)
session.sagemaker_client.get_waiter("endpoint_in_service").wait(
    EndpointName="sdk-framework", WaiterConfig={"Delay": 0.5, "MaxAttempts": 240})
predictor = sagemaker.predictor.Predictor(
    "sdk-framework", sagemaker_session=session,
    serializer=JSONSerializer(), deserializer=JSONDeserializer())
print(json.dumps(predictor.predict([[1, 2], [3, 4]])))
"""


def test_an_sklearn_model_deployed_with_the_sdk_serves_its_source_dir(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url})
    model_data = bucket.put(
        "artifacts/model.tar.gz", make_tarball("framework/artifact", tmp_path / "model.tar.gz")
    )
    env: dict[str, Any] = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_SAGEMAKER": gw.url,
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": gw.url,
        "AWS_ENDPOINT_URL_S3": bucket.endpoint_url,
        "AWS_ENDPOINT_URL_STS": bucket.endpoint_url,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
    }
    argv = [sys.executable, "-c", SDK_DEPLOY, bucket.name, model_data, str(FRAMEWORK / "source")]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [30, 70]
    described = gw.sm.describe_model(ModelName="sdk-framework")
    submitted = described["PrimaryContainer"]["Environment"]["SAGEMAKER_SUBMIT_DIRECTORY"]
    assert submitted.startswith(f"s3://{bucket.name}/") and submitted.endswith("sourcedir.tar.gz")
