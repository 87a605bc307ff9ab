"""CreateTransformJob, DescribeTransformJob, ListTransformJobs and StopTransformJob.

DescribeTransformJob keeps SageMaker's shape exactly (boto3 drops members its model does
not know); a job's progress is at ``/metrics`` and ``shipyard transform``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.gateway.api.actions.listing import page_jobs
from shipyard.records import TransformJob
from shipyard.transform.service import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_PAYLOAD_MB,
    TransformService,
)

# Echoed by DescribeTransformJob as the user sent them.
_ECHOED = (
    "ModelName",
    "MaxConcurrentTransforms",
    "ModelClientConfig",
    "MaxPayloadInMB",
    "BatchStrategy",
    "Environment",
    "TransformInput",
    "TransformOutput",
    "DataCaptureConfig",
    "TransformResources",
    "DataProcessing",
    "ExperimentConfig",
)


def create_transform_job(svc: TransformService, p: dict[str, Any]) -> dict[str, Any]:
    job = svc.create(p)
    if svc.tagging is not None:
        svc.tagging.add(job.arn, p.get("Tags"), checked=True)
    return {"TransformJobArn": job.arn}


def describe_transform_job(svc: TransformService, p: dict[str, Any]) -> dict[str, Any]:
    job = svc.describe(p["TransformJobName"])
    out: dict[str, Any] = {
        "TransformJobName": job.name,
        "TransformJobArn": job.arn,
        "TransformJobStatus": job.status.value,
        "CreationTime": job.created,
    }
    out.update({k: job.request[k] for k in _ECHOED if k in job.request})
    out.setdefault("MaxConcurrentTransforms", DEFAULT_CONCURRENCY)
    out.setdefault("MaxPayloadInMB", DEFAULT_MAX_PAYLOAD_MB)
    if job.failure_reason:
        out["FailureReason"] = job.failure_reason
    if job.started is not None:
        out["TransformStartTime"] = job.started
    if job.ended is not None:
        out["TransformEndTime"] = job.ended
    return out


def list_transform_jobs(svc: TransformService, p: dict[str, Any]) -> dict[str, Any]:
    out = page_jobs(svc.list_jobs(), p, "TransformJobSummaries")
    out["TransformJobSummaries"] = [_summary(j) for j in out["TransformJobSummaries"]]
    return out


def stop_transform_job(svc: TransformService, p: dict[str, Any]) -> dict[str, Any]:
    svc.stop(p["TransformJobName"])
    return {}


def _summary(job: TransformJob) -> dict[str, Any]:
    out: dict[str, Any] = {
        "TransformJobName": job.name,
        "TransformJobArn": job.arn,
        "CreationTime": job.created,
        "LastModifiedTime": job.modified,
        "TransformJobStatus": job.status.value,
    }
    if job.ended is not None:
        out["TransformEndTime"] = job.ended
    if job.failure_reason:
        out["FailureReason"] = job.failure_reason
    return out


ACTIONS: dict[str, Callable[[TransformService, dict[str, Any]], dict[str, Any]]] = {
    "CreateTransformJob": create_transform_job,
    "DescribeTransformJob": describe_transform_job,
    "ListTransformJobs": list_transform_jobs,
    "StopTransformJob": stop_transform_job,
}
