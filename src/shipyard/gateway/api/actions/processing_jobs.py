"""CreateProcessingJob, DescribeProcessingJob, ListProcessingJobs and StopProcessingJob."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.gateway.api.actions.listing import page_jobs
from shipyard.processing.service import ProcessingService
from shipyard.records import Job

# Echoed by DescribeProcessingJob as the user sent them.
_ECHOED = (
    "ProcessingInputs",
    "ProcessingOutputConfig",
    "ProcessingResources",
    "StoppingCondition",
    "AppSpecification",
    "Environment",
    "NetworkConfig",
    "RoleArn",
    "ExperimentConfig",
)


def create_processing_job(svc: ProcessingService, p: dict[str, Any]) -> dict[str, Any]:
    job = svc.create(p)
    return {"ProcessingJobArn": job.arn}


def describe_processing_job(svc: ProcessingService, p: dict[str, Any]) -> dict[str, Any]:
    return describe(svc.describe(p["ProcessingJobName"]))


def describe(job: Job) -> dict[str, Any]:
    """DescribeProcessingJob's answer for ``job``."""
    out: dict[str, Any] = {
        "ProcessingJobName": job.name,
        "ProcessingJobArn": job.arn,
        "ProcessingJobStatus": job.status.value,
        "CreationTime": job.created,
        "LastModifiedTime": job.modified,
    }
    out.update({k: job.request[k] for k in _ECHOED if k in job.request})
    if job.model_artifacts is not None:  # a processing job's ExitMessage
        out["ExitMessage"] = job.model_artifacts
    if job.failure_reason:
        out["FailureReason"] = job.failure_reason
    if job.started is not None:
        out["ProcessingStartTime"] = job.started
    if job.ended is not None:
        out["ProcessingEndTime"] = job.ended
    if job.job_type:  # a monitoring run's schedule
        out["MonitoringScheduleArn"] = job.job_type
    return out


def list_processing_jobs(svc: ProcessingService, p: dict[str, Any]) -> dict[str, Any]:
    out = page_jobs(svc.list_jobs(), p, "ProcessingJobSummaries")
    out["ProcessingJobSummaries"] = [_summary(j) for j in out["ProcessingJobSummaries"]]
    return out


def stop_processing_job(svc: ProcessingService, p: dict[str, Any]) -> dict[str, Any]:
    svc.stop(p["ProcessingJobName"])
    return {}


def _summary(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ProcessingJobName": job.name,
        "ProcessingJobArn": job.arn,
        "CreationTime": job.created,
        "LastModifiedTime": job.modified,
        "ProcessingJobStatus": job.status.value,
    }
    if job.ended is not None:
        out["ProcessingEndTime"] = job.ended
    if job.failure_reason:
        out["FailureReason"] = job.failure_reason
    if job.model_artifacts is not None:
        out["ExitMessage"] = job.model_artifacts
    return out


ACTIONS: dict[str, Callable[[ProcessingService, dict[str, Any]], dict[str, Any]]] = {
    "CreateProcessingJob": create_processing_job,
    "DescribeProcessingJob": describe_processing_job,
    "ListProcessingJobs": list_processing_jobs,
    "StopProcessingJob": stop_processing_job,
}
