"""The transform package put together: the service (the API) and the supervisor that
runs its jobs on instances from the provisioner."""

from __future__ import annotations

from dataclasses import dataclass

from shipyard.core import Core
from shipyard.events.kinds import Announcer, transform_job_event
from shipyard.provisioning.fleet import Provisioner
from shipyard.storage.leases import TRANSFORM_JOB
from shipyard.storage.transform_jobs import TransformStore
from shipyard.transform.service import Budget, TransformService
from shipyard.transform.supervisor import TransformSupervisor


@dataclass(frozen=True)
class Transforms:
    service: TransformService
    supervisor: TransformSupervisor


def build(core: Core, provisioner: Provisioner, *, budget: Budget | None = None) -> Transforms:
    settings = core.settings
    store = TransformStore(core.store.engine)
    announcer = Announcer(transform_job_event, notify=core.stack.jobs.notify)
    supervisor = TransformSupervisor(
        store=store,
        models=core.store,
        provisioner=provisioner,
        objects=core.objects,
        metrics=core.metrics,
        announcer=announcer,
        on_event=core.on_event,
        claim=core.leases(TRANSFORM_JOB).claim,
    )
    service = TransformService(
        store=store,
        models=core.store,
        announcer=announcer,
        wake=supervisor.wake,
        region=settings.region,
        account_id=settings.account_id,
        max_instances=settings.max_instances_per_variant,
        budget=budget,
        host_access=core.host_access,
        tagging=core.tagging,
    )
    return Transforms(service=service, supervisor=supervisor)
