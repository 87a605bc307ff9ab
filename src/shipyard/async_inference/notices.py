"""What an asynchronous invocation tells its topics, in SageMaker's message shape.

SageMaker posts a JSON document to the endpoint config's SuccessTopic or ErrorTopic
(``eventName: InferenceResult``) and, when the endpoint is created, a
``TestNotification`` to both. The event key is fixed per request and outcome, so a
request processed twice (its worker died mid-way) is still announced once.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from shipyard.records import AsyncConfig, AsyncRequest, Event

DETAIL_TYPE = "SageMaker Async Inference Result"
MAX_INLINE_RESPONSE_BYTES = 128 * 1024
"""SageMaker includes the response in a notification only up to 128 KB."""


def notify_settings(config: AsyncConfig) -> dict[str, Any]:
    """The part of the config a request keeps, so its notifications don't change later."""
    return {
        "success_topic": config.success_topic,
        "error_topic": config.error_topic,
        "include_response_in": list(config.include_response_in),
    }


def result_event(
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
    """The event announcing how ``request`` ended; None when no topic hears it."""
    kind = "success" if succeeded else "error"
    topic = request.notify.get(f"{kind}_topic")
    if not topic:
        return None
    message: dict[str, Any] = {
        "awsRegion": region,
        "eventTime": _iso(at),
        "receivedTime": _iso(request.received),
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
        detail_type=DETAIL_TYPE,
        source="aws.sagemaker",
        resource=endpoint_arn,
        detail=message,
        topics=(topic,),
        subject=f"Inference {request.inference_id} on {request.endpoint} {status}",
        message=json.dumps(message),
        time=at,
    )


def test_event(
    config: AsyncConfig, *, endpoint: str, endpoint_arn: str, at: datetime, region: str
) -> Event | None:
    """SageMaker's TestNotification, sent to both topics when an async endpoint is created."""
    topics = tuple(dict.fromkeys(t for t in (config.success_topic, config.error_topic) if t))
    if not topics:
        return None
    message = {
        "awsRegion": region,
        "eventTime": _iso(at),
        "endpointName": endpoint,
        "eventVersion": "1.0",
        "eventSource": "aws:sagemaker",
        "eventName": "TestNotification",
    }
    return Event(
        key=f"async/{endpoint_arn}/test/{at.timestamp()}",
        detail_type=DETAIL_TYPE,
        source="aws.sagemaker",
        resource=endpoint_arn,
        detail=message,
        topics=topics,
        subject=f"Test notification for endpoint {endpoint}",
        message=json.dumps(message),
        time=at,
    )


def _inline(response: bytes) -> dict[str, str]:
    try:
        return {"content": response.decode("utf-8"), "encoding": "UTF-8"}
    except UnicodeDecodeError:
        return {"content": base64.b64encode(response).decode(), "encoding": "BASE64"}


def _iso(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
