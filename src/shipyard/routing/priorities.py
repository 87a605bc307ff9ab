"""Admission rules a variant's model sets, and what each request asks of them.

A real-time variant (or inference component) may hold its requests in a bounded
priority queue at the gateway. Its model's ``Environment`` says how
(``queue_rules``): how many priority levels (1, the most urgent, to N, numbered as
Triton numbers them), the level of a request that names none, how many requests may
wait, a default deadline, and what a request still waiting at its deadline gets
(refused, or run late). A variant that sets none keeps one level and is admitted as
before.

Each request may ask for a level and a deadline through its door's own field: the
``shipyard-priority`` and ``shipyard-deadline-ms`` items of ``CustomAttributes``
(``from_custom_attributes``), the Open Inference Protocol's ``priority`` and
``timeout`` parameters (``from_oip``), the OpenAI door's ``service_tier``
(``from_service_tier``), each read into ``Call.priority`` and ``Call.deadline_s``;
once its variant is chosen, ``resolve`` turns them into the level it waits at and its
deadline. A value out of range, a key given twice or an unknown ``shipyard-`` key is the
door's validation error, naming key and value; nothing is run.

Parsed here by hand: the formats are ours (a few ``key=value`` items), and each
refusal must name the exact key and value the caller sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shipyard.errors import InvalidParameter, RuntimeValidationError

LEVELS = "SHIPYARD_PRIORITY_LEVELS"
DEFAULT_PRIORITY = "SHIPYARD_DEFAULT_PRIORITY"
MAX_QUEUE_SIZE = "SHIPYARD_MAX_QUEUE_SIZE"
DEFAULT_DEADLINE_MS = "SHIPYARD_DEFAULT_DEADLINE_MS"
DEADLINE_ACTION = "SHIPYARD_DEADLINE_ACTION"
VARIABLES = (LEVELS, DEFAULT_PRIORITY, MAX_QUEUE_SIZE, DEFAULT_DEADLINE_MS, DEADLINE_ACTION)
"""The model ``Environment`` variables that set a variant's admission rules."""

MAX_LEVELS = 16
PRIORITY_KEY = "shipyard-priority"
DEADLINE_KEY = "shipyard-deadline-ms"
_OUR_PREFIX = "shipyard-"
_ITEM_SPLIT = re.compile(r"[,;]")
_TIERS_URGENT = frozenset({"priority", "fast"})
_TIERS_DEFAULT = frozenset({"auto", "default", "scale"})


@dataclass(frozen=True, slots=True)
class QueueRules:
    """A variant's admission rules (``queue_rules`` reads them from its model)."""

    levels: int = 1
    """Priority levels, 1 (most urgent) to ``levels``."""
    default_level: int = 1
    """The level of a request that names none (or names 0)."""
    max_queue: int | None = None
    """Requests that may wait, all levels together, per variant and gateway process;
    None: the gateway's per-instance default times the variant's instances."""
    deadline_s: float | None = None
    """The default deadline, from when the gateway has the whole request to when it
    must have started on an instance; None: no deadline."""
    run_late: bool = False
    """A request still waiting at its deadline runs late (DELAY) instead of being
    refused then (REJECT)."""
    configured: bool = False
    """Whether the model set any of the variables: only then do requests wait at the
    gateway whatever the routing strategy."""


UNCONFIGURED = QueueRules()


LEAST = -1
"""A priority that asks for the least urgent level, whatever their number (OpenAI's
``flex``)."""


def queue_rules(environment: Mapping[str, str]) -> QueueRules:
    """The rules ``environment`` (a model's) sets.

    Raises:
        InvalidParameter: a value out of range or not a whole number, naming the
            variable.
    """
    if not any(name in environment for name in VARIABLES):
        return UNCONFIGURED
    levels = _whole(environment, LEVELS, low=1, high=MAX_LEVELS, default=1)
    default_level = _whole(
        environment, DEFAULT_PRIORITY, low=1, high=levels, default=(levels + 1) // 2
    )
    max_queue = _whole(environment, MAX_QUEUE_SIZE, low=0, high=None, default=-1)
    deadline_ms = _whole(environment, DEFAULT_DEADLINE_MS, low=0, high=None, default=0)
    action = str(environment.get(DEADLINE_ACTION, "REJECT")).strip()
    if action not in ("REJECT", "DELAY"):
        raise InvalidParameter(
            f"Environment {DEADLINE_ACTION} must be REJECT or DELAY, got {action!r}."
        )
    return QueueRules(
        levels=levels,
        default_level=default_level,
        max_queue=None if max_queue < 0 else max_queue,
        deadline_s=deadline_ms / 1000 if deadline_ms > 0 else None,
        run_late=action == "DELAY",
        configured=True,
    )


def configured_variables(environment: Mapping[str, str]) -> list[str]:
    """The admission variables ``environment`` sets (refused where a variant cannot
    queue: asynchronous and multi-model ones)."""
    return [name for name in VARIABLES if name in environment]


def resolve(
    rules: QueueRules, priority: int | None, deadline_s: float | None
) -> tuple[int, float | None]:
    """The level and deadline of a request that asked for ``priority`` (0 or None: the
    default; LEAST: the least urgent) and ``deadline_s`` (None: none), under its
    variant's ``rules``: the earlier of its own deadline and the variant's default.

    Raises:
        RuntimeValidationError: a priority above the variant's levels.
    """
    if not priority:
        level = rules.default_level
    elif priority == LEAST:
        level = rules.levels
    elif 0 < priority <= rules.levels:
        level = priority
    else:
        raise RuntimeValidationError(
            f"{PRIORITY_KEY} (priority) {priority} is out of range: this endpoint's "
            f"levels are 1 to {rules.levels}, and 0 asks for the default."
        )
    if rules.deadline_s is not None:
        deadline_s = rules.deadline_s if deadline_s is None else min(deadline_s, rules.deadline_s)
    return level, deadline_s


def from_custom_attributes(value: str) -> tuple[int | None, float | None]:
    """The ``shipyard-priority`` and ``shipyard-deadline-ms`` items of a
    ``CustomAttributes`` header (items split on ``,`` and ``;``, ``key=value``, keys
    case-insensitive, spaces ignored); the other items are the model's. The priority is
    checked against the variant's levels later (``resolve``).

    Raises:
        RuntimeValidationError: a value not a decimal integer, a key given twice, an
            unknown ``shipyard-`` key.
    """
    found: dict[str, str] = {}
    for item in _ITEM_SPLIT.split(value):
        key, sep, raw = item.partition("=")
        key = key.strip().lower()
        if not key.startswith(_OUR_PREFIX):
            continue
        raw = raw.strip()
        if key not in (PRIORITY_KEY, DEADLINE_KEY) or not sep:
            raise RuntimeValidationError(
                f"CustomAttributes item {item.strip()!r} is not one shipyard reads: give "
                f"{PRIORITY_KEY}=<level> or {DEADLINE_KEY}=<milliseconds>."
            )
        if key in found:
            raise RuntimeValidationError(f"CustomAttributes names {key} more than once.")
        found[key] = raw
    priority = None
    if PRIORITY_KEY in found:
        priority = _whole_number(PRIORITY_KEY, found[PRIORITY_KEY])
    deadline_s = None
    if DEADLINE_KEY in found:
        deadline_ms = _whole_number(DEADLINE_KEY, found[DEADLINE_KEY])
        deadline_s = deadline_ms / 1000 if deadline_ms > 0 else None  # 0: the default
    return priority, deadline_s


def from_oip(parameters: Mapping[str, Any] | None) -> tuple[int | None, float | None]:
    """The Open Inference Protocol request's ``priority`` (a level, 0 the default) and
    ``timeout`` (microseconds, 0 none) parameters, as tritonclient sends them.

    Raises:
        RuntimeValidationError: either not a whole number 0 or more.
    """
    if not parameters:
        return None, None
    priority = None
    if "priority" in parameters:
        priority = _whole_number("priority", parameters["priority"])
    deadline_s = None
    if "timeout" in parameters:
        timeout = _whole_number("timeout", parameters["timeout"])
        deadline_s = timeout / 1_000_000 if timeout > 0 else None
    return priority, deadline_s


def from_service_tier(tier: Any) -> int | None:
    """The OpenAI request's ``service_tier``: ``priority`` and ``fast`` the most urgent
    level, ``flex`` the least (LEAST), ``auto``, ``default``, ``scale`` or none the
    default (None).

    Raises:
        RuntimeValidationError: any other value.
    """
    if tier is None or tier in _TIERS_DEFAULT:
        return None
    if tier in _TIERS_URGENT:
        return 1
    if tier == "flex":
        return LEAST
    raise RuntimeValidationError(
        f"service_tier {tier!r} is not one of auto, default, flex, scale, priority, fast."
    )


def _whole_number(key: str, raw: Any) -> int:
    value = _integer(raw)
    if value is None or value < 0:
        raise RuntimeValidationError(f"{key} must be a whole number, 0 or more, got {raw!r}.")
    return value


def _integer(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    if not text.isdecimal() or not text.isascii():
        return None
    return int(text)


def _whole(
    environment: Mapping[str, str], name: str, *, low: int, high: int | None, default: int
) -> int:
    if name not in environment:
        return default
    raw = str(environment[name]).strip()
    value = _integer(raw)
    if value is None or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise InvalidParameter(f"Environment {name} must be a whole number {bound}, got {raw!r}.")
    return value
