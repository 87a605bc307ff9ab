"""What a job's state change says: its event, and the short message subscribers read.

Every change of TrainingJobStatus or SecondaryStatus becomes an event (detail type
``SageMaker Training Job State Change``, detail shaped like DescribeTrainingJob). Only
changes of TrainingJobStatus that ``jobs.notify`` names are sent to topics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from shipyard.records import Event, Job

DETAIL_TYPE = "SageMaker Training Job State Change"
FINAL = frozenset({"Completed", "Failed", "Stopped"})


class JobAnnouncer:
    """Builds the event of each job change; ``notify`` maps TrainingJobStatus to topics."""

    def __init__(self, *, notify: Mapping[str, Sequence[str]]) -> None:
        self.notify = {status: tuple(targets) for status, targets in notify.items()}

    def __repr__(self) -> str:
        return f"JobAnnouncer(notify={self.notify!r})"

    def __call__(self, job: Job, previous: Job | None) -> Event | None:
        status_changed = previous is None or previous.status != job.status
        if previous is not None and not status_changed:
            if previous.secondary_status == job.secondary_status:
                return None
        if job.status in FINAL:
            # One key per final status: however often the change is seen, it is one event.
            key = f"{job.arn}#{job.status}"
        else:
            key = f"{job.arn}#{job.attempt}#{job.status}#{job.secondary_status}"
        topics = self.notify.get(job.status, ()) if status_changed else ()
        return Event(
            key=key,
            detail_type=DETAIL_TYPE,
            source="aws.sagemaker",
            resource=job.arn,
            detail=detail(job),
            topics=topics,
            subject=f"Job {job.name} {job.status}",
            message=message(job),
            time=job.modified,
        )


def detail(job: Job) -> dict[str, Any]:
    """The event's detail: DescribeTrainingJob's main fields, timestamps as ISO strings."""
    return {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "JobType": job.job_type,
        "TrainingJobStatus": job.status.value,
        "SecondaryStatus": job.secondary_status,
        "FailureReason": job.failure_reason,
        "ModelArtifacts": {"S3ModelArtifacts": job.model_artifacts},
        "CreationTime": _iso(job.created),
        "TrainingStartTime": _iso(job.started),
        "TrainingEndTime": _iso(job.ended),
        "Attempt": job.attempt,
    }


def message(job: Job) -> str:
    """Short and exact: job, type, start and end, duration, status, where the output is."""
    start = job.started or job.created
    lines = [
        f"Job: {job.name}",
        f"Type: {job.job_type or '-'}",
        f"Status: {job.status.value} ({job.secondary_status})",
        f"Started: {_iso(start)}",
    ]
    if job.ended is not None:
        lines.append(f"Ended: {_iso(job.ended)}")
        lines.append(f"Duration: {_duration(job.ended - start)}")
    if job.failure_reason:
        lines.append(f"Reason: {job.failure_reason}")
    lines.append(f"Output: {job.model_artifacts or output_prefix(job)}")
    return "\n".join(lines)


def output_prefix(job: Job) -> str:
    root = str(job.request.get("OutputDataConfig", {}).get("S3OutputPath", "")).rstrip("/")
    return f"{root}/{job.name}/output/"


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds").replace("+00:00", "Z")


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
