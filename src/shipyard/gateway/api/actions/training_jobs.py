"""CreateTrainingJob, DescribeTrainingJob, ListTrainingJobs and StopTrainingJob."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shipyard.gateway.api.actions.listing import page_jobs
from shipyard.jobs.service import JobService
from shipyard.records import Job

# Echoed by DescribeTrainingJob as the user sent them.
_ECHOED = (
    "HyperParameters",
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "Environment",
    "RetryStrategy",
    "ExperimentConfig",
)


def create_training_job(svc: JobService, p: dict[str, Any]) -> dict[str, Any]:
    job, _ = svc.create(p)
    if svc.tagging is not None:
        svc.tagging.add(job.arn, p.get("Tags"), checked=True)
    return {"TrainingJobArn": job.arn}


def describe_training_job(svc: JobService, p: dict[str, Any]) -> dict[str, Any]:
    job = svc.describe(p["TrainingJobName"])
    out: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "ModelArtifacts": {"S3ModelArtifacts": job.model_artifacts or ""},
        "TrainingJobStatus": job.status.value,
        "SecondaryStatus": job.secondary_status,
        "StoppingCondition": job.request.get("StoppingCondition") or {},
        "CreationTime": job.created,
        "LastModifiedTime": job.modified,
        "SecondaryStatusTransitions": [_transition(s) for s in job.transitions],
    }
    out.update({k: job.request[k] for k in _ECHOED if k in job.request})
    if job.failure_reason:
        out["FailureReason"] = job.failure_reason
    if job.started is not None:
        out["TrainingStartTime"] = job.started
    if job.ended is not None:
        out["TrainingEndTime"] = job.ended
        if job.started is not None:
            seconds = max(1, round((job.ended - job.started).total_seconds()))
            out["TrainingTimeInSeconds"] = seconds
            out["BillableTimeInSeconds"] = seconds
    return out


def list_training_jobs(svc: JobService, p: dict[str, Any]) -> dict[str, Any]:
    out = page_jobs(svc.list_jobs(), p, "TrainingJobSummaries")
    out["TrainingJobSummaries"] = [_summary(j) for j in out["TrainingJobSummaries"]]
    return out


def stop_training_job(svc: JobService, p: dict[str, Any]) -> dict[str, Any]:
    svc.stop(p["TrainingJobName"])
    return {}


def _transition(s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"Status": s.status, "StartTime": s.start, "StatusMessage": s.message}
    if s.end is not None:
        out["EndTime"] = s.end
    return out


def _summary(job: Job) -> dict[str, Any]:
    out: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "CreationTime": job.created,
        "LastModifiedTime": job.modified,
        "TrainingJobStatus": job.status.value,
        "SecondaryStatus": job.secondary_status,
    }
    if job.ended is not None:
        out["TrainingEndTime"] = job.ended
    return out


ACTIONS: dict[str, Callable[[JobService, dict[str, Any]], dict[str, Any]]] = {
    "CreateTrainingJob": create_training_job,
    "DescribeTrainingJob": describe_training_job,
    "ListTrainingJobs": list_training_jobs,
    "StopTrainingJob": stop_training_job,
}
