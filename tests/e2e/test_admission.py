"""A variant's priority queue, driven with boto3: the order requests start in is the one
the model itself records, refusals are counted, deadlines are answered while another
request still runs."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import urlopen

import pytest
from botocore.exceptions import ClientError

from tests.conftest import MODELS, GatewayProcess, deploy, free_port, start_gateway, wait_until

SLEEPY = "sleepy"


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    """The sum of series ``name`` over the samples whose labels include ``labels``."""
    status, body = gw.get("/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Queued:
    """An endpoint ``name`` of the sleepy model with one handler thread and the given
    admission environment; ``started`` lists, in order, the tags of the requests the
    model began."""

    def __init__(
        self,
        gw: GatewayProcess,
        model_url: str,
        tmp_path: Path,
        name: str,
        environment: dict[str, str],
    ) -> None:
        self.gw = gw
        self.name = name
        self.marks = tmp_path / f"{name}.started"
        self.marks.touch()
        deploy(
            gw.sm,
            name,
            model_url,
            environment={
                "SLEEPY_STARTED_FILE": str(self.marks),
                "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
                **environment,
            },
        )
        self.rt = gw.client("sagemaker-runtime", max_attempts=0)  # no retry
        self.answers: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def started(self) -> list[str]:
        return [line.split(" ", 1)[1] for line in self.marks.read_text().splitlines()]

    def invoke(self, tag: str, sleep_s: float = 0.0, attributes: str | None = None) -> Any:
        extra = {"CustomAttributes": attributes} if attributes else {}
        try:
            out = self.rt.invoke_endpoint(
                EndpointName=self.name,
                Body=json.dumps({"tag": tag, "sleep": sleep_s}).encode(),
                ContentType="application/json",
                **extra,
            )
            answer: Any = json.loads(out["Body"].read())
        except ClientError as exc:
            answer = exc
        self.answers[tag] = answer
        return answer

    def send(self, tag: str, sleep_s: float = 0.0, attributes: str | None = None) -> None:
        """Invoke in a thread of its own; once it waits at the gateway (the queue's
        length grew) return, so that requests are queued in the order sent."""
        before = self.waiting()
        thread = threading.Thread(target=self.invoke, args=(tag, sleep_s, attributes))
        thread.start()
        self.threads.append(thread)
        wait_until(
            lambda: self.waiting() > before or tag in self.answers or tag in self.started(),
            f"{tag} queued",
        )

    def waiting(self) -> float:
        return metric(self.gw, "shipyard_queued_requests", endpoint=self.name)

    def busy(self, sleep_s: float) -> None:
        """A request that holds the one instance for ``sleep_s``."""
        thread = threading.Thread(target=self.invoke, args=("busy", sleep_s))
        thread.start()
        self.threads.append(thread)
        wait_until(lambda: "busy" in self.started(), "the busy request under way")

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)


@pytest.fixture
def queued(gateway_factory: Any, model_tarball: Any, tmp_path: Path) -> Any:
    gw = gateway_factory()
    url = model_tarball(SLEEPY)

    def create(name: str, **environment: str) -> Queued:
        return Queued(gw, url, tmp_path, name, environment)

    return create


def test_the_most_urgent_level_starts_first_and_fifo_within_one(queued: Any) -> None:
    q = queued("ranked", SHIPYARD_PRIORITY_LEVELS="3")
    q.busy(1.0)
    for n in (1, 2):
        q.send(f"low{n}", attributes=f"trace=x{n},shipyard-priority=3")
    q.send("mid1")  # the default level: 2
    for n in (1, 2):
        q.send(f"high{n}", attributes="shipyard-priority=1")
    q.join()
    assert q.started() == ["busy", "high1", "high2", "mid1", "low1", "low2"]
    assert all(isinstance(a, dict) for a in q.answers.values()), q.answers


def test_a_full_queue_refuses_at_once_and_the_model_never_sees_it(
    queued: Any,
) -> None:
    q = queued("bounded", SHIPYARD_MAX_QUEUE_SIZE="2")
    q.busy(1.0)
    q.send("first")
    q.send("second")
    address = urlsplit(q.gw.url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    conn.request(
        "POST",
        "/endpoints/bounded/invocations",
        body=json.dumps({"tag": "refused"}),
        headers={"Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    body = json.loads(answer.read())
    assert answer.status == 503
    assert answer.getheader("x-amzn-ErrorType", "").startswith("ServiceUnavailable")
    assert int(answer.getheader("Retry-After") or "0") >= 1
    assert "queue" in body["message"].lower()
    assert "busy" in q.started() and q.answers.get("busy") is None  # still running
    q.join()
    q.invoke("sentinel")  # started last: anything refused would have come before
    assert q.started() == ["busy", "first", "second", "sentinel"]
    refused = metric(
        q.gw, "shipyard_admission_rejections_total", endpoint="bounded", reason="queue_full"
    )
    assert refused == 1


def test_a_client_that_leaves_while_queued_is_counted_as_cancelled(queued: Any) -> None:
    q = queued("leaving", SHIPYARD_MAX_QUEUE_SIZE="4")
    q.busy(3.0)
    body = json.dumps({"tag": "gone"}).encode()
    address = urlsplit(q.gw.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as s:
        s.sendall(
            b"POST /endpoints/leaving/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: q.waiting() == 1, "the request queued")
    stage = {"endpoint": "leaving", "variant": "v1"}
    wait_until(
        lambda: metric(q.gw, "shipyard_cancelled_requests_total", stage="queued", **stage) == 1,
        "the request counted as cancelled while queued",
    )
    assert q.waiting() == 0
    q.join()
    q.invoke("sentinel")  # started last: had the request that left stayed, it came before
    assert q.started() == ["busy", "sentinel"]
    assert metric(q.gw, "shipyard_cancelled_requests_total", stage="running") == 0


def test_a_deadline_is_answered_while_another_request_runs(queued: Any) -> None:
    q = queued("timely", SHIPYARD_PRIORITY_LEVELS="2")
    q.busy(2.0)
    late = q.invoke("late", attributes="shipyard-deadline-ms=150")
    assert isinstance(late, ClientError)
    error = late.response["Error"]
    assert error["Code"] == "ServiceUnavailable" and "deadline" in error["Message"].lower()
    assert q.answers.get("busy") is None  # answered before the running request ended
    q.join()
    q.invoke("sentinel")
    assert q.started() == ["busy", "sentinel"]
    assert metric(q.gw, "shipyard_admission_rejections_total", reason="deadline") == 1


def test_with_delay_a_late_request_runs_behind_the_timely_ones(queued: Any) -> None:
    q = queued("tardy", SHIPYARD_DEADLINE_ACTION="DELAY")
    q.busy(1.0)
    q.send("late", attributes="shipyard-deadline-ms=100")
    q.send("timely")
    wait_until(lambda: "busy" in q.answers, "the busy request answered")
    q.join()
    assert q.started() == ["busy", "timely", "late"]
    assert isinstance(q.answers["late"], dict)


@pytest.mark.parametrize(
    "attributes",
    ["shipyard-priority=9", "shipyard-priority=one", "shipyard-colour=red"],
)
def test_a_bad_admission_key_is_refused_and_nothing_runs(queued: Any, attributes: str) -> None:
    q = queued("strict", SHIPYARD_PRIORITY_LEVELS="4")
    refused = q.invoke("bad", attributes=attributes)
    assert isinstance(refused, ClientError)
    assert refused.response["Error"]["Code"] == "ValidationError"
    assert attributes.split("=")[0] in refused.response["Error"]["Message"]
    q.invoke("sentinel")
    assert q.started() == ["sentinel"]


def test_custom_attributes_reach_the_model_unchanged(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    deploy(
        gateway.sm,
        "echoed",
        model_tarball("custom_attrs"),
        environment={"SHIPYARD_PRIORITY_LEVELS": "2"},
    )
    out = gateway.rt.invoke_endpoint(
        EndpointName="echoed",
        Body=b"{}",
        ContentType="application/json",
        CustomAttributes="trace=7; shipyard-priority=1",
    )
    assert out["CustomAttributes"] == "echo:trace=7; shipyard-priority=1"


def test_a_bad_setting_is_refused_naming_the_variable(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    with pytest.raises(ClientError, match="SHIPYARD_PRIORITY_LEVELS") as caught:
        gateway.sm.create_model(
            ModelName="badly",
            PrimaryContainer={
                "Image": "shipyard/python",
                "ModelDataUrl": model_tarball(SLEEPY),
                "Environment": {"SHIPYARD_PRIORITY_LEVELS": "99"},
            },
            ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_an_async_endpoint_config_refuses_a_queue_setting(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    gateway.sm.create_model(
        ModelName="queued-async",
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": model_tarball(SLEEPY),
            "Environment": {"SHIPYARD_MAX_QUEUE_SIZE": "4"},
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    with pytest.raises(ClientError, match="SHIPYARD_MAX_QUEUE_SIZE") as caught:
        gateway.sm.create_endpoint_config(
            EndpointConfigName="queued-async",
            ProductionVariants=[
                {
                    "VariantName": "v1",
                    "ModelName": "queued-async",
                    "InstanceType": "ml.m5.large",
                    "InitialInstanceCount": 1,
                }
            ],
            AsyncInferenceConfig={"OutputConfig": {"S3OutputPath": "file:///tmp/out"}},
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_tritonclient_asks_for_a_priority_and_a_timeout_over_rest_and_grpc(
    tmp_path: Path,
) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    port = free_port()
    gw = start_gateway(tmp_path / "home", args=["--grpc-port", str(port)])
    try:
        deploy(
            gw.sm,
            "ranked-add",
            (MODELS / "tensor_add").as_uri(),
            environment={"SHIPYARD_PRIORITY_LEVELS": "2"},
        )
        a = np.arange(6, dtype=np.int32).reshape(2, 3)
        for module, client in (
            (httpclient, httpclient.InferenceServerClient(gw.url.removeprefix("http://"))),
            (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{port}")),
        ):
            inputs = [module.InferInput(n, [2, 3], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            answer = client.infer("ranked-add", inputs, priority=1, timeout=5_000_000)
            assert (answer.as_numpy("OUTPUT0") == a + a).all()
            with pytest.raises(InferenceServerException, match="priority") as caught:
                client.infer("ranked-add", inputs, priority=7)
            assert "400" in str(caught.value.status()) or "INVALID_ARGUMENT" in str(
                caught.value.status()
            )
            client.close()
        metadata = json.loads(urlopen(gw.url + "/v2").read())
        assert "schedule_policy" in metadata["extensions"]
    finally:
        gw.stop()


def test_the_openai_client_asks_by_service_tier(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    import openai

    deploy(
        gateway.sm,
        "tiered",
        (MODELS / "echo").as_uri(),
        environment={"SHIPYARD_PRIORITY_LEVELS": "3"},
    )
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    asked = {"model": "tiered", "messages": [{"role": "user", "content": "hi"}]}
    raw = client.chat.completions.with_raw_response.create(**asked, service_tier="flex")
    assert raw.http_response.status_code == 200
    with pytest.raises(openai.BadRequestError, match="service_tier"):
        client.chat.completions.create(**asked, service_tier="turbo")  # type: ignore[arg-type]
