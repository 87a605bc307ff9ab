"""Server-side batching through a real gateway and instance, driven with boto3.

The instance's model (tests/models/batching) answers with the size of the
``predict_batch_fn`` call that served each request. A long delay with a small batch size
makes the batches deterministic: they can only be cut when full, so every request of a
full round shares a batch, and one that waited would hold the test for the delay.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import GatewayProcess, deploy, unique

LONG_DELAY_MS = "10000"


def invoke_all(gw: GatewayProcess, endpoint: str, payloads: list[dict[str, Any]]) -> list[Any]:
    """Each payload sent at once on its own thread; the answers (or errors) in order."""
    rt = gw.client("sagemaker-runtime", max_attempts=1)

    def invoke(payload: dict[str, Any]) -> Any:
        try:
            out = rt.invoke_endpoint(
                EndpointName=endpoint, Body=json.dumps(payload), ContentType="application/json"
            )
        except rt.exceptions.ModelError as exc:
            return exc
        return json.loads(out["Body"].read())

    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(pool.map(invoke, payloads))


def metric(gw: GatewayProcess, name: str, endpoint: str) -> float:
    status, text = gw.get("/metrics")
    assert status == 200
    pattern = rf'^{name}{{endpoint="{endpoint}",variant="v1"}} (\S+)$'
    found = re.search(pattern, text.decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("strategy", ["LEAST_OUTSTANDING_REQUESTS", "RANDOM"])
def test_concurrent_clients_share_batches_and_metrics_show_them(
    gateway: GatewayProcess, model_tarball: Any, strategy: str
) -> None:
    # Eight at once fill two batches of four only if the gateway lets eight reach the
    # instance at once: under LEAST_OUTSTANDING_REQUESTS, a batch being run and one
    # being gathered (its concurrency is max batch size x 2).
    name = unique("batched")
    deploy(
        gateway.sm,
        name,
        model_tarball("batching"),
        strategy=strategy,
        environment={
            "SHIPYARD_MAX_BATCH_SIZE": "4",
            "SHIPYARD_MAX_BATCH_DELAY_MS": LONG_DELAY_MS,
        },
    )
    payloads = [{"id": n, "sleep": 0.2} for n in range(8)]
    answers = invoke_all(gateway, name, payloads)
    assert [a["echo"] for a in answers] == payloads  # each answer to its own request
    assert [a["batch_size"] for a in answers] == [4] * 8
    assert metric(gateway, "shipyard_batch_size_count", name) == 8
    assert metric(gateway, "shipyard_batch_size_sum", name) == 32
    assert metric(gateway, "shipyard_batch_wait_seconds_count", name) == 8


def test_a_failing_item_is_a_model_error_for_its_request_only(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    name = unique("batched")
    deploy(
        gateway.sm,
        name,
        model_tarball("batching"),
        strategy="LEAST_OUTSTANDING_REQUESTS",
        environment={
            "SHIPYARD_MAX_BATCH_SIZE": "3",
            "SHIPYARD_MAX_BATCH_DELAY_MS": LONG_DELAY_MS,
        },
    )
    answers = invoke_all(gateway, name, [{"id": 0}, {"id": 1, "fail": "item"}, {"id": 2}])
    assert [answers[n]["echo"]["id"] for n in (0, 2)] == [0, 2]
    error = answers[1]
    assert error.response["Error"]["Code"] == "ModelError"
    assert "ValueError: this item failed" in error.response["Error"]["Message"]


def test_without_the_setting_requests_are_not_batched(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    name = unique("plain")
    deploy(gateway.sm, name, model_tarball("batching"), strategy="LEAST_OUTSTANDING_REQUESTS")
    answers = invoke_all(gateway, name, [{"id": n} for n in range(4)])
    assert [a["batch_size"] for a in answers] == [None] * 4  # predict_fn, one at a time
    # A variant that does not batch has no batch series at all, not empty ones.
    status, text = gateway.get("/metrics")
    assert status == 200 and f'endpoint="{name}"' in text.decode()
    assert not re.search(rf'^shipyard_batch_\w+{{endpoint="{name}"', text.decode(), re.M)
