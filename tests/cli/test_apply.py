"""``shipyard apply`` and ``shipyard destroy`` against a real gateway, and bad stack files."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from shipyard.cli import app
from shipyard.cli.client import Gateway, translated
from shipyard.errors import GatewayError
from shipyard.stackfile import StackFile
from tests.conftest import GatewayProcess, make_tarball, start_gateway

ROLE = "arn:aws:iam::123456789012:role/x"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = start_gateway(tmp_path_factory.mktemp("apply") / "home")
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("artifacts")
    return {m: make_tarball(m, root / f"{m}.tar.gz").as_uri() for m in ("echo", "load_fails")}


def stack(prefix: str, model_url: str, *, weight: float = 1.0, target: float = 1000) -> dict:
    """Model, config, endpoint and scaling, all named after ``prefix``."""
    return {
        "models": {
            prefix: {
                "PrimaryContainer": {"Image": "shipyard/python", "ModelDataUrl": model_url},
                "ExecutionRoleArn": ROLE,
            }
        },
        "endpoint_configs": {
            f"{prefix}-cfg": {
                "ProductionVariants": [
                    {
                        "VariantName": "v1",
                        "ModelName": prefix,
                        "InstanceType": "ml.m5.large",
                        "InitialInstanceCount": 1,
                        "InitialVariantWeight": weight,
                    }
                ]
            }
        },
        "endpoints": {prefix: {"EndpointConfigName": f"{prefix}-cfg"}},
        # Min = max = 1: the autoscaler has no step to take while the test runs.
        "scaling": {f"{prefix}/v1": {"MinCapacity": 1, "MaxCapacity": 1, "TargetValue": target}},
    }


def write(path: Path, content: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def shipyard(gw: GatewayProcess, *args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(app, [*args, "--url", gw.url], input=stdin)


def plan_rows(output: str) -> list[tuple[str, str, str, str]]:
    """(resource, name, action, detail) of each row of the printed plan."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 4 and cells[2] in ("create", "update", "delete", "unchanged"):
            rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def actions(output: str) -> list[tuple[str, str, str]]:
    """(resource, name, action) of each row, sorted."""
    return sorted((kind, name, action) for kind, name, action, _ in plan_rows(output))


def all_four(prefix: str, action: str) -> list[tuple[str, str, str]]:
    return sorted(
        [
            ("model", prefix, action),
            ("endpoint config", f"{prefix}-cfg", action),
            ("endpoint", prefix, action),
            ("scaling", f"{prefix}/v1", action),
        ]
    )


def test_apply_change_reapply_destroy(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    sm = gw.sm
    # Not the stack's: neither apply nor destroy may touch it.
    sm.create_model(
        ModelName="bystander",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": artifacts["echo"]},
        ExecutionRoleArn=ROLE,
    )
    path = write(tmp_path / "web.yaml", stack("web", artifacts["echo"]))

    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == all_four("web", "create")
    assert sm.describe_endpoint(EndpointName="web")["EndpointStatus"] == "InService"
    answer = gw.rt.invoke_endpoint(EndpointName="web", Body=b'{"x": 1}')
    assert answer["Body"].read() == b'{"x": 1}'

    write(path, stack("web", artifacts["echo"], weight=2.0, target=500))
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == sorted(
        [
            ("model", "web", "unchanged"),
            ("endpoint config", "web-cfg", "update"),
            ("endpoint", "web", "update"),
            ("scaling", "web/v1", "update"),
        ]
    )
    details = {(kind, name): detail for kind, name, _, detail in plan_rows(out.stdout)}
    new_config = re.search(
        r"new version (web-cfg-\w+), was web-cfg", details["endpoint config", "web-cfg"]
    )
    assert new_config, details
    described = sm.describe_endpoint(EndpointName="web")
    assert described["EndpointConfigName"] == new_config.group(1)
    assert described["ProductionVariants"][0]["CurrentWeight"] == 2.0
    configs = {c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]}
    assert new_config.group(1) in configs and "web-cfg" not in configs  # the old version went
    policies = gw.client("application-autoscaling").describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId="endpoint/web/variant/v1"
    )["ScalingPolicies"]
    assert [p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] for p in policies] == [
        500.0
    ]

    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == all_four("web", "unchanged")
    assert "Nothing to change." in out.stdout

    out = shipyard(gw, "destroy", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == all_four("web", "delete")
    assert not [e for e in sm.list_endpoints()["Endpoints"] if e["EndpointName"] == "web"]
    assert {m["ModelName"] for m in sm.list_models()["Models"]} & {"web", "bystander"} == {
        "bystander"
    }
    assert not [
        c
        for c in sm.list_endpoint_configs()["EndpointConfigs"]
        if c["EndpointConfigName"].startswith("web")
    ]
    out = shipyard(gw, "destroy", str(path), "--yes")
    assert out.exit_code == 0 and "Nothing of stack web to destroy." in out.stdout
    sm.delete_model(ModelName="bystander")


def test_apply_deletes_only_what_the_stack_created_and_the_file_dropped(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    sm = gw.sm
    content = stack("keep", artifacts["echo"])
    extra = stack("drop", artifacts["echo"])
    for section in content:
        content[section].update(extra[section])
    path = write(tmp_path / "two.yaml", content)
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output

    for section in content:
        for name in list(content[section]):
            if name.startswith("drop"):
                del content[section][name]
    write(path, content)
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == sorted(all_four("keep", "unchanged") + all_four("drop", "delete"))
    names = {e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]}
    assert "keep" in names and "drop" not in names

    # Tags, an endpoint's only other field, change in place.
    content["endpoints"]["keep"]["Tags"] = [{"Key": "team", "Value": "search"}]
    write(path, content)
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert [r for r in plan_rows(out.stdout) if r[2] != "unchanged"] == [
        ("endpoint", "keep", "update", "tags")
    ]
    arn = sm.describe_endpoint(EndpointName="keep")["EndpointArn"]
    assert {"Key": "team", "Value": "search"} in sm.list_tags(ResourceArn=arn)["Tags"]
    del content["endpoints"]["keep"]["Tags"]
    write(path, content)
    assert shipyard(gw, "apply", str(path), "--yes").exit_code == 0
    assert "team" not in {t["Key"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}

    # An endpoint of the same name that another stack (or a person) made is not taken over.
    other = write(tmp_path / "other.yaml", stack("keep", artifacts["echo"]))
    out = shipyard(gw, "apply", str(other), "--yes")
    assert out.exit_code == 1
    assert "endpoint keep exists and was not created by stack other" in out.stderr
    out = shipyard(gw, "destroy", str(path), "--yes")
    assert out.exit_code == 0, out.output


def test_a_declined_prompt_changes_nothing_and_yes_goes_ahead(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    sm = gw.sm
    path = write(tmp_path / "ask.yaml", {"models": stack("ask", artifacts["echo"])["models"]})
    out = shipyard(gw, "apply", str(path), stdin="n\n")
    assert out.exit_code == 1
    assert "Apply these changes? [y/N]" in out.stdout
    assert "Apply declined: nothing changed." in out.stderr
    assert "ask" not in {m["ModelName"] for m in sm.list_models()["Models"]}

    out = shipyard(gw, "apply", str(path), stdin="y\n")
    assert out.exit_code == 0, out.output
    assert "ask" in {m["ModelName"] for m in sm.list_models()["Models"]}
    out = shipyard(gw, "destroy", str(path), stdin="n\n")
    assert out.exit_code == 1
    assert "ask" in {m["ModelName"] for m in sm.list_models()["Models"]}
    out = shipyard(gw, "destroy", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert "ask" not in {m["ModelName"] for m in sm.list_models()["Models"]}


def test_a_failed_update_keeps_the_old_version_serving(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    path = write(tmp_path / "rb.yaml", stack("rb", artifacts["echo"]))
    assert shipyard(gw, "apply", str(path), "--yes").exit_code == 0

    write(path, stack("rb", artifacts["load_fails"]))
    out = shipyard(gw, "apply", str(path), "--yes", "--timeout", "60")
    assert out.exit_code == 1
    assert "endpoint rb" in out.stderr and "weights missing" in out.stderr
    answer = gw.rt.invoke_endpoint(EndpointName="rb", Body=b"[1]")
    assert answer["Body"].read() == b"[1]"
    models = {
        m["ModelName"] for m in gw.sm.list_models()["Models"] if m["ModelName"].startswith("rb")
    }
    configs = {
        c["EndpointConfigName"]
        for c in gw.sm.list_endpoint_configs()["EndpointConfigs"]
        if c["EndpointConfigName"].startswith("rb")
    }
    assert len(models) == 2 and "rb" in models  # the new version stays for a next attempt
    assert len(configs) == 2 and "rb-cfg" in configs
    assert gw.sm.describe_endpoint(EndpointName="rb")["EndpointConfigName"] == "rb-cfg"

    # Back to the first file: the endpoint is where it was; the failed versions go.
    write(path, stack("rb", artifacts["echo"]))
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == sorted(
        all_four("rb", "unchanged")
        + [("model", "rb", "delete"), ("endpoint config", "rb-cfg", "delete")]
    )
    assert [d for *_, a, d in plan_rows(out.stdout) if a == "delete"] == [
        "old version " + next(c for c in configs if c != "rb-cfg"),
        "old version " + next(m for m in models if m != "rb"),
    ]
    assert {
        m["ModelName"] for m in gw.sm.list_models()["Models"] if m["ModelName"].startswith("rb")
    } == {"rb"}
    assert shipyard(gw, "destroy", str(path), "--yes").exit_code == 0


BAD = [
    (
        "endpoint_configs:\n  a:\n    ProductionVariants:\n      - VariantName: v1\n"
        "        InitialVariantWeight: heavy\n",
        "bad.yaml:5: endpoint_configs.a.ProductionVariants[0].InitialVariantWeight: "
        "Input should be a valid number",
    ),
    (
        "models: {}\nendpoints:\n  e: {EndpointConfigName: c, Extra: 1}\n",
        "bad.yaml:3: endpoints.e.Extra: Extra inputs are not permitted",
    ),
    (
        "endpoints:\n  e: {EndpointConfigName: c}\nscaling:\n"
        "  other/v1: {MinCapacity: 1, MaxCapacity: 2, TargetValue: 5}\n",
        "bad.yaml:4: scaling.other/v1: endpoint 'other' is not declared",
    ),
    (
        "topics:\n  done: [json://127.0.0.1:9/x]\njobs:\n  notify:\n    Completed: [nope]\n",
        "bad.yaml:5: jobs.notify.Completed: unknown topic 'nope'",
    ),
    ("jobs:\n  limit: 0\n", "bad.yaml:2: jobs.limit: Input should be greater than or equal to 1"),
    # Numbers and switches are taken as written, not coerced from strings or booleans.
    ('jobs:\n  limit: "3"\n', "bad.yaml:2: jobs.limit: Input should be a valid integer"),
    ("jobs:\n  limit: true\n", "bad.yaml:2: jobs.limit: Input should be a valid integer"),
    (
        "endpoints:\n  e: {EndpointConfigName: c}\nscaling:\n"
        '  e/v1: {MinCapacity: 1, MaxCapacity: "2", TargetValue: 5}\n',
        "bad.yaml:4: scaling.e/v1.MaxCapacity: Input should be a valid integer",
    ),
    (
        "auth:\n  keys: [{access_key_id: AK, secret_access_key_env: S}]\n"
        '  allow_commands: "false"\n',
        "bad.yaml:3: auth.allow_commands: Input should be a valid boolean",
    ),
    ("models: [\n", "bad.yaml:2: expected the node content"),
    ("- a\n- b\n", "bad.yaml:1: a stack file is a YAML mapping"),
    ("modles: {}\n", "bad.yaml:1: modles: Extra inputs are not permitted"),
]


@pytest.mark.parametrize(("text", "error"), BAD)
def test_a_bad_stack_file_names_the_line_and_the_field(
    tmp_path: Path, text: str, error: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as raised:
        StackFile.load(path)
    assert str(raised.value).replace(str(tmp_path) + "/", "").startswith(error)


def test_apply_refuses_a_bad_file_before_asking_the_gateway(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD[0][0])
    # No gateway at this URL: a bad file is reported first, with exit code 2.
    out = CliRunner().invoke(app, ["apply", str(path), "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 2
    assert f"error: {path}:5: endpoint_configs.a.ProductionVariants[0]" in out.stderr


def test_a_field_the_gateway_does_not_do_stops_apply_before_asking_it(tmp_path: Path) -> None:
    content = stack("ssm", "file:///srv/model.tar.gz")
    content["endpoint_configs"]["ssm-cfg"]["ProductionVariants"][0]["EnableSSMAccess"] = True
    content["models"]["ssm"]["EnableNetworkIsolation"] = False  # what happens anyway
    path = write(tmp_path / "ssm.yaml", content)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "SSM" in text)
    # No gateway at this URL: the file is refused first, with exit code 2.
    out = CliRunner().invoke(app, ["apply", str(path), "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 2, out.output
    assert out.stderr.splitlines() == [
        f"error: {path}:{line}: endpoint_configs.ssm-cfg.ProductionVariants[0].EnableSSMAccess: "
        "not supported: true asks for SSM sessions into the instances, which this gateway "
        "does not give."
    ], out.stderr


def test_a_field_the_create_calls_refuse_stops_apply_before_any_change(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    content = stack("half", artifacts["echo"])
    content["endpoint_configs"]["half-cfg"]["ProductionVariants"][0]["Bogus"] = 3
    content["endpoints"]["half"]["DeploymentConfig"] = {"BlueGreenUpdatePolicy": {}}
    path = write(tmp_path / "half.yaml", content)
    lines = path.read_text().splitlines()
    bogus = next(n for n, line in enumerate(lines, 1) if "Bogus" in line)
    policy = next(n for n, line in enumerate(lines, 1) if "BlueGreenUpdatePolicy" in line)

    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 2, out.output
    errors = out.stderr.splitlines()
    assert errors[0].startswith(
        f"error: {path}:{bogus}: endpoint_configs.half-cfg.ProductionVariants[0].Bogus: "
        "unknown field; valid here: VariantName, ModelName,"
    ), errors
    assert errors[1] == (
        f"error: {path}:{policy}: endpoints.half.DeploymentConfig.BlueGreenUpdatePolicy."
        "TrafficRoutingConfiguration: required field missing"
    ), errors
    assert "cannot reach" not in out.output
    # Nothing was applied: not even the model, which comes before the config.
    assert "half" not in {m["ModelName"] for m in gw.sm.list_models()["Models"]}


def test_a_gateway_variable_in_any_environment_stops_apply_before_any_change(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    """The gateway refuses its own variables to every caller, with auth: or without: the
    file is refused whole rather than model ``gvok`` created and ``gvbad`` refused."""
    content = stack("gvok", artifacts["echo"])
    content["models"]["gvbad"] = {
        "Containers": [
            {"Image": "shipyard/python", "ModelDataUrl": artifacts["echo"]},
            {
                "Image": "shipyard/python",
                "ModelDataUrl": artifacts["echo"],
                "Environment": {"SHIPYARD_INSTANCE_ID": "x"},
            },
        ],
        "ExecutionRoleArn": ROLE,
    }
    content["inference_components"] = {
        "gvc": {
            "EndpointName": "gvok",
            "VariantName": "v1",
            "Specification": {
                "Container": {
                    "Image": "shipyard/python",
                    "ArtifactUrl": artifacts["echo"],
                    "Environment": {"SAGEMAKER_BIND_TO_PORT": "1"},
                },
                "ComputeResourceRequirements": {"MinMemoryRequiredInMb": 512},
            },
            "RuntimeConfig": {"CopyCount": 1},
        }
    }
    content["jobs"] = {"templates": {"train": {"Environment": {"SHIPYARD_WORKER_SOCKET": "x"}}}}
    path = write(tmp_path / "gv.yaml", content)
    lines = path.read_text().splitlines()

    def line(name: str) -> int:
        return next(n for n, text in enumerate(lines, 1) if name in text)

    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 2, out.output
    own = "is the gateway's own variable, set by the gateway itself; a caller may never set it."
    assert out.stderr.splitlines() == [
        f"error: {path}:{line('SHIPYARD_INSTANCE_ID')}: models.gvbad.Containers[1].Environment."
        f"SHIPYARD_INSTANCE_ID: 'SHIPYARD_INSTANCE_ID' {own}",
        f"error: {path}:{line('SAGEMAKER_BIND_TO_PORT')}: inference_components.gvc."
        f"Specification.Container.Environment.SAGEMAKER_BIND_TO_PORT: "
        f"'SAGEMAKER_BIND_TO_PORT' {own}",
        f"error: {path}:{line('SHIPYARD_WORKER_SOCKET')}: jobs.templates.train.Environment."
        f"SHIPYARD_WORKER_SOCKET: 'SHIPYARD_WORKER_SOCKET' {own}",
    ], out.stderr
    # Nothing was applied: not even model gvok, which is fine and comes first.
    assert not {"gvok", "gvbad"} & {m["ModelName"] for m in gw.sm.list_models()["Models"]}
    # The gateway says the same of the model when asked: the rule is one.
    with pytest.raises(gw.sm.exceptions.ClientError) as refused:
        gw.sm.create_model(ModelName="gvbad", **content["models"]["gvbad"])
    assert f"'SHIPYARD_INSTANCE_ID' {own}" in str(refused.value)


def test_the_scaling_calls_checked_are_the_ones_apply_sends(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shipyard.cli import shapes

    checked: dict[str, dict[str, Any]] = {}
    validate = shapes._validate

    def recorded(service: str, operation: str, params: dict[str, Any]) -> Any:
        if service == "application-autoscaling":
            checked[operation] = params
        return validate(service, operation, params)

    monkeypatch.setattr(shapes, "_validate", recorded)
    content = stack("sc", artifacts["echo"])
    content["scaling"]["sc/v1"]["ScaleInCooldown"] = 30
    path = write(tmp_path / "scstack.yaml", content)
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    try:
        scaling = gw.client("application-autoscaling")
        where = {"ServiceNamespace": "sagemaker", "ResourceIds": ["endpoint/sc/variant/v1"]}
        [target] = scaling.describe_scalable_targets(**where)["ScalableTargets"]
        [policy] = scaling.describe_scaling_policies(
            ServiceNamespace="sagemaker", ResourceId="endpoint/sc/variant/v1"
        )["ScalingPolicies"]
        sent_target = {k: target[k] for k in checked["RegisterScalableTarget"]}
        assert checked["RegisterScalableTarget"] == sent_target
        assert set(checked["RegisterScalableTarget"]) >= {"MinCapacity", "MaxCapacity"}
        sent_policy = {k: policy[k] for k in checked["PutScalingPolicy"]}
        assert checked["PutScalingPolicy"] == sent_policy
        assert sent_policy["PolicyName"] == "shipyard-stack-scstack"
    finally:
        assert shipyard(gw, "destroy", str(path), "--yes").exit_code == 0


def test_a_request_boto3_refuses_is_reported_as_invalid_not_as_unreachable() -> None:
    # No gateway at this URL: boto3 refuses the call before trying to send it.
    gateway = Gateway("http://127.0.0.1:9")
    with pytest.raises(GatewayError) as raised, translated(gateway.url, about="model m"):
        gateway.sagemaker.create_model(ModelName="m", Bogus=1)
    message = str(raised.value)
    assert message.startswith(
        'model m: invalid request, not sent: Unknown parameter in input: "Bogus"'
    )
    assert "cannot reach" not in message


def test_topics_and_job_templates_are_applied_to_the_running_gateway(
    gateway_factory: Any, tmp_path: Path
) -> None:
    """The gateway starts with site.yaml's topics and jobs (stack "site", by the file's
    stem); apply changes them live, another stack may not touch them, destroy removes
    them."""
    scripts = Path(__file__).parent / "scripts"
    template = {
        "AlgorithmSpecification": {"TrainingImage": "shipyard/python", "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": "job.py",
            "sagemaker_submit_directory": scripts.as_uri(),
            "mode": "lines",
            "count": "1",
        },
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    }
    content: dict[str, Any] = {
        "topics": {"done": ["json://127.0.0.1:9/hook"]},
        "jobs": {
            "limit": 1,
            "white_list": ["a"],
            "s3_bucket": (tmp_path / "out").as_uri(),
            "templates": {"a": template},
            "notify": {"Completed": ["done"]},
        },
    }
    path = write(tmp_path / "site.yaml", content)
    gw = gateway_factory(
        args=["--config", str(path)], extra_env={"SHIPYARD_JOB_POLL_PERIOD_S": "0.2"}
    )

    def submit(job_type: str) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"type": job_type}).encode()
        request = urllib.request.Request(
            gw.url + "/inference",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == sorted(
        [("topic", "done", "unchanged"), ("job template", "a", "unchanged"),
         ("jobs settings", "jobs", "unchanged")]
    )  # fmt: skip
    assert submit("b")[0] == 510

    content["topics"]["done"] = ["json://127.0.0.1:10/hook"]
    content["jobs"]["templates"]["b"] = template
    content["jobs"]["white_list"].append("b")
    write(path, content)
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == sorted(
        [("topic", "done", "update"), ("job template", "a", "unchanged"),
         ("job template", "b", "create"), ("jobs settings", "jobs", "update")]
    )  # fmt: skip
    status, answer = submit("b")
    assert status == 200, answer
    gw.sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName=answer["jobName"], WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    out = shipyard(gw, "apply", str(path), "--yes")
    assert "Nothing to change." in out.stdout

    other = write(tmp_path / "other.yaml", {"topics": {"done": ["json://127.0.0.1:11/x"]}})
    out = shipyard(gw, "apply", str(other), "--yes")
    assert out.exit_code == 1 and "topic done belongs to stack site" in out.stderr

    out = shipyard(gw, "destroy", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == sorted(
        [("topic", "done", "delete"), ("job template", "a", "delete"),
         ("job template", "b", "delete"), ("jobs settings", "jobs", "delete")]
    )  # fmt: skip
    assert submit("a")[0] == 510
    status, body = gw.get("/stack")
    assert json.loads(body)["topics"] == {}


def test_apply_signs_its_calls_and_needs_the_stack_actions(
    gateway_factory: Any, tmp_path: Path
) -> None:
    """With ``auth:``, apply signs with the usual AWS credentials; a key without
    shipyard:GetStack is refused before anything changes."""
    secrets = {"SHIPYARD_KEY_OPS": "ops-secret", "SHIPYARD_KEY_RO": "ro-secret"}
    keys = [
        {"access_key_id": "ops", "secret_access_key_env": "SHIPYARD_KEY_OPS"},
        {"access_key_id": "ro", "secret_access_key_env": "SHIPYARD_KEY_RO",
         "allow": ["sagemaker:Describe*", "sagemaker:List*", "application-autoscaling:Describe*"]},
    ]  # fmt: skip
    config = write(tmp_path / "gw.yaml", {"auth": {"keys": keys}})
    gw = gateway_factory(args=["--config", str(config)], extra_env=secrets)
    path = write(tmp_path / "alerts.yaml", {"topics": {"ops": ["json://127.0.0.1:9/x"]}})

    def as_key(key: str, secret: str, *args: str) -> Any:
        env = {
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        }
        return CliRunner().invoke(app, [*args, "--url", gw.url], env=env)

    out = as_key("ro", "ro-secret", "apply", str(path), "--yes")
    assert out.exit_code == 1
    assert "not authorized to perform: shipyard:GetStack" in out.stderr
    out = as_key("ops", "ops-secret", "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert actions(out.stdout) == [("topic", "ops", "create")]
    out = as_key("ops", "ops-secret", "destroy", str(path), "--yes")
    assert out.exit_code == 0, out.output


def components_stack(
    model_url: str, *, copies: int, cores: float = 0.5, adapter: bool = False
) -> dict[str, Any]:
    """A model, an endpoint config without models, its endpoint and one component (and
    an adapter on it, declared first)."""
    adapters = {
        "icc-a": {
            "EndpointName": "ichost",
            "Specification": {
                "BaseInferenceComponentName": "icc",
                "Container": {"ArtifactUrl": model_url},
            },
        }
    }
    return {
        "models": {
            "icm": {
                "PrimaryContainer": {"Image": "shipyard/python", "ModelDataUrl": model_url},
                "ExecutionRoleArn": ROLE,
            }
        },
        "endpoint_configs": {
            "ichost": {
                "ExecutionRoleArn": ROLE,
                "ProductionVariants": [
                    {"VariantName": "AllTraffic", "InstanceType": "ml.m5.large",
                     "InitialInstanceCount": 1}
                ],
            }
        },
        "endpoints": {"ichost": {"EndpointConfigName": "ichost"}},
        "inference_components": {
            **(adapters if adapter else {}),
            "icc": {
                "EndpointName": "ichost",
                "Specification": {
                    "ModelName": "icm",
                    "ComputeResourceRequirements": {
                        "NumberOfCpuCoresRequired": cores, "MinMemoryRequiredInMb": 512,
                    },
                },
                "RuntimeConfig": {"CopyCount": copies},
            }
        },
    }  # fmt: skip


def test_inference_components_are_applied_updated_and_destroyed(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    sm = gw.sm
    path = write(tmp_path / "ic.yaml", components_stack(artifacts["echo"], copies=1))
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert ("inference component", "icc", "create") in actions(out.stdout)
    described = sm.describe_inference_component(InferenceComponentName="icc")
    assert described["InferenceComponentStatus"] == "InService"
    assert described["RuntimeConfig"]["CurrentCopyCount"] == 1
    answer = gw.rt.invoke_endpoint(
        EndpointName="ichost", InferenceComponentName="icc", Body=b'{"x": 2}'
    )
    assert answer["Body"].read() == b'{"x": 2}'

    write(path, components_stack(artifacts["echo"], copies=2, adapter=True))
    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert ("inference component", "icc", "update") in actions(out.stdout)
    assert ("inference component", "icc-a", "create") in actions(out.stdout)
    adapted = gw.rt.invoke_endpoint(
        EndpointName="ichost", InferenceComponentName="icc-a", Body=b'{"x": 3}'
    )
    assert adapted["Body"].read() == b'{"x": 3}'
    assert ("endpoint", "ichost", "unchanged") in actions(out.stdout)
    described = sm.describe_inference_component(InferenceComponentName="icc")
    assert described["RuntimeConfig"] == {"DesiredCopyCount": 2, "CurrentCopyCount": 2}

    out = shipyard(gw, "apply", str(path), "--yes")
    assert out.exit_code == 0 and "Nothing to change." in out.stdout, out.output

    out = shipyard(gw, "destroy", str(path), "--yes")
    assert out.exit_code == 0, out.output
    assert ("inference component", "icc", "delete") in actions(out.stdout)
    assert ("inference component", "icc-a", "delete") in actions(out.stdout)
    assert sm.list_inference_components(EndpointNameEquals="ichost")["InferenceComponents"] == []
    assert "icm" not in {m["ModelName"] for m in sm.list_models()["Models"]}


def test_alarms_and_deployment_configs_are_applied_and_destroyed(
    gw: GatewayProcess, artifacts: dict[str, str], tmp_path: Path
) -> None:
    content = stack("guarded", artifacts["echo"])
    del content["scaling"]
    alarm = {
        "Namespace": "AWS/SageMaker", "MetricName": "Invocation5XXErrors",
        "Dimensions": [{"Name": "EndpointName", "Value": "guarded"},
                       {"Name": "VariantName", "Value": "v1"}],
        "Statistic": "Sum", "Period": 60, "EvaluationPeriods": 1, "Threshold": 5.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
    }  # fmt: skip
    content["alarms"] = {"guarded-errors": alarm}
    deployment = {
        "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
            "Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}},
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "guarded-errors"}]},
    }  # fmt: skip
    content["endpoints"]["guarded"]["DeploymentConfig"] = deployment
    file = write(tmp_path / "stack.yaml", content)
    done = shipyard(gw, "apply", str(file), "--yes")
    assert done.exit_code == 0, done.output
    assert ("alarm", "guarded-errors", "create") in actions(done.output)
    cloudwatch = gw.client("cloudwatch")
    described = cloudwatch.describe_alarms(AlarmNames=["guarded-errors"])["MetricAlarms"][0]
    assert described["Threshold"] == 5.0
    assert gw.sm.describe_endpoint(EndpointName="guarded")["LastDeploymentConfig"] == deployment

    again = shipyard(gw, "apply", str(file), "--yes")
    assert ("alarm", "guarded-errors", "unchanged") in actions(again.output), again.output

    # A new model version: the endpoint moves to it as its DeploymentConfig says.
    content["models"]["guarded"]["PrimaryContainer"]["Environment"] = {"V": "2"}
    content["alarms"]["guarded-errors"]["Threshold"] = 9.0
    changed = shipyard(gw, "apply", str(write(file, content)), "--yes")
    assert changed.exit_code == 0, changed.output
    assert ("alarm", "guarded-errors", "update") in actions(changed.output)
    described = cloudwatch.describe_alarms(AlarmNames=["guarded-errors"])["MetricAlarms"][0]
    assert described["Threshold"] == 9.0
    endpoint = gw.sm.describe_endpoint(EndpointName="guarded")
    assert endpoint["EndpointStatus"] == "InService" and "FailureReason" not in endpoint
    assert endpoint["EndpointConfigName"] != "guarded-cfg"  # the config's new version

    # An alarm someone else made is not the stack's to change.
    cloudwatch.put_metric_alarm(AlarmName="not-ours", **alarm)
    content["alarms"]["not-ours"] = alarm
    refused = shipyard(gw, "apply", str(write(file, content)), "--yes")
    assert refused.exit_code != 0 and "not created by stack" in refused.output
    del content["alarms"]["not-ours"]
    cloudwatch.delete_alarms(AlarmNames=["not-ours"])

    gone = shipyard(gw, "destroy", str(file), "--yes")
    assert gone.exit_code == 0, gone.output
    assert ("alarm", "guarded-errors", "delete") in actions(gone.output)
    assert cloudwatch.describe_alarms(AlarmNames=["guarded-errors"])["MetricAlarms"] == []
