"""The jobs package put together: the job service (the API) and the supervisor that runs
what it records, sharing one store and one announcer."""

from __future__ import annotations

from dataclasses import dataclass

from shipyard.backends import FullBackend
from shipyard.core import Core
from shipyard.events.kinds import Announcer, training_job_event
from shipyard.jobs.service import JobService
from shipyard.jobs.supervisor import JobSupervisor
from shipyard.stackfile import JobsConfig
from shipyard.storage.jobs import JobStore
from shipyard.storage.leases import TRAINING_JOB


@dataclass(frozen=True)
class Jobs:
    service: JobService
    supervisor: JobSupervisor


def build(core: Core, backend: FullBackend) -> Jobs:
    settings, stack = core.settings, core.stack
    config = (
        stack.jobs
        if "jobs" in stack.model_fields_set
        else JobsConfig(limit=settings.max_active_jobs)
    )
    announcer = Announcer(training_job_event, notify=config.notify)
    store = JobStore(core.store.engine)
    jobs_dir = settings.home / "jobs"
    supervisor = JobSupervisor(
        store=store,
        backend=backend,
        announcer=announcer,
        metrics=core.metrics,
        jobs_dir=jobs_dir,
        s3_endpoint_url=settings.s3_endpoint_url,
        stop_grace_s=settings.job_stop_grace_s,
        poll_period_s=settings.job_poll_period_s,
        on_event=core.on_event,
        claim=core.leases(TRAINING_JOB).claim,
    )
    service = JobService(
        store=store,
        config=config,
        announcer=announcer,
        wake=supervisor.wake,
        jobs_dir=jobs_dir,
        region=settings.region,
        account_id=settings.account_id,
        host_access=core.host_access,
        tagging=core.tagging,
    )
    return Jobs(service=service, supervisor=supervisor)
