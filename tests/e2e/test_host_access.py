"""A gateway with auth: runs no command and touches no file it was not given.

Issue 9 findings 1 and 2, reproduced as an attacker holding a valid key would try them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, WaiterError

from tests.conftest import MODELS, make_tarball, start_gateway, wait_in_service
from tests.e2e.test_auth import SECRETS, client, write_stack
from tests.e2e.test_jobs import job_request


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("roots")
    (base / "models").mkdir()
    (base / "data").mkdir()
    return base


def gateway(base: Path, name: str, **auth: Any) -> Any:
    stack = write_stack(base / f"{name}.yaml", **auth)
    return start_gateway(base / name, extra_env=SECRETS, args=["--config", str(stack)])


@pytest.fixture(scope="module")
def confined(roots: Path) -> Any:
    gw = gateway(roots, "confined", file_roots=[str(roots / "models"), str(roots / "data")])
    try:
        yield gw
    finally:
        gw.stop()


def refused(call: Any) -> str:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response["Error"]
    assert error["Code"] in ("ValidationException", "ValidationError"), error
    return str(error["Message"])


def test_a_cmd_model_is_refused_and_runs_nothing(confined: Any, roots: Path) -> None:
    """Finding 1: CreateModel with a cmd: image ran a command as the gateway's user."""
    marker = roots / "marker"
    sm = client(confined, "sagemaker")
    message = refused(
        lambda: sm.create_model(
            ModelName="evil",
            PrimaryContainer={"Image": f"cmd:id > {marker}; exec sleep 60"},
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
    )
    assert "allow_commands" in message
    refused(
        lambda: sm.create_model(
            ModelName="evil2",
            Containers=[{"Image": "shipyard/python"}, {"Image": f"cmd:touch {marker}"}],
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
    )
    assert not marker.exists()


def test_model_files_outside_the_roots_are_refused(confined: Any, roots: Path) -> None:
    sm = client(confined, "sagemaker")
    message = refused(
        lambda: sm.create_model(
            ModelName="peek",
            PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": "file:///etc"},
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
    )
    assert "auth.file_roots" in message
    link = roots / "models" / "escape"
    link.symlink_to("/etc")
    refused(
        lambda: sm.create_model(
            ModelName="peek2",
            PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": link.as_uri()},
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
    )


def test_async_paths_outside_the_roots_are_refused(confined: Any, roots: Path) -> None:
    """Finding 2: an async endpoint copied /etc/hostname to where the caller said."""
    sm, rt = client(confined, "sagemaker"), client(confined, "sagemaker-runtime")
    shutil.copytree(MODELS / "echo", roots / "models" / "echo")
    sm.create_model(
        ModelName="echo",
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": (roots / "models" / "echo").as_uri(),
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    variant = {
        "VariantName": "v1",
        "ModelName": "echo",
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 1,
    }

    def config(name: str, out: str) -> Any:
        return lambda: sm.create_endpoint_config(
            EndpointConfigName=name,
            ProductionVariants=[variant],
            AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": out}},
        )

    assert "auth.file_roots" in refused(config("anywhere", "file:///tmp/anywhere"))
    config("inside", (roots / "data" / "out").as_uri())()
    sm.create_endpoint(EndpointName="echoes", EndpointConfigName="inside")
    wait_in_service(sm, "echoes")
    message = refused(
        lambda: rt.invoke_endpoint_async(
            EndpointName="echoes", InputLocation="file:///etc/hostname"
        )
    )
    assert "auth.file_roots" in message
    (roots / "data" / "in.json").write_text('{"x": 1}')
    answer = rt.invoke_endpoint_async(
        EndpointName="echoes", InputLocation=(roots / "data" / "in.json").as_uri()
    )
    assert answer["OutputLocation"].startswith((roots / "data" / "out").as_uri())
    assert not Path("/tmp/anywhere").exists()


def test_training_jobs_cannot_name_host_files_or_commands(confined: Any, roots: Path) -> None:
    """Finding 2: CreateTrainingJob with S3Uri file:///etc/... copied it into the job."""
    sm = client(confined, "sagemaker")
    request = job_request("steal", roots / "data" / "out", Path("/etc"))
    request["HyperParameters"]["sagemaker_submit_directory"] = (roots / "models").as_uri()
    assert "InputDataConfig.1.S3Uri" in refused(lambda: sm.create_training_job(**request))
    request = job_request("code-outside", roots / "data" / "out")
    assert "sagemaker_submit_directory" in refused(lambda: sm.create_training_job(**request))
    request = job_request("cmd", roots / "data" / "out")
    request["HyperParameters"]["sagemaker_submit_directory"] = (roots / "models").as_uri()
    request["AlgorithmSpecification"]["TrainingImage"] = "cmd:id"
    assert "allow_commands" in refused(lambda: sm.create_training_job(**request))
    request["AlgorithmSpecification"] = {
        "TrainingImage": "shipyard/python",
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["sh", "-c", "id"],
    }
    assert "ContainerEntrypoint" in refused(lambda: sm.create_training_job(**request))
    assert not any((roots / "confined" / "jobs").glob("*"))


def test_allow_commands_and_roots_let_an_operator_opt_in(roots: Path) -> None:
    model = make_tarball("sum", roots / "models" / "sum" / "model.tar.gz")
    gw = gateway(roots, "opted", allow_commands=True, file_roots=[str(roots / "models")])
    try:
        sm = client(gw, "sagemaker")
        sm.create_model(
            ModelName="cmd",
            PrimaryContainer={"Image": "cmd:exec sleep 60"},
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
        sm.create_model(
            ModelName="sum",
            PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model.as_uri()},
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
        assert {m["ModelName"] for m in sm.list_models()["Models"]} == {"cmd", "sum"}
    finally:
        gw.stop()


def test_a_transform_output_is_not_written_through_a_link_made_after_the_check(
    roots: Path,
) -> None:
    """Issue 65, item 1: the output folder did not exist when CreateTransformJob was
    checked; while the model answered, it became a link out of the roots (a job writing
    a folder under a root can make one) and the gateway wrote the answer through it.

    The model makes the link itself as it answers (link_maker), so the link is there
    after the check and before the write, every time; ``sandbox: false`` only so that
    it may write the root, as a job may write its own output folder."""
    outside = roots / "outside-the-roots"
    outside.mkdir()
    shutil.copytree(MODELS / "link_maker", roots / "models" / "link_maker")
    data = roots / "data"
    out = data / "raced" / "out"
    (data / "raced" / "in").mkdir(parents=True)
    order = {"link": str(out), "to": str(outside)}
    (data / "raced" / "in" / "order.json").write_text(json.dumps(order))
    folders = [str(roots / "models"), str(data)]
    gw = gateway(roots, "raced", file_roots=folders, sandbox=False)
    try:
        sm = client(gw, "sagemaker")
        sm.create_model(
            ModelName="link-maker",
            PrimaryContainer={
                "Image": "shipyard/python",
                "ModelDataUrl": (roots / "models" / "link_maker").as_uri(),
            },
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
        sm.create_transform_job(
            TransformJobName="raced",
            ModelName="link-maker",
            TransformInput={
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": (data / "raced" / "in").as_uri(),
                    }
                },
                "ContentType": "application/json",
            },
            TransformOutput={"S3OutputPath": out.as_uri()},
            TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
        )
        with contextlib.suppress(WaiterError):  # it raises on Failed, the outcome expected
            sm.get_waiter("transform_job_completed_or_stopped").wait(
                TransformJobName="raced", WaiterConfig={"Delay": 0.3, "MaxAttempts": 400}
            )
        job = sm.describe_transform_job(TransformJobName="raced")
    finally:
        gw.stop()
    assert out.is_symlink(), "the model made its link"
    assert list(outside.iterdir()) == [], "nothing is written outside the roots"
    assert job["TransformJobStatus"] == "Failed", job
    assert "is a link or no folder" in job["FailureReason"], job["FailureReason"]
