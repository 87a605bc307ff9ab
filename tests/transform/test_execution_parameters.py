"""What a transform takes of a model's ``GET /execution-parameters`` answer, and the
concurrency it runs at."""

from __future__ import annotations

from typing import Any

import pytest

from shipyard.transform.runner import _advertised, bounded_concurrency


@pytest.mark.parametrize(
    ("answer", "taken"),
    [
        # SageMaker's documented spelling, and the API's own.
        (
            {"MaxConcurrentTransforms": 8, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6},
            {"MaxConcurrentTransforms": 8, "BatchStrategy": "MultiRecord", "MaxPayloadInMB": 6},
        ),
        ({"BatchStrategy": "SingleRecord"}, {"BatchStrategy": "SingleRecord"}),
        # Values of the wrong kind are left out, never fail the job.
        (
            {"BatchStrategy": "ALL", "MaxPayloadInMB": "6", "MaxConcurrentTransforms": True},
            {},
        ),
        ({"MaxPayloadInMB": 0, "MaxConcurrentTransforms": -1}, {}),
        # A model cannot push the gateway past the limits.
        (
            {"MaxPayloadInMB": 10**9, "MaxConcurrentTransforms": 10**9},
            {"MaxPayloadInMB": 100, "MaxConcurrentTransforms": 100},
        ),
    ],
)
def test_a_models_execution_parameters_are_taken_within_bounds(
    answer: dict[str, Any], taken: dict[str, Any]
) -> None:
    assert _advertised(answer) == taken


@pytest.mark.parametrize(
    ("asked", "payload_mb", "runs"),
    [(1, 6, 1), (0, 6, 1), (16, 6, 16), (17, 6, 16), (10**9, 6, 16), (128, 1, 100),
     (4, 100, 1), (3, 40, 2), (8, 0, 8)],
)  # fmt: skip
def test_the_payloads_in_flight_to_an_instance_stay_within_100_mb(
    asked: int, payload_mb: int, runs: int
) -> None:
    assert bounded_concurrency(asked, payload_mb) == runs
