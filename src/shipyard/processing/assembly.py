"""The processing package put together: the service (the API) and the supervisor that
runs what it records, over the ``processing_jobs`` table."""

from __future__ import annotations

from dataclasses import dataclass

from shipyard.backends import FullBackend
from shipyard.core import Core
from shipyard.events.kinds import Announcer, Topics
from shipyard.processing.service import ProcessingService
from shipyard.processing.supervisor import ProcessingSupervisor
from shipyard.records import Event, Job
from shipyard.storage import tables
from shipyard.storage.jobs import JobStore
from shipyard.storage.leases import PROCESSING_JOB


@dataclass(frozen=True)
class Processing:
    service: ProcessingService
    supervisor: ProcessingSupervisor


def _no_event(job: Job, previous: Job | None, notify: Topics) -> Event | None:
    """Processing jobs announce no events (no topic hears of them)."""
    return None


def build(core: Core, backend: FullBackend) -> Processing:
    settings = core.settings
    announcer = Announcer(_no_event, notify={})
    store = JobStore(core.store.engine, table=tables.processing_jobs, noun="Processing job")
    jobs_dir = settings.home / "processing"
    supervisor = ProcessingSupervisor(
        store=store,
        backend=backend,
        announcer=announcer,
        metrics=core.metrics,
        jobs_dir=jobs_dir,
        s3_endpoint_url=settings.s3_endpoint_url,
        stop_grace_s=settings.job_stop_grace_s,
        poll_period_s=settings.job_poll_period_s,
        on_event=core.on_event,
        claim=core.leases(PROCESSING_JOB).claim,
    )
    service = ProcessingService(
        store=store,
        announcer=announcer,
        wake=supervisor.wake,
        jobs_dir=jobs_dir,
        limit=settings.max_active_jobs,
        region=settings.region,
        account_id=settings.account_id,
        host_access=core.host_access,
    )
    return Processing(service=service, supervisor=supervisor)
