"""What a transform takes of a model's ``GET /execution-parameters`` answer."""

from __future__ import annotations

from typing import Any

import pytest

from shipyard.transform.runner import _advertised


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
            {"MaxPayloadInMB": 100, "MaxConcurrentTransforms": 128},
        ),
    ],
)
def test_a_models_execution_parameters_are_taken_within_bounds(
    answer: dict[str, Any], taken: dict[str, Any]
) -> None:
    assert _advertised(answer) == taken
