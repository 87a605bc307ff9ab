"""Filtering, sorting and paging shared by every List action."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
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
    kind: str,
    name: Callable[[T], str],
    created: Callable[[T], datetime],
    sort_keys: dict[str, Callable[[T], Any]],
    modified: Callable[[T], datetime] | None = None,
    status: Callable[[T], str] | None = None,
    default_order: str = "Descending",
) -> tuple[list[T], str | None]:
    """Apply NameContains/StatusEquals/time filters, SortBy/SortOrder (``default_order``
    where none is given, as each action documents its own) and NextToken.

    A NextToken names the last item of its page by its sort key and name, not by its
    position: an item deleted or created between two pages neither skips one that was
    to come nor repeats one already listed. It is good only for the list it came from
    (``kind``, the same filters and order); another is InvalidParameter.
    """
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
    descending = params.get("SortOrder", default_order) == "Descending"

    def place(item: T) -> tuple[Any, str]:
        value = key(item)
        return (value.timestamp() if isinstance(value, datetime) else value, name(item))

    chosen.sort(key=place, reverse=descending)
    scope = _scope(kind, params)
    after = _after(params.get("NextToken"), scope)
    if after is not None:
        try:
            chosen = [i for i in chosen if (place(i) < after if descending else place(i) > after)]
        except TypeError:  # a token made by hand, its key not of this order's kind
            raise InvalidParameter("Invalid pagination token.") from None
    size = int(params.get("MaxResults", DEFAULT_MAX_RESULTS))
    window = chosen[:size]
    if len(chosen) <= size:
        return window, None
    return window, _encode({"list": scope, "after": list(place(window[-1]))})


_NOT_SCOPE = ("NextToken", "MaxResults")


def _scope(kind: str, params: dict[str, Any]) -> str:
    """What a list is: its action's kind, filters and order (a digest)."""
    asked = {k: v for k, v in params.items() if k not in _NOT_SCOPE}
    text = json.dumps([kind, asked], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _after(next_token: str | None, scope: str) -> tuple[Any, str] | None:
    """The sort key and name a NextToken of this list goes on after."""
    if not next_token:
        return None
    try:
        found = json.loads(base64.urlsafe_b64decode(next_token.encode()))
        value, name = found["after"]
        if found["list"] == scope and isinstance(name, str):
            if isinstance(value, int | float | str) and not isinstance(value, bool):
                return value, name
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, TypeError):
        pass
    raise InvalidParameter("Invalid pagination token.")


def _encode(cursor: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cursor).encode()).decode()


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
    items are the chosen jobs (summarised by the caller). Training and processing jobs
    are listed oldest first unless asked otherwise, transform jobs newest first, as
    botocore documents."""
    chosen, next_token = page(
        jobs,
        params,
        kind=key,
        default_order=(
            "Ascending"
            if key in ("TrainingJobSummaries", "ProcessingJobSummaries")
            else "Descending"
        ),
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
