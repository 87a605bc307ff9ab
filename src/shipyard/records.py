"""Typed records of the domain and their status enums.

Status enums keep AWS's values so they serialise without a mapping. Each enum that is a
state machine keeps its allowed transitions beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class EndpointStatus(StrEnum):
    CREATING = "Creating"
    UPDATING = "Updating"
    SYSTEM_UPDATING = "SystemUpdating"
    ROLLING_BACK = "RollingBack"
    IN_SERVICE = "InService"
    DELETING = "Deleting"
    FAILED = "Failed"


ENDPOINT_TRANSITIONS: dict[EndpointStatus, frozenset[EndpointStatus]] = {
    EndpointStatus.CREATING: frozenset(
        {EndpointStatus.IN_SERVICE, EndpointStatus.FAILED, EndpointStatus.DELETING}
    ),
    EndpointStatus.UPDATING: frozenset(
        {EndpointStatus.IN_SERVICE, EndpointStatus.FAILED, EndpointStatus.DELETING}
    ),
    EndpointStatus.IN_SERVICE: frozenset(
        {EndpointStatus.UPDATING, EndpointStatus.DELETING, EndpointStatus.FAILED}
    ),
    EndpointStatus.FAILED: frozenset({EndpointStatus.DELETING, EndpointStatus.UPDATING}),
    EndpointStatus.DELETING: frozenset(),
    EndpointStatus.SYSTEM_UPDATING: frozenset({EndpointStatus.IN_SERVICE}),
    EndpointStatus.ROLLING_BACK: frozenset({EndpointStatus.IN_SERVICE}),
}


class RoutingStrategy(StrEnum):
    RANDOM = "RANDOM"
    LEAST_OUTSTANDING_REQUESTS = "LEAST_OUTSTANDING_REQUESTS"


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    arn: str
    image: str
    model_data_url: str | None
    environment: dict[str, str]
    execution_role_arn: str | None
    created: datetime
    raw: dict[str, Any] = field(default_factory=dict)
    """The request as the user sent it, echoed by DescribeModel."""


@dataclass(frozen=True, slots=True)
class VariantSpec:
    """One production variant of an endpoint config."""

    name: str
    model_name: str
    instance_type: str
    instance_count: int
    weight: float
    routing_strategy: RoutingStrategy


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    name: str
    arn: str
    variants: tuple[VariantSpec, ...]
    created: datetime
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VariantState:
    """What the user asked of one live variant (UpdateEndpointWeightsAndCapacities)."""

    name: str
    desired_weight: float
    desired_instance_count: int


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    arn: str
    config_name: str
    status: EndpointStatus
    failure_reason: str | None
    created: datetime
    modified: datetime
    variants: tuple[VariantState, ...]
    pending_config_name: str | None = None
    """Set while a blue/green UpdateEndpoint converges to a new config."""
    generation: int = 0
    """Bumped on every change of desired state, so the reconciler notices it."""
