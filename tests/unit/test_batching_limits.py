"""Pure logic around server-side batching: what the gateway believes an instance takes at
once, and the header through which the instance reports its batches."""

from __future__ import annotations

import pytest

from shipyard.contract import format_batch, parse_batch
from shipyard.provisioning.fleet import builtin_concurrency
from shipyard.routing.instance import Instance
from shipyard.routing.policies import LeastOutstandingRequests


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, 1),
        ({"SAGEMAKER_MODEL_SERVER_WORKERS": "3"}, 3),
        ({"SHIPYARD_MAX_BATCH_SIZE": "16"}, 32),  # one batch running, one being gathered
        ({"SHIPYARD_MAX_BATCH_SIZE": "8", "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}, 24),
        ({"SHIPYARD_MAX_BATCH_SIZE": "lots"}, 1),  # the instance refuses to start
    ],
)
def test_a_batching_instance_takes_a_batch_per_thread_and_one_more(
    environment: dict[str, str], expected: int
) -> None:
    assert builtin_concurrency(environment) == expected


def test_least_outstanding_requests_keeps_feeding_a_batching_instance() -> None:
    batching = Instance("i-1", "v1", "http://127.0.0.1:1", concurrency=16)
    batching.service_s = 0.05  # a model slower than pipelining applies to
    batching.in_flight = 15
    plain = Instance("i-2", "v1", "http://127.0.0.1:2", concurrency=1)
    plain.service_s = 0.05
    plain.in_flight = 1
    policy = LeastOutstandingRequests(max_in_flight=64)
    assert policy.choose([batching, plain]) is batching
    batching.in_flight = 16
    assert policy.choose([batching, plain]) is None


def test_the_batch_header_round_trips_and_a_broken_one_is_ignored() -> None:
    assert parse_batch(format_batch(8, 0.0125)) == (8, 0.0125)
    assert parse_batch(b"size=x;wait=1") is None
