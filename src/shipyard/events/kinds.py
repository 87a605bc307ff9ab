"""What each kind of state change says: one event builder per kind, in one place.

A service that changes state records the change's event in the same transaction
(storage/events.py, the outbox) and the dispatcher announces it (events/dispatcher.py).
What the event holds is decided here, for every kind:

=============================  ======================================================
builder                        the change, and who hears it
=============================  ======================================================
``training_job_event``         TrainingJobStatus or SecondaryStatus of a job; topics of
                               ``jobs.notify`` by status, on status changes only
``transform_job_event``        TransformJobStatus; topics of ``jobs.notify``
``inference_result_event``     an asynchronous invocation ended; the endpoint config's
                               SuccessTopic or ErrorTopic, in SageMaker's message shape
``test_notification_event``    an asynchronous endpoint was created; both topics
``scaling_activity_event``     an Application Auto Scaling activity ended;
                               ``autoscaling.notify``
``deployment_event``           an UpdateEndpoint's DeploymentConfig completed, rolled
                               back or failed; ``deployments.notify`` (recorded when
                               no topic hears it too)
``endpoint_events``            an endpoint's EndpointStatus, and each step a deployment
                               reaches (its stage and traffic share); no topic: the
                               events log's record
``component_events``           an inference component's InferenceComponentStatus; no
                               topic: the events log's record
=============================  ======================================================

Every status change is recorded, whether or not a topic hears it: the events log (the
console's Events page) is the record of what happened, notifications a view of it.

Every key is fixed per change (a final status, a request's outcome, an activity), so a
change seen twice (a worker that died mid-way, a gateway restarted) is announced once.
Jobs and transforms are announced through an ``Announcer``: the stack file's ``notify``
map and the builder of their kind.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from shipyard.records import (
    AsyncConfig,
    AsyncRequest,
    Endpoint,
    Event,
    InferenceComponent,
    Job,
    JobStatus,
    ScalableTarget,
    ScalingActivity,
    TransformJob,
)

TRAINING_JOB = "SageMaker Training Job State Change"
TRANSFORM_JOB = "SageMaker Transform Job State Change"
INFERENCE_RESULT = "SageMaker Async Inference Result"
SCALING_ACTIVITY = "Application Auto Scaling Scaling Activity State Change"
DEPLOYMENT = "Endpoint Deployment State Change"
ENDPOINT = "SageMaker Endpoint State Change"
DEPLOYMENT_STEP = "Endpoint Deployment Step"
COMPONENT = "SageMaker Inference Component State Change"

MAX_INLINE_RESPONSE_BYTES = 128 * 1024
"""SageMaker includes an asynchronous response in a notification only up to 128 KB."""

_FINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED})

R = TypeVar("R")
Topics = Mapping[str, tuple[str, ...]]


class Announcer(Generic[R]):
    """The event of each change of a resource ``R``, by the builder of its kind;
    ``notify`` maps a status to the topics that hear it (the stack file's ``notify``)."""

    def __init__(
        self,
        build: Callable[[R, R | None, Topics], Event | None],
        *,
        notify: Mapping[str, Sequence[str]],
    ) -> None:
        self.build = build
        self.notify: dict[str, tuple[str, ...]] = {s: tuple(t) for s, t in notify.items()}

    def __repr__(self) -> str:
        return f"Announcer({self.build.__name__}, notify={self.notify!r})"

    def __call__(self, resource: R, previous: R | None) -> Event | None:
        """The event of ``resource``'s change from ``previous``; None if it says nothing."""
        return self.build(resource, previous, self.notify)


# -- training jobs ------------------------------------------------------------------------


def training_job_event(job: Job, previous: Job | None, notify: Topics) -> Event | None:
    """Every change of TrainingJobStatus or SecondaryStatus (detail shaped like
    DescribeTrainingJob); sent to topics only on a change of TrainingJobStatus."""
    status_changed = previous is None or previous.status != job.status
    if previous is not None and not status_changed:
        if previous.secondary_status == job.secondary_status:
            return None
    if job.status in _FINAL:
        # One key per final status: however often the change is seen, it is one event.
        key = f"{job.arn}#{job.status}"
    else:
        key = f"{job.arn}#{job.attempt}#{job.status}#{job.secondary_status}"
    return Event(
        key=key,
        detail_type=TRAINING_JOB,
        source="aws.sagemaker",
        resource=job.arn,
        detail=training_job_detail(job),
        topics=notify.get(job.status, ()) if status_changed else (),
        subject=f"Job {job.name} {job.status}",
        message=training_job_message(job),
        time=job.modified,
    )


def training_job_detail(job: Job) -> dict[str, Any]:
    """DescribeTrainingJob's main fields, timestamps as ISO strings."""
    return {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "JobType": job.job_type,
        "TrainingJobStatus": job.status.value,
        "SecondaryStatus": job.secondary_status,
        "FailureReason": job.failure_reason,
        "ModelArtifacts": {"S3ModelArtifacts": job.model_artifacts},
        "CreationTime": _seconds(job.created),
        "TrainingStartTime": _seconds(job.started),
        "TrainingEndTime": _seconds(job.ended),
        "Attempt": job.attempt,
    }


def training_job_message(job: Job) -> str:
    """Short and exact: job, type, start and end, duration, status, where the output is."""
    start = job.started or job.created
    lines = [
        f"Job: {job.name}",
        f"Type: {job.job_type or '-'}",
        f"Status: {job.status.value} ({job.secondary_status})",
        f"Started: {_seconds(start)}",
    ]
    if job.ended is not None:
        lines.append(f"Ended: {_seconds(job.ended)}")
        lines.append(f"Duration: {_duration(job.ended - start)}")
    if job.failure_reason:
        lines.append(f"Reason: {job.failure_reason}")
    lines.append(f"Output: {job.model_artifacts or output_prefix(job)}")
    return "\n".join(lines)


def output_prefix(job: Job) -> str:
    """Where a training job's output goes: ``<S3OutputPath>/<name>/output/``."""
    root = str(job.request.get("OutputDataConfig", {}).get("S3OutputPath", "")).rstrip("/")
    return f"{root}/{job.name}/output/"


# -- transform jobs -----------------------------------------------------------------------


def transform_job_event(
    job: TransformJob, previous: TransformJob | None, notify: Topics
) -> Event | None:
    """Every change of TransformJobStatus, with its progress."""
    if previous is not None and previous.status == job.status:
        return None
    return Event(
        key=f"{job.arn}#{job.status}",
        detail_type=TRANSFORM_JOB,
        source="aws.sagemaker",
        resource=job.arn,
        detail=transform_job_detail(job),
        topics=notify.get(job.status.value, ()),
        subject=f"Transform job {job.name} {job.status}",
        message=transform_job_message(job),
        time=job.modified,
    )


def transform_job_detail(job: TransformJob) -> dict[str, Any]:
    return {
        "TransformJobName": job.name,
        "TransformJobArn": job.arn,
        "TransformJobStatus": job.status.value,
        "FailureReason": job.failure_reason,
        "ModelName": job.request.get("ModelName"),
        "TransformOutput": job.request.get("TransformOutput"),
        "CreationTime": _seconds(job.created),
        "TransformStartTime": _seconds(job.started),
        "TransformEndTime": _seconds(job.ended),
        "ObjectsDone": job.objects_done,
        "ObjectsTotal": job.objects_total,
        "RecordsDone": job.records_done,
    }


def transform_job_message(job: TransformJob) -> str:
    lines = [
        f"Transform job: {job.name}",
        f"Status: {job.status.value}",
        f"Model: {job.request.get('ModelName')}",
        f"Started: {_seconds(job.started or job.created)}",
    ]
    if job.ended is not None:
        lines.append(f"Ended: {_seconds(job.ended)}")
    total = "?" if job.objects_total is None else str(job.objects_total)
    lines.append(f"Objects: {job.objects_done} of {total}, records: {job.records_done}")
    if job.failure_reason:
        lines.append(f"Reason: {job.failure_reason}")
    lines.append(f"Output: {job.request.get('TransformOutput', {}).get('S3OutputPath')}")
    return "\n".join(lines)


# -- asynchronous invocations -------------------------------------------------------------


def inference_result_event(
    request: AsyncRequest,
    *,
    succeeded: bool,
    at: datetime,
    region: str,
    endpoint_arn: str,
    failure_reason: str | None = None,
    response: bytes | None = None,
    response_type: str | None = None,
) -> Event | None:
    """How ``request`` ended, as SageMaker posts it (``eventName: InferenceResult``);
    None when no topic hears it."""
    kind = "success" if succeeded else "error"
    topic = request.notify.get(f"{kind}_topic")
    if not topic:
        return None
    message: dict[str, Any] = {
        "awsRegion": region,
        "eventTime": _millis(at),
        "receivedTime": _millis(request.received),
        "invocationStatus": "Completed" if succeeded else "Failed",
        "requestParameters": {
            "accept": request.accept,
            "contentType": request.content_type,
            "customAttributes": request.custom_attributes,
            "endpointName": request.endpoint,
            "inputLocation": request.input_location,
        },
        "responseParameters": {"contentType": response_type},
        "inferenceId": request.inference_id,
        "eventVersion": "1.0",
        "eventSource": "aws:sagemaker",
        "eventName": "InferenceResult",
    }
    if succeeded:
        message["responseParameters"]["outputLocation"] = request.output_location
    else:
        message["failureReason"] = failure_reason
        message["responseParameters"]["failureLocation"] = request.failure_location
    if kind in request.notify.get("include_response_in", ()) and response is not None:
        if len(response) <= MAX_INLINE_RESPONSE_BYTES:
            message["responseBody"] = _inline(response)
    status = "Completed" if succeeded else "Failed"
    return Event(
        key=f"async/{endpoint_arn}/{request.inference_id}/result",
        detail_type=INFERENCE_RESULT,
        source="aws.sagemaker",
        resource=endpoint_arn,
        detail=message,
        topics=(topic,),
        subject=f"Inference {request.inference_id} on {request.endpoint} {status}",
        message=json.dumps(message),
        time=at,
    )


def test_notification_event(
    config: AsyncConfig, *, endpoint: str, endpoint_arn: str, at: datetime, region: str
) -> Event | None:
    """SageMaker's TestNotification, sent to both topics when an async endpoint is created."""
    topics = tuple(dict.fromkeys(t for t in (config.success_topic, config.error_topic) if t))
    if not topics:
        return None
    message = {
        "awsRegion": region,
        "eventTime": _millis(at),
        "endpointName": endpoint,
        "eventVersion": "1.0",
        "eventSource": "aws:sagemaker",
        "eventName": "TestNotification",
    }
    return Event(
        key=f"async/{endpoint_arn}/test/{at.timestamp()}",
        detail_type=INFERENCE_RESULT,
        source="aws.sagemaker",
        resource=endpoint_arn,
        detail=message,
        topics=topics,
        subject=f"Test notification for endpoint {endpoint}",
        message=json.dumps(message),
        time=at,
    )


# -- autoscaling --------------------------------------------------------------------------


def scaling_activity_event(
    target: ScalableTarget, activity: ScalingActivity, topics: Sequence[str]
) -> Event:
    """An activity that ended (DescribeScalingActivities' shape), one event per activity."""
    return Event(
        key=f"scaling-activity:{activity.activity_id}",
        detail_type=SCALING_ACTIVITY,
        source="aws.application-autoscaling",
        resource=target.arn,
        detail=scaling_activity_detail(activity),
        topics=tuple(topics),
        subject=f"Scaling {activity.resource_id} {activity.status}",
        message=(
            f"{activity.resource_id}: {activity.description} "
            f"({activity.from_count} -> {activity.to_count})\n"
            f"Cause: {activity.cause}\n"
            f"Status: {activity.status}: {activity.status_message or ''}"
        ),
        time=activity.ended or activity.started,
    )


def scaling_activity_detail(activity: ScalingActivity) -> dict[str, Any]:
    """A ScalingActivity as DescribeScalingActivities spells it, timestamps as ISO text."""
    detail: dict[str, Any] = {
        "ActivityId": activity.activity_id,
        "ServiceNamespace": "sagemaker",
        "ResourceId": activity.resource_id,
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "Description": activity.description,
        "Cause": activity.cause,
        "StartTime": activity.started.isoformat(),
        "StatusCode": activity.status.value,
    }
    if activity.ended is not None:
        detail["EndTime"] = activity.ended.isoformat()
    if activity.status_message:
        detail["StatusMessage"] = activity.status_message
    return detail


# -- deployments --------------------------------------------------------------------------


def deployment_event(
    *,
    endpoint: str,
    arn: str,
    config: str,
    state: str,
    reason: str,
    started: float,
    at: datetime,
    topics: Sequence[str],
) -> Event:
    """A deployment's end (``Completed``, ``RolledBack`` or ``Failed``), once per
    deployment and state."""
    detail = {
        "EndpointName": endpoint,
        "EndpointArn": arn,
        "EndpointConfigName": config,
        "DeploymentState": state,
        "StartTime": datetime.fromtimestamp(started, at.tzinfo).isoformat(),
    }
    if reason:
        detail["Reason"] = reason
    return Event(
        key=f"deployment:{endpoint}:{started:.6f}:{state}",
        detail_type=DEPLOYMENT,
        source="aws.sagemaker",
        resource=arn,
        detail=detail,
        topics=tuple(topics),
        subject=f"Deployment of {endpoint} to {config} {state}"[:100],
        message=f"Endpoint {endpoint}: the deployment of endpoint configuration {config} "
        f"{state.lower().replace('rolledback', 'rolled back')}."
        + (f"\nReason: {reason}" if reason else ""),
        time=at,
    )


# -- endpoints ----------------------------------------------------------------------------


def endpoint_events(endpoint: Endpoint, previous: Endpoint | None) -> list[Event]:
    """What a change of ``endpoint`` from ``previous`` (None: it was just created) says:
    its new EndpointStatus, and the step a deployment reached. Keys are fixed per
    endpoint (its creation time), generation and status or step, so a change is one
    event."""
    events: list[Event] = []
    if previous is None or previous.status != endpoint.status:
        events.append(_endpoint_status_event(endpoint))
    step = _step(endpoint.deployment)
    if step is not None and step != (None if previous is None else _step(previous.deployment)):
        events.append(_deployment_step_event(endpoint, *step))
    return events


def _endpoint_status_event(endpoint: Endpoint) -> Event:
    status = endpoint.status.value
    detail: dict[str, Any] = {
        "EndpointName": endpoint.name,
        "EndpointArn": endpoint.arn,
        "EndpointConfigName": endpoint.config_name,
        "EndpointStatus": status,
        "CreationTime": _seconds(endpoint.created),
        "LastModifiedTime": _seconds(endpoint.modified),
    }
    if endpoint.failure_reason:
        detail["FailureReason"] = endpoint.failure_reason
    born = endpoint.created.timestamp()
    return Event(
        key=f"endpoint:{endpoint.arn}:{born:.6f}:{endpoint.generation}:{status}",
        detail_type=ENDPOINT,
        source="aws.sagemaker",
        resource=endpoint.arn,
        detail=detail,
        topics=(),
        subject=f"Endpoint {endpoint.name} {status}"[:100],
        message=f"Endpoint {endpoint.name} is {status}."
        + (f"\nReason: {endpoint.failure_reason}" if endpoint.failure_reason else ""),
        time=endpoint.modified,
    )


def _step(deployment: Mapping[str, Any] | None) -> tuple[float, str, float] | None:
    """(started, stage, share) of a deployment under way; None when none is."""
    if not deployment or not deployment.get("stage"):
        return None
    started = float(deployment.get("started") or 0.0)
    return started, str(deployment["stage"]), round(float(deployment.get("share") or 0.0), 6)


def _deployment_step_event(endpoint: Endpoint, started: float, stage: str, share: float) -> Event:
    detail = {
        "EndpointName": endpoint.name,
        "EndpointArn": endpoint.arn,
        "EndpointConfigName": endpoint.pending_config_name or endpoint.config_name,
        "DeploymentStage": stage,
        "TrafficShare": share,
        "StartTime": datetime.fromtimestamp(started, endpoint.modified.tzinfo).isoformat(),
    }
    return Event(
        key=f"deployment:{endpoint.name}:{started:.6f}:step:{stage}:{share:.6f}",
        detail_type=DEPLOYMENT_STEP,
        source="aws.sagemaker",
        resource=endpoint.arn,
        detail=detail,
        topics=(),
        subject=f"Deployment of {endpoint.name}: {stage} at {share:.0%}"[:100],
        message=f"Endpoint {endpoint.name}: deployment {stage}, the new fleet takes "
        f"{share:.0%} of the traffic.",
        time=endpoint.modified,
    )


# -- inference components ----------------------------------------------------------------


def component_events(
    component: InferenceComponent, previous: InferenceComponent | None
) -> list[Event]:
    """What a change of ``component`` from ``previous`` (None: it was just created) says:
    its new InferenceComponentStatus. Keyed by the component's creation and the write's
    time, so a status reached again (InService after each update) is an event of its
    own, and one write is one event."""
    if previous is not None and previous.status == component.status:
        return []
    status = component.status.value
    detail: dict[str, Any] = {
        "InferenceComponentName": component.name,
        "InferenceComponentArn": component.arn,
        "EndpointName": component.endpoint,
        "VariantName": component.variant,
        "InferenceComponentStatus": status,
        "DesiredCopyCount": component.copies,
        "CreationTime": _seconds(component.created),
        "LastModifiedTime": _seconds(component.modified),
    }
    if component.failure_reason:
        detail["FailureReason"] = component.failure_reason
    born, at = component.created.timestamp(), component.modified.timestamp()
    return [
        Event(
            key=f"component:{component.arn}:{born:.6f}:{at:.6f}:{status}",
            detail_type=COMPONENT,
            source="aws.sagemaker",
            resource=component.arn,
            detail=detail,
            topics=(),
            subject=f"Inference component {component.name} {status}"[:100],
            message=f"Inference component {component.name} on endpoint "
            f"{component.endpoint} is {status}."
            + (f"\nReason: {component.failure_reason}" if component.failure_reason else ""),
            time=component.modified,
        )
    ]


# -- shared -------------------------------------------------------------------------------


def _seconds(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds").replace("+00:00", "Z")


def _millis(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _duration(delta: timedelta) -> str:
    total = max(0.0, delta.total_seconds())
    if total < 60:
        return f"{total:.1f}s"
    seconds = int(total)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {seconds}s"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def _inline(response: bytes) -> dict[str, str]:
    try:
        return {"content": response.decode("utf-8"), "encoding": "UTF-8"}
    except UnicodeDecodeError:
        return {"content": base64.b64encode(response).decode(), "encoding": "BASE64"}
