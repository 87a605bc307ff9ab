"""The stack file's resource sections, and YAML read with the line of every value.

``models``, ``endpoint_configs`` and ``endpoints`` map a name to the body of its SageMaker
Create call without the name (DESIGN 2.5); ``scaling`` maps ``endpoint/variant`` to one
scalable target and its target-tracking policy. The fields checked here are the ones a
plan depends on (names, counts, weights, references); everything else in a body is passed
through to the gateway, which validates it against the service model on the Create call.

Errors name the file, the line and the field, one per line::

    stack.yaml:12: endpoint_configs.scores-v1.ProductionVariants[0].InitialVariantWeight:
    Input should be a valid number
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"
"""SageMaker's pattern for model, endpoint config, endpoint and variant names."""


class ProductionVariant(BaseModel):
    """One entry of ``ProductionVariants`` (or ``ShadowProductionVariants``)."""

    model_config = ConfigDict(extra="allow")

    VariantName: str = Field(pattern=_NAME, max_length=63)
    ModelName: str | None = Field(default=None, pattern=_NAME, max_length=63)
    """A model the file declares (its deployed version is used) or one that exists."""
    InstanceType: str | None = None
    InitialInstanceCount: int | None = Field(default=None, ge=0)
    InitialVariantWeight: float | None = Field(default=None, ge=0)


class ModelBody(BaseModel):
    """CreateModel without ``ModelName``."""

    model_config = ConfigDict(extra="allow")

    PrimaryContainer: dict[str, Any] | None = None
    Containers: list[dict[str, Any]] | None = None
    Tags: list[dict[str, str]] = Field(default_factory=list)


class EndpointConfigBody(BaseModel):
    """CreateEndpointConfig without ``EndpointConfigName``."""

    model_config = ConfigDict(extra="allow")

    ProductionVariants: list[ProductionVariant] = Field(min_length=1)
    ShadowProductionVariants: list[ProductionVariant] | None = None
    Tags: list[dict[str, str]] = Field(default_factory=list)


class EndpointBody(BaseModel):
    """CreateEndpoint without ``EndpointName``."""

    model_config = ConfigDict(extra="forbid")

    EndpointConfigName: str = Field(pattern=_NAME, max_length=63)
    """An endpoint config the file declares (its deployed version is used) or one that
    exists."""
    Tags: list[dict[str, str]] = Field(default_factory=list)


class ScalingTarget(BaseModel):
    """RegisterScalableTarget on one variant, and one target-tracking policy on it."""

    model_config = ConfigDict(extra="forbid")

    MinCapacity: int = Field(ge=0)
    MaxCapacity: int = Field(ge=1)
    TargetValue: float = Field(gt=0)
    PredefinedMetricType: str = "SageMakerVariantInvocationsPerInstance"
    ScaleInCooldown: int | None = Field(default=None, ge=0)
    ScaleOutCooldown: int | None = Field(default=None, ge=0)


class StackResources(BaseModel):
    """What ``shipyard apply`` creates on a running gateway; ``serve`` leaves it alone."""

    models: dict[str, ModelBody] = Field(default_factory=dict)
    """Model name -> CreateModel body without the name."""
    endpoint_configs: dict[str, EndpointConfigBody] = Field(default_factory=dict)
    """Endpoint config name -> CreateEndpointConfig body without the name."""
    endpoints: dict[str, EndpointBody] = Field(default_factory=dict)
    """Endpoint name -> CreateEndpoint body without the name."""
    scaling: dict[str, ScalingTarget] = Field(default_factory=dict)
    """``endpoint/variant`` -> its scalable target and target-tracking policy."""

    def check_resources(self) -> None:
        """Names are SageMaker names and ``scaling`` keys name a declared endpoint."""
        for section in ("models", "endpoint_configs", "endpoints"):
            for name in getattr(self, section):
                if not _valid_name(name):
                    raise ValueError(f"{section}.{name}: not a SageMaker name ({_NAME})")
        for key in self.scaling:
            endpoint, _, variant = key.partition("/")
            if not (_valid_name(endpoint) and _valid_name(variant)):
                raise ValueError(f"scaling.{key}: not endpoint/variant")
            if endpoint not in self.endpoints:
                raise ValueError(f"scaling.{key}: endpoint {endpoint!r} is not declared")
            if self.scaling[key].MinCapacity > self.scaling[key].MaxCapacity:
                raise ValueError(f"scaling.{key}: MinCapacity is above MaxCapacity")


def _valid_name(name: str) -> bool:
    return len(name) <= 63 and re.fullmatch(_NAME, name) is not None


# -- reading YAML with line numbers ---------------------------------------------------------

Loc = tuple[str, ...]


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[Loc, int]]:
    """The mapping in ``path`` and the 1-based line of every key and item in it.

    Errors (unreadable file, bad YAML, not a mapping) are ValueErrors that start with
    ``<path>:<line>:`` where there is a line to name.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ValueError(f"{where}: {exc.problem or exc.context or exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}:1: a stack file is a YAML mapping")
    lines: dict[Loc, int] = {}
    if node is not None:
        _mark(node, (), lines)
    return data, lines


def _mark(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*loc, str(key.value))
            lines[here] = key.start_mark.line + 1
            _mark(value, here, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _mark(item, (*loc, str(index)), lines)


def validation_errors(path: Path, exc: ValidationError, lines: Mapping[Loc, int]) -> str:
    """One line per error: ``<path>:<line>: <field>: <message>``."""
    out = []
    for error in exc.errors(include_url=False):
        field = _dotted(error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        head, colon, _ = message.partition(": ")
        if colon and " " not in head and head.startswith(field):
            # A check over several fields names the one at fault at the head of its message.
            field, message = "", message
            loc = _loc(head)
        else:
            loc = tuple(str(part) for part in error["loc"])
        line = _line_of(loc, lines)
        where = f"{path}:{line}" if line else str(path)
        out.append(f"{where}: {field}: {message}" if field else f"{where}: {message}")
    return "\n".join(out)


def _loc(dotted: str) -> Loc:
    """``auth.keys[1].x`` as ``("auth", "keys", "1", "x")``."""
    return tuple(part for part in re.split(r"[.\[\]]+", dotted) if part)


def _line_of(loc: Loc, lines: Mapping[Loc, int]) -> int | None:
    """The line of ``loc``, else of its nearest enclosing key that the file has."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("endpoint_configs", "a", "ProductionVariants", 0, "x")`` as
    ``endpoint_configs.a.ProductionVariants[0].x``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
