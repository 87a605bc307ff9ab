"""The router sends a built-in instance as many requests at once as it has handler
threads (SAGEMAKER_MODEL_SERVER_WORKERS), under LEAST_OUTSTANDING_REQUESTS."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.conftest import GatewayProcess, deploy


def test_least_outstanding_requests_fills_every_handler_thread(
    gateway: GatewayProcess, model_tarball: Any
) -> None:
    # Three requests meet only if the gateway lets three in at once: one per handler
    # thread. Holding to one per instance (plus one pipelined) would leave them alone.
    deploy(
        gateway.sm,
        "workers",
        model_tarball("rendezvous"),
        strategy="LEAST_OUTSTANDING_REQUESTS",
        environment={"SAGEMAKER_MODEL_SERVER_WORKERS": "3", "RENDEZVOUS_PARTIES": "3"},
    )
    rt = gateway.client("sagemaker-runtime", max_attempts=1)

    def invoke(_: int) -> Any:
        out = rt.invoke_endpoint(EndpointName="workers", Body=b"{}")
        return json.loads(out["Body"].read())

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(invoke, range(3))) == ["met", "met", "met"]
