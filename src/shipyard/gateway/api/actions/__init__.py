"""Control-plane actions: one module per resource family.

Each action takes the service it acts on and the request's JSON object and returns the
response's JSON object. AWS's field names stop here; services see plain arguments and
records. ``registry`` gathers every family into the one table ``POST /`` serves
(gateway/wire/registry.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from shipyard.autoscaling.scaling import ScalingService
from shipyard.cloudwatch.service import CloudWatchService
from shipyard.control.components import ComponentService
from shipyard.control.endpoints import EndpointService
from shipyard.gateway.api.actions import (
    autoscaling,
    cloudwatch,
    endpoint_configs,
    endpoints,
    inference_components,
    logs,
    models,
    monitoring,
    processing_jobs,
    tags,
    training_jobs,
    transform_jobs,
)
from shipyard.gateway.wire.registry import (
    CLOUDWATCH,
    LOGS,
    SAGEMAKER,
    SCALING,
    ActionRegistry,
    Json,
    Service,
)
from shipyard.gateway.wire.validation import RequestValidator
from shipyard.jobs.service import JobService
from shipyard.logs.service import LogService
from shipyard.monitoring.service import MonitoringService
from shipyard.processing.service import ProcessingService
from shipyard.transform.service import TransformService

ACTIONS = {**models.ACTIONS, **endpoint_configs.ACTIONS, **endpoints.ACTIONS, **tags.ACTIONS}
"""SageMaker's actions on models, endpoint configs, endpoints and tags (EndpointService)."""

JOB_ACTIONS = training_jobs.ACTIONS
"""SageMaker's training-job actions (JobService)."""

LOCAL_URI_SHAPES = frozenset(
    {"Url", "ContainerImage", "S3Uri", "DestinationS3Uri", "MonitoringS3Uri", "SnsTopicArn"}
)
"""Shapes whose AWS pattern allows only https/s3 URLs or registry images: shipyard also
takes file:// and plain paths, and cmd: images (where ``auth:`` allows them, decided by
host_access.py), so their patterns are not enforced; their lengths are.
DestinationS3Uri and MonitoringS3Uri likewise; SnsTopicArn also takes topic names and
apprise URLs."""


def registry(
    *,
    endpoints_service: EndpointService,
    components: ComponentService,
    jobs: JobService,
    transforms: TransformService,
    scaling: ScalingService,
    log_service: LogService,
    cloudwatch_service: CloudWatchService,
    processing: ProcessingService,
    monitoring_service: MonitoringService,
) -> ActionRegistry:
    """Every control-plane action, bound to the service it acts on; SageMaker's requests
    checked against botocore's model (but LOCAL_URI_SHAPES' patterns)."""
    validator = RequestValidator(unpatterned=LOCAL_URI_SHAPES)
    # The jobs' templates are CreateTrainingJob requests: held to the same shapes.
    jobs.validate = functools.partial(validator.validate, "CreateTrainingJob")
    on: dict[str, object] = {
        "endpoints": endpoints_service,
        "components": components,
        "jobs": jobs,
        "transforms": transforms,
        "scaling": scaling,
        "logs": log_service,
        "cloudwatch": cloudwatch_service,
        "processing": processing,
        "monitoring": monitoring_service,
    }
    actions = ActionRegistry()
    for service, family, runs_on in FAMILIES:
        checked = validator if service is SAGEMAKER else None
        actions.add(service, family, on[runs_on], validator=checked)
    return actions


FAMILIES: tuple[tuple[Service, Mapping[str, Callable[[Any, Json], Json]], str], ...] = (
    (SAGEMAKER, ACTIONS, "endpoints"),
    (SAGEMAKER, inference_components.ACTIONS, "components"),
    (SAGEMAKER, JOB_ACTIONS, "jobs"),
    (SAGEMAKER, transform_jobs.ACTIONS, "transforms"),
    (SAGEMAKER, processing_jobs.ACTIONS, "processing"),
    (SAGEMAKER, monitoring.ACTIONS, "monitoring"),
    (SCALING, autoscaling.ACTIONS, "scaling"),
    (LOGS, logs.ACTIONS, "logs"),
    (CLOUDWATCH, cloudwatch.ACTIONS, "cloudwatch"),
)
"""Every family of actions ``POST /`` serves: its service, its actions, and which of
``registry``'s services they run on. The API coverage reference is computed from it."""
