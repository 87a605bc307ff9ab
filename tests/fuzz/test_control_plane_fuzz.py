"""The control plane (``POST /``) never answers 5xx or hangs, whatever it is sent.

One real gateway serves the whole module. Requests are built from botocore's own
service model (tests/fuzz/shapes.py) for every action the gateway implements, then
mutated; each answer must come within a time bound, below 500, and a 4xx must be AWS
JSON's ``{"__type", "message"}``. At the end the gateway still answers ``/healthz`` and
its memory has not grown past a bound.

Nothing here starts an instance or a job: the one model is a container image (no
Docker engine here, so its endpoints fail at once), and the one job slot
(``SHIPYARD_MAX_ACTIVE_JOBS=1``) is held by a ``sleep`` job for the whole module, so
every valid CreateTrainingJob gets as far as the quota and stops there.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from shipyard.gateway.api.actions import ACTIONS, JOB_ACTIONS
from shipyard.gateway.api.actions.transform_jobs import ACTIONS as TRANSFORM_ACTIONS
from tests.conftest import GatewayProcess, start_gateway, stop_job_processes
from tests.e2e.processes import instance_pids
from tests.fuzz.shapes import MISSING, Request, Skeletons, mutate
from tests.fuzz.wire import Answer, exchange, rss_kib

SEED = int(os.environ.get("SHIPYARD_FUZZ_SEED", "20261122"))
"""Fixed, so every run sends the same requests; set the variable to explore others."""
MUTATIONS_PER_ACTION = 120
VALID_PER_ACTION = 10
RSS_GROWTH_BOUND_KIB = 64 * 1024
AMZ_JSON = "application/x-amz-json-1.1"

MODEL = "fuzz-model"
CONFIG = "fuzz-config"
ENDPOINT = "fuzz-endpoint"
BLOCKER = "fuzz-blocker"
IMAGE = "registry.invalid/fuzz/none:latest"  # a container image: nothing can start here
SAFE_ROOT = "/nonexistent/fuzz"  # where fuzzed locations point: nothing there to read
KEY, SECRET_ENV, SECRET = "AKIAFUZZ0000000000001", "SHIPYARD_FUZZ_SECRET", "fuzz-secret"


@pytest.fixture(scope="module", params=["open", "auth"])
def gw(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway without ``auth:``, then one with it whose every request is signed (so
    that signature checks and ``file_roots`` see the fuzzed requests too)."""
    home = tmp_path_factory.mktemp(f"fuzz-control-{request.param}")
    env = {"SHIPYARD_MAX_ENDPOINTS": "10", "SHIPYARD_MAX_ACTIVE_JOBS": "1"}
    args = []
    if request.param == "auth":
        key = {"access_key_id": KEY, "secret_access_key_env": SECRET_ENV}
        roots = [str(home), SAFE_ROOT]
        stack = {
            "auth": {
                "keys": [key],
                "allow_commands": True,
                "file_roots": roots,
                "allow_images": [IMAGE],
            }
        }
        (home / "stack.yaml").write_text(json.dumps(stack))  # JSON is YAML
        args = ["--config", str(home / "stack.yaml")]
        env[SECRET_ENV] = SECRET
    gateway = start_gateway(home / "home", extra_env=env, args=args)
    try:
        _seed(gateway, home)
        yield gateway
    finally:
        gateway.stop()
        stop_job_processes(gateway.home)


def _seed(gateway: GatewayProcess, home: Path) -> None:
    """The resources fuzzed requests name: a model, a config, an endpoint, a job."""
    call(
        gateway,
        "CreateModel",
        {
            "ModelName": MODEL,
            "PrimaryContainer": {"Image": IMAGE, "ModelDataUrl": f"file://{SAFE_ROOT}/m.tar.gz"},
        },
    )
    call(
        gateway,
        "CreateEndpointConfig",
        {
            "EndpointConfigName": CONFIG,
            "ProductionVariants": [
                {
                    "VariantName": "v1",
                    "ModelName": MODEL,
                    "InitialInstanceCount": 1,
                    "InstanceType": "ml.m5.large",
                }
            ],
        },
    )
    call(gateway, "CreateEndpoint", {"EndpointName": ENDPOINT, "EndpointConfigName": CONFIG})
    call(gateway, "CreateTrainingJob", {
        "TrainingJobName": BLOCKER,
        "AlgorithmSpecification": {"TrainingImage": "cmd:sleep 300", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/x",
        "OutputDataConfig": {"S3OutputPath": (home / "out").as_uri()},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1,
                           "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    })  # fmt: skip


def call(gw: GatewayProcess, action: str, params: dict[str, Any]) -> Any:
    """One well-formed call that must succeed; its JSON answer."""
    answer = post(gw, json.dumps(params).encode(), f"SageMaker.{action}")
    assert answer.status == 200, (action, answer.body[:300])
    return answer.json()


# Names of what exists, or of nothing, by member; creations get fresh names.
_EXISTING = {
    "ModelName": MODEL,
    "EndpointConfigName": CONFIG,
    "EndpointName": ENDPOINT,
    "TrainingJobName": BLOCKER,
    "TransformJobName": "fuzz-transform",
}
# Locations and images: never something that could run or be read.
_SAFE = {
    "Image": IMAGE,
    "TrainingImage": "shipyard/python",
    "ModelDataUrl": f"file://{SAFE_ROOT}/model.tar.gz",
    "S3Uri": f"file://{SAFE_ROOT}/data",
    "S3OutputPath": f"file://{SAFE_ROOT}/out",
    "S3FailurePath": f"file://{SAFE_ROOT}/failed",
    "DestinationS3Uri": f"file://{SAFE_ROOT}/capture",
    "ContainerEntrypoint": None,
    "ContainerArguments": None,
    "HyperParameters": {"sagemaker_program": "fuzz.py"},
    "ModelDataSource": None,
}
# Optional members without which the gateway refuses most requests.
_ALWAYS = frozenset(
    {
        "PrimaryContainer",
        "Image",
        "ModelName",
        "InitialInstanceCount",
        "AlgorithmSpecification",
        "TrainingImage",
    }
)


class Names:
    """Names fuzzed requests use: what exists, what they created, or nothing at all.

    Creations get fresh names; other requests name the seeded resources, something an
    earlier fuzzed request created (so its stored request is described, updated and
    deleted too), or now and then nothing that exists.
    """

    def __init__(self) -> None:
        self.created: dict[str, list[str]] = {name: [] for name in _EXISTING}

    def override(self, op: str, path: tuple[Any, ...], name: str, rng: random.Random) -> Any:
        if name in _SAFE:
            return _SAFE[name]
        if name in ("NextToken", "ServerlessConfig") and rng.random() < 0.8:
            return None  # mostly left out: the gateway refuses most of what they say
        if name in ("InstanceCount", "InitialInstanceCount", "DesiredInstanceCount"):
            return rng.choice([1, 1, 1, 2, 17])  # 17 is over the per-variant quota
        if name not in _EXISTING:
            return MISSING
        creates = op.startswith("Create") and op.endswith(name.removesuffix("Name"))
        # Never free the job slot the blocker holds, nor delete the seeded resources.
        spares = op == "StopTrainingJob" or op.startswith("Delete")
        roll = rng.random()
        if (not path and creates) or (spares and not self.created[name]) or roll < 0.15:
            return f"fuzz-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
        if (roll < 0.6 or spares) and self.created[name]:
            return rng.choice(self.created[name])
        return _EXISTING[name]

    def record(self, request: Request, answer: Answer) -> None:
        """Remember what a successful Create call created."""
        op = request.operation
        if answer.status == 200 and op.startswith("Create") and isinstance(request.params, dict):
            for name in _EXISTING:
                if op.endswith(name.removesuffix("Name")) and name in request.params:
                    self.created[name].append(request.params[name])


def _requests(rng: random.Random, names: Names) -> Iterator[Request]:
    """Round after round, one request per action in a shuffled order, so that
    creations, descriptions, updates and deletions interleave."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    skeletons = Skeletons(model, rng, names.override, always=_ALWAYS)
    operations = sorted({*ACTIONS, *JOB_ACTIONS, *TRANSFORM_ACTIONS})
    for index in range(VALID_PER_ACTION + MUTATIONS_PER_ACTION):
        rng.shuffle(operations)
        for op in operations:
            request, shapes = skeletons.build(op, full=rng.random() < 0.3)
            yield request if index < VALID_PER_ACTION else mutate(request, shapes, rng)


def post(gw: GatewayProcess, body: bytes, target: str | bytes | None = "SageMaker.ListModels",
         content_type: str | bytes = AMZ_JSON, **kwargs: Any) -> Answer:  # fmt: skip
    headers: list[tuple[bytes | str, bytes | str]] = [("Content-Type", content_type)]
    if target is not None:
        headers.append(("X-Amz-Target", target))
    headers = _signed(gw, body, headers)
    answer = exchange(int(gw.url.rsplit(":", 1)[1]), "POST", "/", headers, body, **kwargs)
    assert answer is not None
    return answer


def _signed(
    gw: GatewayProcess, body: bytes, headers: list[tuple[bytes | str, bytes | str]]
) -> list[tuple[bytes | str, bytes | str]]:
    """``headers`` with a SigV4 signature when the gateway has ``auth:``. Headers that
    botocore cannot sign (raw bytes) go unsigned, and get their 403."""
    if SECRET_ENV not in gw.env:
        return headers
    if any(isinstance(value, bytes) for _, value in headers):
        return headers
    request = AWSRequest(method="POST", url=gw.url + "/", data=body, headers=dict(headers))
    SigV4Auth(Credentials(KEY, SECRET), "sagemaker", "us-east-1").add_auth(request)
    return list(request.headers.items())


def _framing(rng: random.Random, size: int) -> dict[str, Any]:
    """How the body travels: mostly plainly, sometimes chunked, short or cut off."""
    roll = rng.random()
    if roll < 0.05:
        return {"chunked": True}
    if roll < 0.08:
        return {"length": size // 2}  # a Content-Length shorter than the body
    if roll < 0.11:
        return {"cut_after": size // 2}
    return {}


def _cut(gw: GatewayProcess, body: bytes, target: str, cut_after: int) -> None:
    headers: list[tuple[bytes | str, bytes | str]] = [
        ("Content-Type", AMZ_JSON), ("X-Amz-Target", target)
    ]  # fmt: skip
    headers = _signed(gw, body, headers)
    port = int(gw.url.rsplit(":", 1)[1])
    assert exchange(port, "POST", "/", headers, body, cut_after=cut_after) is None


def assert_clean(answer: Answer, case: str) -> None:
    """Below 500; a 4xx in AWS JSON's error shape; a 200 a JSON object."""
    assert answer.status < 500, f"{case}: {answer.status} {answer.body[:300]!r}"
    body = answer.json()
    assert isinstance(body, dict), f"{case}: {answer.body[:300]!r}"
    if answer.status >= 400:
        assert isinstance(body.get("__type"), str) and body["__type"], f"{case}: {body}"
        assert isinstance(body.get("message"), str), f"{case}: {body}"


# -- finding 7, one test each -------------------------------------------------------------


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
def test_deeply_nested_json_is_a_serialization_error(gw: GatewayProcess, depth: int) -> None:
    for raw in ("[" * depth + "]" * depth, '{"ModelName": ' + "[" * depth + "]" * depth + "}"):
        answer = post(gw, raw.encode(), "SageMaker.CreateModel")
        assert answer.status == 400, answer.body[:300]
        assert answer.json()["__type"] == "SerializationException"


def test_nesting_inside_a_map_value_is_refused_cleanly(gw: GatewayProcess) -> None:
    """A bad map key makes the message show the map; deep values in it must not crash."""
    deep = "[" * 900 + "]" * 900
    body = '{"ModelName": "m", "PrimaryContainer": {"Image": "x", "Environment": {"%s": %s}}}'
    answer = post(gw, (body % ("k" * 2000, deep)).encode(), "SageMaker.CreateModel")
    assert answer.status == 400, answer.body[:300]
    assert answer.json()["__type"] in ("SerializationException", "ValidationException")


def test_a_variant_without_model_name_is_a_validation_exception(gw: GatewayProcess) -> None:
    body = {
        "EndpointConfigName": "no-model-name",
        "ProductionVariants": [
            {"VariantName": "v1", "InitialInstanceCount": 1, "InstanceType": "ml.m5.large"}
        ],
    }
    answer = post(gw, json.dumps(body).encode(), "SageMaker.CreateEndpointConfig")
    assert answer.status == 400, answer.body[:300]
    assert answer.json()["__type"] == "ValidationException"
    assert "ModelName" in answer.json()["message"]


def test_routing_strategy_prefix_aware_is_refused_with_the_supported_ones(
    gw: GatewayProcess,
) -> None:
    body = {
        "EndpointConfigName": "prefix-aware",
        "ProductionVariants": [
            {"VariantName": "v1", "ModelName": MODEL, "InitialInstanceCount": 1,
             "InstanceType": "ml.m5.large", "RoutingConfig": {"RoutingStrategy": "PREFIX_AWARE"}}
        ],
    }  # fmt: skip
    answer = post(gw, json.dumps(body).encode(), "SageMaker.CreateEndpointConfig")
    assert answer.status == 400, answer.body[:300]
    error = answer.json()
    assert error["__type"] == "ValidationException"
    assert "PREFIX_AWARE" in error["message"] and "LEAST_OUTSTANDING_REQUESTS" in error["message"]


def test_null_members_are_read_as_absent(gw: GatewayProcess) -> None:
    """``"MaxResults": null`` reached the action as None (int(None): a 500)."""
    for action in ("ListModels", "ListEndpointConfigs", "ListEndpoints", "ListTrainingJobs"):
        body = {"MaxResults": None, "SortBy": None, "NextToken": None, "NameContains": None}
        answer = post(gw, json.dumps(body).encode(), f"SageMaker.{action}")
        assert answer.status == 200, (action, answer.body[:300])


@pytest.mark.parametrize("moment", ["1e300", "1" + "0" * 400, "-1e300"])
def test_a_timestamp_filter_no_date_can_hold_is_refused(gw: GatewayProcess, moment: str) -> None:
    """An integer of 401 digits overflowed float() in the List action (a 500); moments
    past year 9999 are no timestamp either, as AWS's deserialiser says."""
    body = f'{{"CreationTimeAfter": {moment}}}'.encode()
    answer = post(gw, body, "SageMaker.ListEndpoints")
    assert answer.status == 400, answer.body[:300]
    assert answer.json()["__type"] == "SerializationException"


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_one_mib_is_refused_before_it_is_read_whole(
    gw: GatewayProcess, chunked: bool
) -> None:
    body = json.dumps({"ModelName": "m", "Tags": [{"Key": "k", "Value": "v" * 200}] * 20_000})
    answer = post(gw, body.encode(), "SageMaker.CreateModel", chunked=chunked)
    assert answer.status == 413, answer.body[:300]
    assert_clean(answer, "over 1 MiB")


def test_boto3_reads_the_413_as_a_serialization_exception(gw: GatewayProcess) -> None:
    if SECRET_ENV in gw.env:
        pytest.skip("boto3 here signs with the test key; the open gateway shows it")
    with pytest.raises(ClientError) as caught:
        gw.client("sagemaker", max_attempts=1).create_model(
            ModelName="too-big", PrimaryContainer={"Image": IMAGE, "Environment": {
                f"K{i}": "v" * 1024 for i in range(1100)}}
        )  # fmt: skip
    error = caught.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert error["Error"]["Code"] == "SerializationException"
    assert "1048576 bytes" in error["Error"]["Message"]


def test_a_content_length_over_the_cap_is_refused_without_waiting_for_the_body(
    gw: GatewayProcess,
) -> None:
    answer = post(gw, b"{}", "SageMaker.ListModels", length=100 * 1024 * 1024)
    assert answer.status == 413, answer.body[:300]
    assert_clean(answer, "Content-Length 100 MiB")


# -- the fuzz -------------------------------------------------------------------------------


Odd = tuple[str, bytes, str | bytes | None, str | bytes]


def _odd_requests() -> list[Odd]:
    """(case, body, X-Amz-Target, Content-Type) outside what the model describes."""
    list_models = "SageMaker.ListModels"
    bodies = [b"", b" ", b"null", b"[]", b"1", b'"x"', b"{", b'{"a":', b"\xff\xfe{}",
              b"\xef\xbb\xbf{}", b'{"MaxResults": NaN}', b'{"MaxResults": Infinity}',
              b'{"NameContains": "\\ud800"}', b'{"NameContains": "\\u0000"}',
              b'{"NameContains": "a", "NameContains": 1}', b"1" * 5000,
              b'{"MaxResults": ' + b"9" * 5000 + b"}", bytes(range(256)),
              b'{"SortBy": "Name"}' + b" " * 500_000]  # fmt: skip
    cases: list[Odd] = [(f"body {b[:40]!r}", b, list_models, AMZ_JSON) for b in bodies]
    targets: list[str | None] = [
        None, "", "SageMaker.", "SageMaker.Nope", "sagemaker.ListModels", "ListModels",
        "SageMaker.ListModels.Extra", "AnyScaleFrontendService.Nope", "SageMaker.\u202e",
        "SageMaker." + "A" * 10_000, "SageMaker.__init__", "SageMaker.ACTIONS",
    ]  # fmt: skip
    cases += [(f"target {t!r:.40}", b"{}", t, AMZ_JSON) for t in targets]
    content_types: list[str | bytes] = [
        "", "text/plain", "application/json", "multipart/form-data; b=x", b"\xff\xfe",
        "application/x-amz-json-1.1; charset=ebcdic",
    ]  # fmt: skip
    for content_type in content_types:
        cases.append((f"content-type {content_type!r}", b"{}", list_models, content_type))
    cases.append(("raw target bytes", b"{}", b"SageMaker.\xff\xfe", AMZ_JSON))
    return cases


def test_no_request_built_from_the_service_model_gets_a_5xx_or_hangs(gw: GatewayProcess) -> None:
    rng = random.Random(SEED)
    pid = gw.process.pid
    assert_clean(post(gw, b"{}"), "warm-up")
    before = rss_kib(pid)
    started = time.monotonic()
    statuses: Counter[str] = Counter()
    names = Names()
    for request in _requests(rng, names):
        case = f"{request.operation} {request.mutation}"
        framing = _framing(rng, len(request.body()))
        if "cut_after" in framing:  # the client goes away mid-body: nothing to read
            _cut(gw, request.body(), f"SageMaker.{request.operation}", framing["cut_after"])
            statuses["cut"] += 1
            continue
        answer = post(gw, request.body(), f"SageMaker.{request.operation}", **framing)
        assert_clean(answer, case)
        names.record(request, answer)
        statuses[f"{request.operation} {answer.status} {answer.json().get('__type', '')}"] += 1
    for case, body, target, content_type in _odd_requests():
        answer = post(gw, body, target, content_type)
        assert_clean(answer, case)
        statuses[f"{answer.status} {answer.json().get('__type', '')}"] += 1
    count = sum(statuses.values())
    elapsed = time.monotonic() - started
    assert gw.get("/healthz")[0] == 200
    grown = rss_kib(pid) - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"RSS grew by {grown} KiB over {count} requests"
    assert instance_pids(pid) == [], "a fuzzed request started an instance"
    failed = [line for line in gw.log().splitlines() if "control-plane request failed" in line]
    assert failed == [], f"{len(failed)} requests took the 500 path (cut ones included)"
    jobs = call(gw, "ListTrainingJobs", {"MaxResults": 100})["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == [BLOCKER], "a fuzzed request started a job"
    print(f"{count} requests in {elapsed:.1f} s, RSS {before} KiB + {grown} KiB: {statuses}")
