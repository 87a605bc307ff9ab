"""The reference pages under docs/reference/ are what the code generates now, so that they
cannot drift from it; and the API coverage page marks what the gateway does serve."""

from __future__ import annotations

import re
from pathlib import Path

import botocore
import pytest

from shipyard.reference import PAGES, renderer
from shipyard.reference.coverage_page import NOT_SERVED, PARTLY, SERVED, statuses

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "reference"
STALE = "docs/reference/{page} differs from what the code generates: run make docs-reference"
_BOTOCORE = re.compile(r"as botocore (\S+)'s service models")


def _code_rows(text: str) -> list[str]:
    """The coverage rows that depend on shipyard's code alone: those not marked not served."""
    return [line for line in text.splitlines() if re.match(r"\| `\w+` \| (served|partly) \|", line)]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_committed_page_is_what_the_code_generates(page: str) -> None:
    committed = (FOLDER / page).read_text()
    generated = renderer(page)()
    if page == "api-coverage.md":
        found = _BOTOCORE.search(committed)
        assert found, "api-coverage.md names no botocore version"
        if found.group(1) != botocore.__version__:
            # Another botocore lists other operations: what the code serves must still match.
            assert _code_rows(committed) == _code_rows(generated), STALE.format(page=page)
            return
    assert committed == generated, STALE.format(page=page)


def test_coverage_marks_what_is_served_and_what_is_not() -> None:
    every = statuses()
    assert every["sagemaker"]["CreateEndpoint"][0] == SERVED
    assert every["sagemaker"]["CreateEndpointConfig"][0] == PARTLY
    assert "InstancePools" in every["sagemaker"]["CreateEndpointConfig"][1]
    assert every["sagemaker-runtime"]["InvokeEndpoint"][0] == SERVED
    assert every["sagemaker-runtime"]["InvokeEndpointWithResponseStream"][0] == SERVED
    assert every["cloudwatch"]["PutMetricAlarm"][0] == SERVED
    assert every["sagemaker"]["CreateHyperParameterTuningJob"][0] == NOT_SERVED
    assert every["logs"]["CreateLogGroup"][0] == NOT_SERVED


def test_pages_name_no_machine() -> None:
    for page in PAGES:
        text = renderer(page)()
        assert str(Path.home()) not in text, page
        assert str(FOLDER.parents[1]) not in text, page
