"""The List actions' order and paging (gateway/api/actions/listing.py), each as botocore
documents its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

import pytest

from shipyard.errors import InvalidParameter
from shipyard.gateway.api.actions import listing
from shipyard.gateway.api.actions.listing import page_jobs


class _Status(Enum):
    DONE = "Completed"


@dataclass(frozen=True)
class _Job:
    name: str
    created: datetime
    modified: datetime
    status: _Status = _Status.DONE


def _jobs() -> list[_Job]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [_Job(f"j{i}", start + timedelta(minutes=i), start) for i in (2, 0, 1)]


def test_training_jobs_are_listed_oldest_first_and_transform_jobs_newest_first() -> None:
    training = page_jobs(_jobs(), {}, "TrainingJobSummaries")["TrainingJobSummaries"]
    assert [j.name for j in training] == ["j0", "j1", "j2"]  # "The default is Ascending."
    transform = page_jobs(_jobs(), {}, "TransformJobSummaries")["TransformJobSummaries"]
    assert [j.name for j in transform] == ["j2", "j1", "j0"]  # "The default is Descending."
    asked = page_jobs(_jobs(), {"SortOrder": "Descending"}, "TrainingJobSummaries")
    assert [j.name for j in asked["TrainingJobSummaries"]] == ["j2", "j1", "j0"]


def test_a_training_jobs_token_goes_on_in_its_own_order() -> None:
    first = page_jobs(_jobs(), {"MaxResults": 2}, "TrainingJobSummaries")
    rest = page_jobs(
        _jobs(), {"MaxResults": 2, "NextToken": first["NextToken"]}, "TrainingJobSummaries"
    )
    assert [j.name for j in rest["TrainingJobSummaries"]] == ["j2"]
    assert "NextToken" not in rest


def test_a_token_made_by_hand_for_another_kind_of_key_is_refused() -> None:
    """Its scope right (it can be computed), its key a string where times are floats:
    InvalidParameter, not a 500."""
    params = {"MaxResults": 2}
    scope = listing._scope("TrainingJobSummaries", params)
    forged = listing._encode({"list": scope, "after": ["zz", "a"]})
    with pytest.raises(InvalidParameter, match="Invalid pagination token"):
        page_jobs(_jobs(), {**params, "NextToken": forged}, "TrainingJobSummaries")
