"""The monitoring package put together: the service (the API) and the runs' loop."""

from __future__ import annotations

from dataclasses import dataclass

from shipyard.cloudwatch.service import CloudWatchService
from shipyard.control.endpoints import EndpointService
from shipyard.core import Core
from shipyard.monitoring.runs import MonitorRuns
from shipyard.monitoring.service import MonitoringService
from shipyard.processing.service import ProcessingService
from shipyard.storage.leases import MONITORING
from shipyard.storage.monitoring import MonitoringStore


@dataclass(frozen=True)
class Monitoring:
    service: MonitoringService
    runs: MonitorRuns


def build(
    core: Core,
    *,
    processing: ProcessingService,
    endpoints: EndpointService,
    cloudwatch: CloudWatchService,
) -> Monitoring:
    settings = core.settings
    runs: MonitorRuns | None = None

    def wake() -> None:
        if runs is not None:
            runs.wake()

    service = MonitoringService(
        store=MonitoringStore(core.store.engine),
        processing=processing,
        endpoints=endpoints,
        region=settings.region,
        account_id=settings.account_id,
        wake=wake,
        host_access=core.host_access,
    )
    runs = MonitorRuns(
        service=service,
        cloudwatch=cloudwatch,
        period_s=min(2.0, settings.job_poll_period_s * 4),
        claim=core.leases(MONITORING).claim,
    )
    return Monitoring(service=service, runs=runs)
