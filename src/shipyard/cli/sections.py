"""The plan for a stack file's ``topics:`` and ``jobs:`` sections on a running gateway.

The gateway holds them in memory (``GET /stack``; stack_config.py) with an owner
each: a topic, and the jobs section as a whole, belong to the stack that last put them,
or to the stack named after ``serve --config``'s file. As with tagged resources, a stack
changes or deletes only what it owns or what nobody owns; the rows and the one
``PUT /stack`` that carries them out are computed here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.errors import SectionConflict
from shipyard.stackfile import StackFile

_SETTINGS = ("limit", "white_list", "s3_bucket", "role_arn", "notify")
"""Fields of the jobs section shown as one "jobs settings" row (templates have their own)."""

Row = tuple[str, str, str, str]
"""(kind, name, action, detail): one row of a plan."""


Planner = Callable[[str, dict[str, Any], StackFile], tuple[list[Row], dict[str, Any] | None]]
"""``plan_apply`` or ``plan_destroy``: (stack, ``GET /stack``'s answer, file) -> rows, body."""


def plan_apply(
    stack: str, live: dict[str, Any], file: StackFile
) -> tuple[list[Row], dict[str, Any] | None]:
    """Rows, and the ``PUT /stack`` body (None: nothing to change), for ``apply``."""
    rows: list[Row] = []
    change: dict[str, Any] = {"stack": stack, "put_topics": {}, "remove_topics": []}
    topics, owners = live["topics"], live["topic_owners"]
    declared = file.topics if "topics" in file.model_fields_set else {}
    for name, urls in declared.items():
        owner = owners.get(name)
        if name in topics and owner not in (None, stack):
            raise SectionConflict(f"topic {name} belongs to stack {owner}")
        if name not in topics:
            rows.append(("topic", name, "create", _count(urls)))
            change["put_topics"][name] = urls
        elif topics[name] != urls:
            rows.append(("topic", name, "update", _count(urls)))
            change["put_topics"][name] = urls
        else:
            rows.append(("topic", name, "unchanged", _count(urls)))
    for name in sorted(topics):
        if owners.get(name) == stack and name not in declared:
            rows.append(("topic", name, "delete", ""))
            change["remove_topics"].append(name)
    if "jobs" in file.model_fields_set:
        owner = live["jobs_owner"]
        if owner not in (None, stack):
            raise SectionConflict(f"the jobs section belongs to stack {owner}")
        desired = file.jobs.model_dump(mode="json")
        rows += _jobs_rows(live["jobs"], desired, created=owner is None)
        if desired != live["jobs"] or owner is None:
            change["jobs"] = desired
    elif live["jobs_owner"] == stack:
        rows += _removed_jobs_rows(live["jobs"])
        change["remove_jobs"] = True
    return rows, _worth_sending(change, rows)


def plan_destroy(
    stack: str, live: dict[str, Any], file: StackFile
) -> tuple[list[Row], dict[str, Any] | None]:
    """Rows, and the ``PUT /stack`` body, removing what the file declares and ``stack``
    owns."""
    rows: list[Row] = []
    change: dict[str, Any] = {"stack": stack, "put_topics": {}, "remove_topics": []}
    if "topics" in file.model_fields_set:
        for name in file.topics:
            if name in live["topics"] and live["topic_owners"].get(name) == stack:
                rows.append(("topic", name, "delete", ""))
                change["remove_topics"].append(name)
    if "jobs" in file.model_fields_set and live["jobs_owner"] == stack:
        rows += _removed_jobs_rows(live["jobs"])
        change["remove_jobs"] = True
    return rows, _worth_sending(change, rows)


def _jobs_rows(current: dict[str, Any], desired: dict[str, Any], *, created: bool) -> list[Row]:
    rows: list[Row] = []
    before, after = current["templates"], desired["templates"]
    for name, template in after.items():
        if name not in before:
            rows.append(("job template", name, "create", ""))
        elif before[name] != template:
            rows.append(("job template", name, "update", ""))
        else:
            rows.append(("job template", name, "unchanged", ""))
    for name in sorted(set(before) - set(after)):
        rows.append(("job template", name, "delete", ""))
    changed = [f for f in _SETTINGS if current[f] != desired[f]]
    if created:
        rows.append(("jobs settings", "jobs", "create", f"limit {desired['limit']}"))
    elif changed:
        rows.append(("jobs settings", "jobs", "update", ", ".join(changed)))
    else:
        rows.append(("jobs settings", "jobs", "unchanged", f"limit {desired['limit']}"))
    return rows


def _removed_jobs_rows(current: dict[str, Any]) -> list[Row]:
    rows: list[Row] = [("job template", name, "delete", "") for name in current["templates"]]
    return [*rows, ("jobs settings", "jobs", "delete", "")]


def _worth_sending(change: dict[str, Any], rows: list[Row]) -> dict[str, Any] | None:
    return change if any(action != "unchanged" for _, _, action, _ in rows) else None


def _count(urls: list[str]) -> str:
    return f"{len(urls)} subscriber{'' if len(urls) == 1 else 's'}"
