"""Multi-model endpoints end to end: boto3, a real gateway, real instance processes.

Models are the small numpy linear models of tests/runtime/mme_models.py: each answers
with its own coefficients and appends its name to ``MME_LOAD_COUNTER_FILE`` on every
load, which the model's Environment passes to the instances.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, wait_in_service
from tests.runtime.mme_models import COUNTER_ENV, LinearModel, load_counts, write_model

ROWS = [[1, 2], [3, -4]]
MIB = 2**20


def _deploy_mme(
    gw: GatewayProcess,
    name: str,
    prefix: Path,
    *,
    count: int = 1,
    image: str = "shipyard/python",
    environment: dict[str, str] | None = None,
) -> Path:
    """A MultiModel model, config and endpoint serving ``prefix``; returns the load counter."""
    counter = gw.home / f"{name}-loads.txt"
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": image,
            "Mode": "MultiModel",
            "ModelDataUrl": prefix.as_uri(),
            "MultiModelConfig": {"ModelCacheSetting": "Enabled"},
            "Environment": {COUNTER_ENV: str(counter), **(environment or {})},
        },
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": name,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": count,
            }
        ],
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gw.sm, name)
    return counter


def _invoke(gw: GatewayProcess, endpoint: str, target: str, rows: object = ROWS) -> Any:
    out = gw.rt.invoke_endpoint(
        EndpointName=endpoint,
        ContentType="application/json",
        Body=json.dumps(rows).encode(),
        TargetModel=target,
    )
    return json.loads(out["Body"].read())


def _refused(gw: GatewayProcess, endpoint: str, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as err:
        gw.client("sagemaker-runtime", max_attempts=1).invoke_endpoint(
            EndpointName=endpoint, ContentType="application/json", Body=b"[[1, 2]]", **kwargs
        )
    response: dict[str, Any] = err.value.response
    return response


def _expected(model: LinearModel) -> dict[str, Any]:
    return {"model": model.name, "predictions": model.predict(ROWS)}


def _metric(gw: GatewayProcess, name: str, **labels: str) -> dict[str, float]:
    """Samples of ``name`` whose labels include ``labels``, by their instance label."""
    out: dict[str, float] = {}
    for line in gw.get("/metrics")[1].decode().splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            out[found.get("instance", "")] = float(match.group(2))
    return out


def test_create_model_validates_multi_model_containers(gateway: GatewayProcess) -> None:
    sm = gateway.sm
    bad = [
        ({"Mode": "MultiModel"}, "ModelDataUrl must be provided when Mode is MultiModel"),
        ({"Mode": "MultiModel", "ModelDataUrl": "models/"}, "not a valid multi-model prefix"),
        (
            {"ModelDataUrl": "/m", "MultiModelConfig": {"ModelCacheSetting": "Enabled"}},
            "only valid for a container whose Mode is MultiModel",
        ),
        (
            {
                "Mode": "MultiModel",
                "ModelDataUrl": "/m",
                "Environment": {"SHIPYARD_MODEL_CACHE_BYTES": "lots"},
            },
            "SHIPYARD_MODEL_CACHE_BYTES must be a whole number above 0, got 'lots'",
        ),
        ({"Mode": "Multi", "ModelDataUrl": "/m"}, "Member must satisfy enum value set"),
    ]
    for fields, message in bad:
        with pytest.raises(ClientError) as err:
            sm.create_model(ModelName="m", PrimaryContainer={"Image": "shipyard/python", **fields})
        assert err.value.response["Error"]["Code"] == "ValidationException"
        assert message in err.value.response["Error"]["Message"]
    container = {
        "Image": "shipyard/python",
        "Mode": "MultiModel",
        "ModelDataUrl": "s3://bucket/models/",
        "MultiModelConfig": {"ModelCacheSetting": "Disabled"},
    }
    sm.create_model(ModelName="mme", PrimaryContainer=container)
    assert sm.describe_model(ModelName="mme")["PrimaryContainer"] == container
    sm.create_model(ModelName="single", PrimaryContainer={"Image": "shipyard/python"})
    assert sm.describe_model(ModelName="single")["PrimaryContainer"]["Mode"] == "SingleModel"
    with pytest.raises(ClientError) as err:  # InvokeEndpointAsync cannot name a TargetModel
        sm.create_endpoint_config(
            EndpointConfigName="async",
            ProductionVariants=[
                {"VariantName": "v1", "ModelName": "mme", "InstanceType": "ml.m5.large",
                 "InitialInstanceCount": 1}
            ],
            AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": "file:///tmp/out"}},
        )  # fmt: skip
    assert "MultiModel" in err.value.response["Error"]["Message"]


def test_each_target_model_answers_and_bad_names_are_validation_errors(
    gateway: GatewayProcess, tmp_path: Path, model_tarball: Callable[[str], str]
) -> None:
    prefix = tmp_path / "prefix"
    models = [write_model(prefix, f"model-{i}.tar.gz") for i in range(3)]
    models.append(write_model(prefix, "team/nested.tar.gz"))
    write_model(prefix, "broken.tar.gz", fail=True)
    _deploy_mme(gateway, "mme", prefix)
    answers = [_invoke(gateway, "mme", m.name) for m in models]
    assert answers == [_expected(m) for m in models]
    late = write_model(prefix, "late.tar.gz")  # after InService: no update needed
    assert _invoke(gateway, "mme", "late.tar.gz") == _expected(late)
    for target in ("../x", "/etc/passwd", "a/../../b"):
        error = _refused(gateway, "mme", TargetModel=target)["Error"]
        assert (error["Code"], target in error["Message"]) == ("ValidationError", True)
    missing = _refused(gateway, "mme", TargetModel="Houston_TX.tar.gz")
    assert missing["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert missing["Error"]["Code"] == "ValidationError"
    assert "Failed to download model data" in missing["Error"]["Message"]
    assert "Houston_TX.tar.gz" in missing["Error"]["Message"]
    assert "TargetModel" in _refused(gateway, "mme")["Error"]["Message"]
    broken = _refused(gateway, "mme", TargetModel="broken.tar.gz")
    assert (broken["Error"]["Code"], broken["OriginalStatusCode"]) == ("ModelError", 500)
    assert "weights of broken.tar.gz are missing" in broken["OriginalMessage"]
    # A single-model endpoint refuses TargetModel, as SageMaker does.
    deploy(gateway.sm, "echo", model_tarball("echo"))
    single = _refused(gateway, "echo", TargetModel="x")["Error"]
    assert single["Code"] == "ValidationError" and "not a multi-model endpoint" in single["Message"]


def test_concurrent_first_requests_load_a_model_once_and_metrics_show_it(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    slow = write_model(prefix, "slow.tar.gz", load_sleep_s=0.5)
    counter = _deploy_mme(gateway, "mme", prefix)
    answers: list[Any] = []

    def call() -> None:
        request = urllib.request.Request(
            f"{gateway.url}/endpoints/mme/invocations",
            data=json.dumps(ROWS).encode(),
            headers={
                "Content-Type": "application/json",
                "X-Amzn-SageMaker-Target-Model": slow.name,
            },
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            answers.append(json.loads(reply.read()))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [_expected(slow)] * 8
    assert load_counts(counter)[slow.name] == 1
    labels = {"endpoint": "mme", "variant": "v1"}
    hits = sum(_metric(gateway, "shipyard_model_cache_hits_total", **labels).values())
    misses = sum(_metric(gateway, "shipyard_model_cache_misses_total", **labels).values())
    assert (hits + misses, misses >= 1) == (8, True)
    assert _metric(gateway, "shipyard_loaded_models", **labels) == {"mme-v1-1": 1.0}
    for histogram in ("loading_wait", "downloading", "loading"):
        counts = _metric(gateway, f"shipyard_model_{histogram}_seconds_count", **labels)
        assert counts["mme-v1-1"] >= 1, histogram


def test_a_small_budget_evicts_and_an_evicted_model_answers_again(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    """Three 60 MiB models in a 150 MiB budget: the third unloads the first, which still
    answers correctly later, loaded a second time."""
    prefix = tmp_path / "prefix"
    warm = write_model(prefix, "warm.tar.gz")  # imports numpy, so the big ones measure alike
    big = [write_model(prefix, f"big-{i}.tar.gz", ballast_mb=60) for i in range(3)]
    counter = _deploy_mme(
        gateway, "tight", prefix, environment={"SHIPYARD_MODEL_CACHE_BYTES": str(150 * MIB)}
    )
    for model in [warm, *big]:
        assert _invoke(gateway, "tight", model.name) == _expected(model)
    labels = {"endpoint": "tight", "variant": "v1"}
    assert _metric(gateway, "shipyard_model_evictions_total", **labels)["tight-v1-1"] >= 1
    assert _invoke(gateway, "tight", big[0].name) == _expected(big[0])
    assert load_counts(counter)[big[0].name] == 2
    assert _metric(gateway, "shipyard_loaded_models", **labels)["tight-v1-1"] <= 3


def test_requests_for_a_model_stay_on_the_instance_that_holds_it(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    models = [write_model(prefix, f"model-{i}.tar.gz") for i in range(4)]
    counter = _deploy_mme(gateway, "pair", prefix, count=2)
    for _ in range(5):
        for model in models:
            assert _invoke(gateway, "pair", model.name) == _expected(model)
    assert load_counts(counter) == {m.name: 1 for m in models}
    labels = {"endpoint": "pair", "variant": "v1"}
    assert sum(_metric(gateway, "shipyard_model_cache_hits_total", **labels).values()) == 16
    loaded = _metric(gateway, "shipyard_loaded_models", **labels)
    assert loaded == {"pair-v1-1": 2.0, "pair-v1-2": 2.0}  # spread, not duplicated


MME_SERVER = textwrap.dedent(
    '''
    """SageMaker's multi-model container contract, holding at most MAX_MODELS models."""
    import json, os
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path
    from urllib.parse import unquote

    MODELS = {}
    LOG = Path(os.environ["MME_LOAD_COUNTER_FILE"])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status, payload):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/ping":
                return self.reply(200, {})
            listed = [{"modelName": n, "modelUrl": u} for n, (u, _) in MODELS.items()]
            self.reply(200, {"models": listed})

        def do_DELETE(self):
            name = unquote(self.path.split("/")[2])
            with LOG.open("a") as log:
                log.write(f"unload {name}\\n")
            self.reply(200 if MODELS.pop(name, None) else 404, {})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/models":
                request = json.loads(body)
                name = request["model_name"]
                if name in MODELS:
                    return self.reply(409, {})
                if len(MODELS) >= int(os.environ["MAX_MODELS"]):
                    return self.reply(507, {"error": "out of memory"})
                spec = json.loads((Path(request["url"]) / "linear.json").read_text())
                MODELS[name] = (request["url"], spec)
                with LOG.open("a") as log:
                    log.write(f"{name}\\n")
                return self.reply(200, {})
            name = unquote(self.path.split("/")[2])
            if name not in MODELS:
                return self.reply(404, {"error": "not loaded"})
            spec = MODELS[name][1]
            rows = json.loads(body)
            coef, intercept = spec["coef"], spec["intercept"]
            predictions = [intercept + sum(x * c for x, c in zip(r, coef)) for r in rows]
            self.reply(200, {"model": spec["name"], "predictions": predictions})

        def log_message(self, *args):
            pass

    port = int(os.environ["SAGEMAKER_BIND_TO_PORT"])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    '''
)


def test_a_cmd_server_is_driven_through_the_models_api(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    """The gateway loads each model with POST /models, invokes /models/{name}/invoke, and
    on 507 unloads the least recently used model and loads again."""
    server = tmp_path / "mme_server.py"
    server.write_text(MME_SERVER)
    prefix = tmp_path / "prefix"
    a, b, c = (write_model(prefix, f"{n}.tar.gz") for n in "abc")
    counter = _deploy_mme(
        gateway, "custom", prefix, image=f"cmd:python {server}", environment={"MAX_MODELS": "2"}
    )
    for model in (a, b, a, c, b):
        assert _invoke(gateway, "custom", model.name) == _expected(model)
    log = counter.read_text().split("\n")
    assert log[:-1] == [a.name, b.name, f"unload {b.name}", c.name, f"unload {a.name}", b.name]
    missing = _refused(gateway, "custom", TargetModel="nope.tar.gz")["Error"]
    assert missing["Code"] == "ValidationError" and "nope.tar.gz" in missing["Message"]
    labels = {"endpoint": "custom", "variant": "v1"}
    assert _metric(gateway, "shipyard_model_cache_hits_total", **labels) == {"custom-v1-1": 1.0}
    assert _metric(gateway, "shipyard_model_evictions_total", **labels) == {"custom-v1-1": 2.0}
