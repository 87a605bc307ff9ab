"""One guard where files open and processes start, and notifications only where allowed.

Issue 23 findings 2 (the environment), 3, 4, 5 and 8, tried as a holder of a valid key
would try them against a gateway with ``auth:``. The sandbox is off here: these guards
are the gateway's own and must hold without it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, WaiterError

from tests.conftest import MODELS, GatewayProcess, start_gateway, unique
from tests.e2e.test_auth import SECRETS, client, signed_http, write_stack
from tests.e2e.test_jobs import CODE, job_request

ROLE = "arn:aws:iam::123456789012:role/x"


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("guards")
    shutil.copytree(MODELS / "echo", base / "models" / "echo")
    shutil.copytree(CODE, base / "models" / "job_code")
    (base / "data").mkdir()
    (base / "secret.txt").write_text("not for callers")
    return base


@pytest.fixture(scope="module")
def guarded(roots: Path) -> Any:
    stack = write_stack(
        roots / "stack.yaml",
        file_roots=[str(roots / "models"), str(roots / "data")],
        allow_environment=["TEAM_*"],
        allow_images=["registry.example.com/team/*"],
        notify_targets=["http://127.0.0.1:*/allowed/*"],
        sandbox=False,
    )
    gw = start_gateway(roots / "home", extra_env=SECRETS, args=["--config", str(stack)])
    try:
        client(gw, "sagemaker").create_model(
            ModelName="echo",
            PrimaryContainer={
                "Image": "shipyard/python",
                "ModelDataUrl": (roots / "models" / "echo").as_uri(),
            },
            ExecutionRoleArn=ROLE,
        )
        yield gw
    finally:
        gw.stop()


def refused(call: Any) -> str:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response["Error"]
    assert error["Code"] in ("ValidationException", "ValidationError"), error
    return str(error["Message"])


# -- finding 5: a location is read as the opener reads it ----------------------------


@pytest.mark.parametrize(
    "url", ["FILE:///etc/passwd", " file:///etc/passwd", "fi\tle:///etc/passwd"]
)
def test_locations_spelled_as_the_opener_reads_them_are_refused(
    guarded: GatewayProcess, roots: Path, url: str
) -> None:
    sm = client(guarded, "sagemaker")
    message = refused(
        lambda: sm.create_model(
            ModelName=unique("spelled"),
            PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url},
            ExecutionRoleArn=ROLE,
        )
    )
    assert "PrimaryContainer.ModelDataUrl" in message and "auth.file_roots" in message
    request = job_request(unique("spelled"), roots / "data" / "out")
    request["HyperParameters"]["sagemaker_submit_directory"] = (
        roots / "models" / "job_code"
    ).as_uri()
    request["InputDataConfig"] = [
        {
            "ChannelName": "data",
            "DataSource": {"S3DataSource": {"S3Uri": url, "S3DataType": "S3Prefix"}},
        }
    ]
    assert "InputDataConfig.1.S3Uri" in refused(lambda: sm.create_training_job(**request))


# -- finding 3: manifests lead nowhere outside the roots -----------------------------


def manifest_job(gw: GatewayProcess, roots: Path, entries: list[Any], out: Path) -> dict[str, Any]:
    """A ManifestFile transform job over ``entries``, run to its end."""
    name = unique("manifest")
    manifest = roots / "data" / f"{name}.json"
    manifest.write_text(json.dumps(entries))
    sm = client(gw, "sagemaker")
    sm.create_transform_job(
        TransformJobName=name,
        ModelName="echo",
        TransformInput={
            "DataSource": {
                "S3DataSource": {"S3DataType": "ManifestFile", "S3Uri": manifest.as_uri()}
            },
            "ContentType": "application/json",
            "SplitType": "None",
        },
        TransformOutput={"S3OutputPath": out.as_uri(), "Accept": "application/json"},
        TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
        Environment={"SAGEMAKER_MODEL_SERVER_TIMEOUT": "60", "TEAM_MODE": "batch"},
    )
    try:
        sm.get_waiter("transform_job_completed_or_stopped").wait(
            TransformJobName=name, WaiterConfig={"Delay": 0.3, "MaxAttempts": 400}
        )
    except WaiterError as exc:
        assert exc.last_response["TransformJobStatus"] == "Failed", exc
    job: dict[str, Any] = sm.describe_transform_job(TransformJobName=name)
    return job


def test_a_manifest_inside_the_roots_is_transformed(guarded: GatewayProcess, roots: Path) -> None:
    data = roots / "data" / "in"
    data.mkdir()
    (data / "a.json").write_text('{"n": 1}')
    job = manifest_job(guarded, roots, [{"prefix": data.as_uri() + "/"}, "a.json"], data / "out")
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    assert json.loads((data / "out" / "a.json.out").read_text()) == {"n": 1}


@pytest.mark.parametrize("route", ["prefix", "key", "dotted output"])
def test_a_manifest_leading_outside_the_roots_fails_and_touches_nothing(
    guarded: GatewayProcess, roots: Path, route: str
) -> None:
    """Finding 3: a batch key read a file outside the roots and wrote an output there."""
    deep = roots / "data" / unique("deep") / "a" / "b"
    deep.mkdir(parents=True)
    (roots / "data" / "x.json").write_text('{"n": 2}')
    out = roots / "data" / unique("out")
    entries = {
        "prefix": [{"prefix": roots.as_uri() + "/"}, "secret.txt"],
        "key": [{"prefix": (roots / "data").as_uri() + "/"}, "../secret.txt"],
        # Read inside (data/x.json), written at out/../../../x.json.out: outside.
        "dotted output": [{"prefix": deep.as_uri() + "/"}, "../../../x.json"],
    }[route]
    before = sorted(p.name for p in roots.iterdir())
    job = manifest_job(guarded, roots, entries, out)
    assert job["TransformJobStatus"] == "Failed"
    # A prefix outside the roots is refused by them; a key with '..' before any root is
    # asked (filesystems.join_location: a name never leaves what it is joined to).
    why = "auth.file_roots" if route == "prefix" else "would leave it"
    assert why in job["FailureReason"], job["FailureReason"]
    assert sorted(p.name for p in roots.iterdir()) == before
    assert not any(roots.parent.glob("*.out")) and not (roots / "data" / "secret.txt.out").exists()
    assert not out.exists()


# -- finding 2: a caller's Environment is not code -----------------------------------


@pytest.mark.parametrize("variable", ["PYTHONWARNINGS", "LD_PRELOAD", "BROWSER"])
def test_interpreter_variables_are_refused_naming_them(
    guarded: GatewayProcess, roots: Path, variable: str
) -> None:
    """Finding 2: PYTHONWARNINGS naming a module whose import runs BROWSER ran a command."""
    sm = client(guarded, "sagemaker")
    environment = {variable: "ignore::antigravity.x", "SAGEMAKER_PROGRAM": "inference.py"}
    message = refused(
        lambda: sm.create_model(
            ModelName=unique("env"),
            PrimaryContainer={"Image": "shipyard/python", "Environment": environment},
            ExecutionRoleArn=ROLE,
        )
    )
    assert f"PrimaryContainer.Environment: '{variable}'" in message
    message = refused(
        lambda: sm.create_model(
            ModelName=unique("env"),
            Containers=[
                {"Image": "shipyard/python"},
                {"Image": "shipyard/python", "Environment": environment},
            ],
            ExecutionRoleArn=ROLE,
        )  # fmt: skip
    )
    assert f"Containers.2.Environment: '{variable}'" in message
    message = refused(
        lambda: sm.create_transform_job(
            TransformJobName=unique("env"),
            ModelName="echo",
            TransformInput={
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": (roots / "data").as_uri(),
                    }
                }
            },
            TransformOutput={"S3OutputPath": (roots / "data" / "never").as_uri()},
            TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
            Environment=environment,
        )
    )
    assert f"Environment: '{variable}'" in message
    request = job_request(unique("env"), roots / "data" / "never")
    request["HyperParameters"]["sagemaker_submit_directory"] = (
        roots / "models" / "job_code"
    ).as_uri()
    request["Environment"] = environment
    message = refused(lambda: sm.create_training_job(**request))
    assert f"Environment: '{variable}'" in message
    assert not (roots / "data" / "never").exists()


def test_sagemaker_and_operator_allowed_variables_are_accepted(guarded: GatewayProcess) -> None:
    sm = client(guarded, "sagemaker")
    sm.create_model(
        ModelName="allowed-env",
        PrimaryContainer={
            "Image": "shipyard/python",
            "Environment": {"SAGEMAKER_PROGRAM": "inference.py", "TEAM_MODE": "fast"},
        },
        ExecutionRoleArn=ROLE,
    )
    message = refused(
        lambda: sm.create_model(
            ModelName="other-env",
            PrimaryContainer={"Image": "shipyard/python", "Environment": {"OTHER": "1"}},
            ExecutionRoleArn=ROLE,
        )
    )
    assert "'OTHER'" in message and "auth.allow_environment" in message


def test_container_images_come_only_from_allow_images(guarded: GatewayProcess, roots: Path) -> None:
    """Issue 65: a container image runs outside the sandbox, pulled from a registry; a
    caller names only those ``auth.allow_images`` matches (none by default)."""
    sm = client(guarded, "sagemaker")
    for image in ("registry.example.com/other/server:1", "registry.example.com/team"):
        message = refused(
            lambda image=image: sm.create_model(
                ModelName=unique("image"),
                PrimaryContainer={"Image": image},
                ExecutionRoleArn=ROLE,
            )
        )
        assert f"PrimaryContainer.Image: the container image '{image}'" in message
        assert "auth.allow_images" in message
    request = job_request(unique("image"), roots / "data" / "never")
    request["AlgorithmSpecification"]["TrainingImage"] = "docker.io/library/python:3"
    message = refused(lambda: sm.create_training_job(**request))
    assert "AlgorithmSpecification.TrainingImage: the container image" in message
    sm.create_model(
        ModelName=unique("image"),
        PrimaryContainer={"Image": "registry.example.com/team/server:1"},
        ExecutionRoleArn=ROLE,
    )


def test_a_transform_may_not_choose_the_code_its_model_runs(
    guarded: GatewayProcess, roots: Path
) -> None:
    """A key allowed only CreateTransformJob set SAGEMAKER_SUBMIT_DIRECTORY and
    SAGEMAKER_PROGRAM on the job and so ran code of its own choosing."""
    sm = client(guarded, "sagemaker")
    for name, value in (
        ("SAGEMAKER_SUBMIT_DIRECTORY", (roots / "models" / "job_code").as_uri()),
        ("SAGEMAKER_PROGRAM", "train.py"),
    ):
        message = refused(
            lambda name=name, value=value: sm.create_transform_job(
                TransformJobName=unique("code"),
                ModelName="echo",
                TransformInput={
                    "DataSource": {
                        "S3DataSource": {
                            "S3DataType": "S3Prefix",
                            "S3Uri": (roots / "data").as_uri(),
                        }
                    }
                },
                TransformOutput={"S3OutputPath": (roots / "data" / "never").as_uri()},
                TransformResources={"InstanceType": "ml.m5.large", "InstanceCount": 1},
                Environment={name: value},
            )
        )
        assert f"'{name}' chooses the code" in message


# -- finding 4: templates put live obey the rules of CreateTrainingJob ---------------


def put_stack(gw: GatewayProcess, change: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, body = signed_http(gw, "PUT", "/stack", json.dumps(change).encode())
    return status, json.loads(body)


def test_a_template_put_live_is_checked_like_create_training_job(
    guarded: GatewayProcess, roots: Path
) -> None:
    """Finding 4: a cmd: template installed through PUT /stack started on POST /inference."""
    marker = roots / "marker"

    def jobs(template: dict[str, Any]) -> dict[str, Any]:
        return {
            "stack": "live",
            "jobs": {
                "white_list": ["evil"],
                "s3_bucket": (roots / "data" / "jobs").as_uri(),
                "templates": {"evil": template},
            },
        }

    spec = {"TrainingImage": f"cmd:touch {marker}", "TrainingInputMode": "File"}
    status, body = put_stack(guarded, jobs({"AlgorithmSpecification": spec}))
    assert status == 400, body
    assert "jobs.templates.evil" in body["message"] and "allow_commands" in body["message"]
    python = {"TrainingImage": "shipyard/python", "TrainingInputMode": "File"}
    for template, words in [
        (
            {"AlgorithmSpecification": python, "Environment": {"PYTHONWARNINGS": "x"},
             "HyperParameters": {"sagemaker_program": "infer.py"}},
            "'PYTHONWARNINGS'",
        ),
        (
            {"AlgorithmSpecification": python,
             "HyperParameters": {"sagemaker_program": "infer.py",
                                 "sagemaker_submit_directory": "FILE:///etc"}},
            "sagemaker_submit_directory",
        ),
    ]:  # fmt: skip
        status, body = put_stack(guarded, jobs(template))
        assert status == 400 and words in body["message"], body
    status, _, answer = signed_http(guarded, "POST", "/inference", b'{"type": "evil"}')
    assert status != 200, answer
    status, _, snapshot = signed_http(guarded, "GET", "/stack")
    assert "evil" not in json.loads(snapshot)["jobs"]["templates"]
    assert not marker.exists()


# -- finding 8: notifications reach only the operator's targets ----------------------


def test_notification_targets_outside_notify_targets_are_refused(
    guarded: GatewayProcess, roots: Path
) -> None:
    """Finding 8: any key that may create a config made the gateway post anywhere."""
    sm = client(guarded, "sagemaker")

    def config(topic: str) -> Any:
        return lambda: sm.create_endpoint_config(
            EndpointConfigName=unique("notify"),
            ProductionVariants=[
                {
                    "VariantName": "v1",
                    "ModelName": "echo",
                    "InstanceType": "ml.m5.large",
                    "InitialInstanceCount": 1,
                }
            ],
            AsyncInferenceConfig={
                "OutputConfig": {
                    "S3OutputPath": (roots / "data" / "async").as_uri(),
                    "NotificationConfig": {"SuccessTopic": topic},
                }
            },
        )

    for target in ("http://169.254.169.254/latest", "json://10.0.0.1/hook",
                   "mailto://ops@mail.internal", "http://127.0.0.1:9/elsewhere/x"):  # fmt: skip
        message = refused(config(target))
        assert "NotificationConfig.SuccessTopic" in message and target in message
        assert "auth.notify_targets" in message
    config("http://127.0.0.1:9/allowed/hook")()
    # A stack file's topics are the operator's, put live or read at start.
    status, body = put_stack(
        guarded, {"stack": "hooks", "put_topics": {"ops": ["json://127.0.0.1:9/ops"]}}
    )
    assert status == 200, body


def test_the_gateways_home_is_no_callers_location_even_under_a_root(tmp_path: Path) -> None:
    """A root that contains the gateway's home does not make the home a caller's: its
    store, logs and caches are refused as a model's data (the sandbox hides them too)."""
    stack = write_stack(tmp_path / "stack.yaml", file_roots=[str(tmp_path)], sandbox=False)
    gw = start_gateway(tmp_path / "home", extra_env=SECRETS, args=["--config", str(stack)])
    try:
        sm = client(gw, "sagemaker")
        for url in ((tmp_path / "home" / "shipyard.db").as_uri(), str(tmp_path / "home")):
            message = refused(
                lambda url=url: sm.create_model(
                    ModelName=unique("home"),
                    PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url},
                    ExecutionRoleArn=ROLE,
                )
            )
            assert "gateway's home" in message, message
    finally:
        gw.stop()
