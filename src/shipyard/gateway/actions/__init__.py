"""Control-plane actions: one module per resource family.

Each action takes the services and the request's JSON object and returns the response's
JSON object. AWS's field names stop here; services see plain arguments and records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.control.endpoints import EndpointService
from shipyard.gateway.actions import endpoint_configs, endpoints, models, tags, training_jobs
from shipyard.jobs.service import JobService

Action = Callable[[EndpointService, dict[str, Any]], dict[str, Any]]
JobAction = Callable[[JobService, dict[str, Any]], dict[str, Any]]

ACTIONS: dict[str, Action] = {
    **models.ACTIONS,
    **endpoint_configs.ACTIONS,
    **endpoints.ACTIONS,
    **tags.ACTIONS,
}

JOB_ACTIONS: dict[str, JobAction] = training_jobs.ACTIONS
