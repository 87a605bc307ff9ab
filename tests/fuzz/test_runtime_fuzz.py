"""The runtime and facade doors never answer 5xx or hang, whatever a client sends.

One real gateway serves the module, with a real-time endpoint of tests/models/sum and an
asynchronous one of tests/models/echo (one real instance each). Seeded random requests
go to ``/endpoints/{name}/invocations``, ``/async-invocations``, ``POST /inference`` and
``GET /jobs/{name}/logs``: odd and hostile headers (huge, many, unicode, odd Inference-Id,
TargetModel and Custom-Attributes values), odd bodies, chunked bodies, Content-Lengths
that lie, and requests cut short by a client that closes its socket. Each answer must
come within a time bound and in its door's error shape; at the end the gateway is
healthy, its memory flat, and both endpoints still serve with the instances they had.

The gateway allows few requests in flight per instance
(``SHIPYARD_MAX_QUEUE_PER_INSTANCE``), so a request that leaks its slot shows as 503s.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.conftest import MODELS, GatewayProcess, deploy, make_tarball, start_gateway
from tests.e2e.processes import instance_pids
from tests.fuzz.wire import Answer, exchange, rss_kib

SEED = int(os.environ.get("SHIPYARD_FUZZ_SEED", "92026"))
"""Fixed, so every run sends the same requests; set the variable to explore others."""
CASES = 1500
RSS_GROWTH_BOUND_KIB = 64 * 1024
QUEUE_PER_INSTANCE = 4

Headers = list[tuple[bytes | str, bytes | str]]
KEY, SECRET_ENV, SECRET = "AKIAFUZZ0000000000002", "SHIPYARD_FUZZ_SECRET", "fuzz-secret"
SUM = "fuzz-sum"
ECHO = "fuzz-echo"
HTTP_PARSER_400 = b"Invalid HTTP request received."  # the HTTP parser's own 400
HEAD_431 = b"Request header fields too large."  # http/server.py, before any door
CODING_501 = b"Transfer codings other than chunked are not implemented."  # the same, its head


@dataclass
class Gateway:
    process: GatewayProcess
    port: int
    root: Path
    secret: str | None
    """Signs every request when the gateway has ``auth:``."""
    instances: list[int] = field(default_factory=list)


@pytest.fixture(scope="module", params=["open", "auth"])
def gw(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway without ``auth:``, then one with it whose requests are signed (those
    botocore can sign: raw header bytes go unsigned and get their 403)."""
    root = tmp_path_factory.mktemp(f"fuzz-runtime-{request.param}")
    env = {"SHIPYARD_MAX_QUEUE_PER_INSTANCE": str(QUEUE_PER_INSTANCE)}
    args: list[str] = []
    secret = None
    if request.param == "auth":
        key = {"access_key_id": KEY, "secret_access_key_env": SECRET_ENV}
        roots = [str(root), str(MODELS)]
        (root / "stack.yaml").write_text(json.dumps({"auth": {"keys": [key], "file_roots": roots}}))
        args = ["--config", str(root / "stack.yaml")]
        env[SECRET_ENV] = secret = SECRET
    process = start_gateway(root / "home", extra_env=env, args=args)
    try:
        sm = boto3.client(
            "sagemaker", endpoint_url=process.url, region_name="us-east-1",
            aws_access_key_id=KEY, aws_secret_access_key=SECRET,
        )  # fmt: skip
        deploy(sm, SUM, make_tarball("sum", root / "sum" / "model.tar.gz").as_uri())
        _deploy_echo(sm, root)
        inputs = root / "inputs"
        inputs.mkdir()
        (inputs / "in.json").write_text('{"x": [1, 2]}')
        gateway = Gateway(process, int(process.url.rsplit(":", 1)[1]), root, secret)
        gateway.instances = instance_pids(process.process.pid)
        assert len(gateway.instances) == 2
        yield gateway
    finally:
        process.stop()


def _deploy_echo(sm: Any, root: Path) -> None:
    sm.create_model(
        ModelName=ECHO,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": (MODELS / "echo").as_uri()},
    )
    sm.create_endpoint_config(
        EndpointConfigName=ECHO,
        ProductionVariants=[
            {"VariantName": "v1", "ModelName": ECHO, "InstanceType": "ml.m5.large",
             "InitialInstanceCount": 1}
        ],
        AsyncInferenceConfig={"OutputConfig": {
            "S3OutputPath": (root / "out" / "ok").as_uri(),
            "S3FailurePath": (root / "out" / "failed").as_uri(),
        }},
    )  # fmt: skip
    sm.create_endpoint(EndpointName=ECHO, EndpointConfigName=ECHO)
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=ECHO, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )


# -- what a hostile client sends ------------------------------------------------------------

_TEXT = ["", "a", "\u202eevil", "\U0001f680", "caf\u00e9", "../escaped", "/etc/passwd", "a" * 64,
         "a" * 65, "a" * 1024, "a" * 1025, "a" * 20_000, "\udcff", "%2e%2e%2f", "a b",
         "${jndi:x}", "\t", "ok-1", "model.tar.gz", "*", ";", ",,,"]  # fmt: skip
_NUMBERS = ["", "abc", "-1", "0", "59", "60", "21600", "21601", "9" * 40, "1e3", "0x10", " 5"]
_HEADERS = {
    "Content-Type": ["application/json", "text/csv", "application/x-npy", "", "\xff\xfe",
                     "application/json; charset=utf-16", "a" * 5000],
    "Accept": ["application/json", "text/csv", "*/*", "", "application/x-npy;q=0, */*"],
    "X-Amzn-SageMaker-Custom-Attributes": _TEXT,
    "X-Amzn-SageMaker-Inference-Id": _TEXT,
    "X-Amzn-SageMaker-Target-Model": _TEXT,
    "X-Amzn-SageMaker-Target-Variant": ["v1", "nope", *_TEXT[:6]],
    "X-Amzn-SageMaker-Target-Container-Hostname": _TEXT[:8],
    "X-Amzn-SageMaker-Session-Id": ["NEW_SESSION", *_TEXT[:8]],
    "X-Amzn-SageMaker-InputLocation": ["file:///nonexistent/in.json", "", "relative/in.json",
                                       "file://", "a%00b", "file:///nonexistent/\u202e",
                                       "INPUT"],
    "X-Amzn-SageMaker-Content-Type": ["application/json", *_TEXT[:6]],
    "X-Amzn-SageMaker-Accept": ["application/json", *_TEXT[:6]],
    "X-Amzn-SageMaker-RequestTTLSeconds": _NUMBERS,
    "X-Amzn-SageMaker-InvocationTimeoutSeconds": _NUMBERS,
    "X-Amzn-SageMaker-S3OutputPathExtension": _TEXT[:8],
    "X-Amzn-SageMaker-Filename": _TEXT[:8],
    "Expect": ["100-continue", "nothing"],
}  # fmt: skip
_BODIES = [
    b"", b"[[1, 2], [3, 4]]", b'{"instances": [[1, 2]]}', b"[[1, 2", b"\xff\xfe\x00",
    b"[" * 100_000 + b"]" * 100_000, b'{"type": "x"}', b'{"type": ' + b"[" * 5000 + b"]" * 5000
    + b"}", b'{"type": "' + b"t" * 100_000 + b'"}', b"null", b"[]", b"1,2\n3,4\n",
    b'{"type": "\\ud800"}', b"x" * (1 << 20), b"[1]" * 2_500_000,
]  # fmt: skip


@dataclass
class Case:
    door: str
    method: str
    path: str
    headers: Headers
    body: bytes
    mode: str  # plain | chunked | short_length | cut | cut_chunked

    def __str__(self) -> str:
        headers = [(str(k)[:40], str(v)[:40]) for k, v in self.headers][:8]
        return (
            f"{self.door} {self.method} {self.path[:80]} {self.mode} {headers} {self.body[:60]!r}"
        )


def _cases(rng: random.Random, inputs: Path) -> Iterator[Case]:
    for _ in range(CASES):
        door = rng.choice(["invoke", "invoke", "async", "async", "facade", "logs"])
        headers: Headers = []
        for name in rng.sample(sorted(_HEADERS), rng.randint(0, 6)):
            value = rng.choice(_HEADERS[name])
            if value == "INPUT":
                value = (inputs / "in.json").as_uri()
            headers.append((name, value))
        if door == "async" and rng.random() < 0.5:  # an input that exists, so it is run
            headers.insert(0, ("X-Amzn-SageMaker-InputLocation", (inputs / "in.json").as_uri()))
        extra = rng.random()
        if extra < 0.05:
            headers += [(f"X-Many-{i}", "v") for i in range(rng.choice([100, 1000]))]
        elif extra < 0.1:
            headers.append(("X-Huge", "h" * rng.choice([8_000, 60_000])))
        elif extra < 0.15:
            bad = rng.choice([("X-\u202e", "v"), ("X-Bad Name", "v"), ("X-\udcff", "v"),
                              ("X-Nul", "a\x00b"), ("X-Cr", "a\rb"),
                              ("X-Del", "\x7f"), ("Transfer-Encoding", "gzip")])  # fmt: skip
            headers.append(bad)
        body = rng.choice(_BODIES)
        mode = rng.choice(["plain"] * 5 + ["chunked", "short_length", "cut", "cut_chunked"])
        method, path = _target(door, rng)
        if method == "GET":
            body = b""
        yield Case(door, method, path, headers, body, mode)


def _big_cases() -> Iterator[Case]:
    """Once per POST door: one 1 MB header, 20,000 headers, a 20 MB body plainly and
    chunked. Each is refused (400, 413, 431) without being read whole."""
    paths = {"invoke": f"/endpoints/{SUM}/invocations", "facade": "/inference",
             "async": f"/endpoints/{ECHO}/async-invocations"}  # fmt: skip
    body = b"[" + b"1," * (10 << 20) + b"1]"
    for door, path in paths.items():
        yield Case(door, "POST", path, [("X-Amzn-SageMaker-Custom-Attributes", "a" * (1 << 20))],
                   b"[[1, 2]]", "plain")  # fmt: skip
        yield Case(door, "POST", path, [(f"X-Many-{i}", "v") for i in range(20_000)],
                   b"[[1, 2]]", "plain")  # fmt: skip
        if door != "async":  # InvokeEndpointAsync has no body to refuse
            yield Case(door, "POST", path, [("Content-Type", "application/json")], body, "plain")
            yield Case(door, "POST", path, [("Content-Type", "application/json")], body, "chunked")


def _target(door: str, rng: random.Random) -> tuple[str, str]:
    odd_names = ["nope", "%2e%2e", "a" * 300, "%F0%9F%9A%80", "%00", "x%2Fy", ECHO, SUM]
    if door == "invoke":
        name = SUM if rng.random() < 0.7 else rng.choice(odd_names)
        return "POST", f"/endpoints/{name}/invocations"
    if door == "async":
        name = ECHO if rng.random() < 0.7 else rng.choice(odd_names)
        return "POST", f"/endpoints/{name}/async-invocations"
    if door == "facade":
        return "POST", "/inference"
    name = rng.choice(["nope", "..", "%2e%2e%2f%2e%2e", "%F0%9F%9A%80", "a" * 300, "%00"])
    offset = rng.choice(["", "?offset=0", "?offset=-1", "?offset=abc", "?offset=" + "9" * 50,
                         "?offset=1e9", "?offset=%00"])  # fmt: skip
    return "GET", f"/jobs/{name}/logs{offset}"


def _written_outside(root: Path) -> list[str]:
    """Files the async endpoint wrote anywhere but its output and failure folders, once
    its queue has drained (no request queued or running: nothing more will be written)."""
    known = ("home", "sum", "inputs", "stack.yaml", "out/ok", "out/failed")
    deadline = time.monotonic() + 15
    query = "SELECT count(*) FROM async_requests WHERE status IN ('Queued', 'Running')"
    while True:
        with sqlite3.connect(root / "home" / "shipyard.db") as db:
            if db.execute(query).fetchone()[0] == 0:
                break
        assert time.monotonic() < deadline, "the async queue never drained"
        time.sleep(0.05)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return [f for f in files if not f.startswith(known)]


def _door_failure(line: str) -> bool:
    """A log line saying a door answered 500."""
    return " ERROR " in line and ("invocation of" in line or "request failed" in line)


def _send(gw: Gateway, case: Case) -> Answer | None:
    args: dict[str, Any] = {}
    if case.mode == "chunked":
        args["chunked"] = True
    elif case.mode == "short_length":
        args["length"] = len(case.body) // 2
    elif case.mode in ("cut", "cut_chunked"):
        args["cut_after"] = len(case.body) // 2
        args["chunked"] = case.mode == "cut_chunked"
    headers = _signed(gw, case.method, case.path, case.headers, case.body)
    return exchange(gw.port, case.method, case.path, headers, case.body, **args)


def _signed(gw: Gateway, method: str, path: str, headers: Headers, body: bytes) -> Headers:
    if gw.secret is None or any(isinstance(v, bytes) for _, v in headers):
        return headers
    if len(headers) > 200:  # botocore signs in quadratic time; refused unsigned anyway
        return headers
    url = f"http://127.0.0.1:{gw.port}{path}"
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    try:
        SigV4Auth(Credentials(KEY, gw.secret), "sagemaker", "us-east-1").add_auth(request)
    except (AttributeError, UnicodeError):  # a value botocore cannot sign: sent unsigned
        return headers
    return list(request.headers.items())


def assert_clean(answer: Answer, case: Case) -> None:
    """No 5xx but the facade's own codes; each door's error shape on a 4xx."""
    what = f"{case}: {answer.status} {answer.headers} {answer.body[:300]!r}"
    if answer.status == 400 and answer.body == HTTP_PARSER_400:
        return  # the HTTP parser refused the request before any door saw it
    if answer.status == 431 and answer.body == HEAD_431:
        return  # too many or too large headers, refused while they arrived
    if answer.status == 501 and answer.body == CODING_501:
        return  # a body framed chunked under another transfer coding, refused by its head
    if case.door == "facade":
        assert answer.status in (200, 403, 413, 501, 502, 510) or answer.status < 500, what
        body = _json(answer, what)
        assert body["status"] == answer.status and isinstance(body["errMsg"], str), what
        return
    assert answer.status < 500, what
    if answer.status == 404 and answer.body == b"Not Found":
        return  # a name with a slash in it matches no door at all
    if case.door == "logs":
        if answer.status != 200:
            assert isinstance(_json(answer, what).get("message"), str), what
        return
    if answer.status >= 400:
        assert answer.headers.get("x-amzn-errortype"), what
        assert isinstance(_json(answer, what).get("message"), str), what
    else:  # accepted: then within SageMaker's header maxima
        sent = {str(k).lower(): str(v).encode("utf-8", "surrogatepass") for k, v in case.headers}
        assert len(sent.get("x-amzn-sagemaker-custom-attributes", b"")) <= 1024, what
        assert len(sent.get("x-amzn-sagemaker-inference-id", b"")) <= 64, what


def _json(answer: Answer, what: str) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        raise AssertionError(f"not JSON: {what}") from None
    assert isinstance(body, dict), what
    return body


def invoke_sum(gw: Gateway) -> Answer:
    path, body = f"/endpoints/{SUM}/invocations", b"[[1, 2], [3, 4]]"
    headers = _signed(gw, "POST", path, [("Content-Type", "application/json")], body)
    answer = exchange(gw.port, "POST", path, headers, body)
    assert answer is not None
    return answer


def test_no_runtime_or_facade_request_gets_a_5xx_or_hangs(gw: Gateway) -> None:
    rng = random.Random(SEED)
    pid = gw.process.process.pid
    assert invoke_sum(gw).status == 200
    before = rss_kib(pid)
    statuses: Counter[str] = Counter()
    started = time.monotonic()
    slowest = (0.0, "")
    for case in _cases(rng, gw.root / "inputs"):
        sent = time.monotonic()
        answer = _send(gw, case)
        slowest = max(slowest, (time.monotonic() - sent, str(case)))
        if answer is None:
            statuses[f"{case.door} cut"] += 1
            continue
        assert_clean(answer, case)
        parser = " (HTTP parser)" if answer.body == HTTP_PARSER_400 else ""
        statuses[f"{case.door} {answer.status}{parser}"] += 1
    for case in _big_cases():
        answer = _send(gw, case)
        assert answer is not None and answer.status in (400, 403, 413, 431), (str(case), answer)
        assert_clean(answer, case)
        statuses[f"{case.door} big {answer.status}"] += 1
    elapsed = time.monotonic() - started
    assert gw.process.get("/healthz")[0] == 200
    grown = rss_kib(pid) - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"RSS grew by {grown} KiB"
    # Every slot came back: a full queue's worth of requests at once still all succeed.
    answers = [invoke_sum(gw) for _ in range(QUEUE_PER_INSTANCE * 2)]
    assert [a.status for a in answers] == [200] * len(answers), answers[-1]
    assert json.loads(answers[0].body) == [3.0, 7.0]
    assert instance_pids(pid) == gw.instances, "an instance was lost or added"
    assert _written_outside(gw.root) == []
    # A 500 nobody read (the client had gone) still shows in the log as a door's failure.
    failed = [line for line in gw.process.log().splitlines() if _door_failure(line)]
    assert failed == [], f"{len(failed)} requests took a 500 path, e.g. {failed[:1]}"
    print(f"{sum(statuses.values())} requests in {elapsed:.1f} s, RSS +{grown} KiB: {statuses}")
    print(f"slowest: {slowest[0]:.2f} s, {slowest[1]}")
