"""Filtering, sorting and paging shared by every List action."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from shipyard.errors import InvalidParameter

T = TypeVar("T")

DEFAULT_MAX_RESULTS = 10


def page(
    items: Sequence[T],
    params: dict[str, Any],
    *,
    name: Callable[[T], str],
    created: Callable[[T], datetime],
    sort_keys: dict[str, Callable[[T], Any]],
    modified: Callable[[T], datetime] | None = None,
    status: Callable[[T], str] | None = None,
) -> tuple[list[T], str | None]:
    """Apply NameContains/StatusEquals/time filters, SortBy/SortOrder and NextToken."""
    chosen = list(items)
    if contains := params.get("NameContains"):
        needle = contains.lower()
        chosen = [i for i in chosen if needle in name(i).lower()]
    if status is not None and (wanted := params.get("StatusEquals")):
        chosen = [i for i in chosen if status(i) == wanted]
    chosen = _time_filter(chosen, params, "CreationTime", created)
    if modified is not None:
        chosen = _time_filter(chosen, params, "LastModifiedTime", modified)
    key = sort_keys.get(params.get("SortBy", "CreationTime"), created)
    chosen.sort(key=key, reverse=params.get("SortOrder", "Descending") == "Descending")
    start = offset(params.get("NextToken"))
    size = int(params.get("MaxResults", DEFAULT_MAX_RESULTS))
    window = chosen[start : start + size]
    more = start + size < len(chosen)
    return window, (token(start + size) if more else None)


class _Job(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def created(self) -> datetime: ...
    @property
    def modified(self) -> datetime: ...
    @property
    def status(self) -> Any: ...


J = TypeVar("J", bound=_Job)


def page_jobs(jobs: Sequence[J], params: dict[str, Any], key: str) -> dict[str, Any]:
    """ListTrainingJobs / ListTransformJobs: filters, Name / CreationTime / Status order
    and NextToken over ``jobs``; ``key`` names the list (``TrainingJobSummaries``), whose
    items are the chosen jobs (summarised by the caller)."""
    chosen, next_token = page(
        jobs,
        params,
        name=lambda j: j.name,
        created=lambda j: j.created,
        modified=lambda j: j.modified,
        status=lambda j: str(j.status.value),
        sort_keys={
            "Name": lambda j: j.name,
            "CreationTime": lambda j: j.created,
            "Status": lambda j: str(j.status.value),
        },
    )
    out: dict[str, Any] = {key: chosen}
    if next_token:
        out["NextToken"] = next_token
    return out


def _time_filter(
    items: list[T], params: dict[str, Any], field: str, value: Callable[[T], datetime]
) -> list[T]:
    if (before := params.get(f"{field}Before")) is not None:
        items = [i for i in items if value(i).timestamp() < float(before)]
    if (after := params.get(f"{field}After")) is not None:
        items = [i for i in items if value(i).timestamp() > float(after)]
    return items


def token(at: int) -> str:
    """The NextToken of the page that starts at ``at``."""
    return base64.urlsafe_b64encode(f"offset:{at}".encode()).decode()


def offset(next_token: str | None) -> int:
    """Where a NextToken says to go on; InvalidParameter if it is not ours."""
    if not next_token:
        return 0
    try:
        kind, _, value = base64.urlsafe_b64decode(next_token.encode()).decode().partition(":")
        if kind == "offset" and value.isdigit():
            return int(value)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidParameter("Invalid pagination token.")
