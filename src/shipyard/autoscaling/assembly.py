"""Application Auto Scaling put together: the service (the API) and the autoscaler that
reads the gateway's metrics and steps the endpoints' instance counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shipyard.async_inference.consumer import BacklogReading
from shipyard.autoscaling.autoscaler import Autoscaler, MetricReader
from shipyard.autoscaling.scaling import ScalingService
from shipyard.background import Wakeup
from shipyard.control.assembly import Endpoints
from shipyard.core import Core
from shipyard.routing.router import Router
from shipyard.storage.metrics import MetricStore
from shipyard.storage.scaling import ScalingStore


@dataclass(frozen=True)
class Scaling:
    service: ScalingService
    autoscaler: Autoscaler


def build(
    core: Core,
    *,
    endpoints: Endpoints,
    router: Router,
    backlogs: dict[str, BacklogReading],
    wakeup: Wakeup,
    alarms_naming: Callable[[str], list[tuple[str, str]]],
) -> Scaling:
    settings = core.settings
    store = ScalingStore(core.store.engine)
    autoscaler = Autoscaler(
        store=store,
        endpoints=endpoints.service,
        reader=MetricReader(
            metrics=core.metrics,
            router=router,
            healthy=endpoints.reconciler.current_instance_counts,
            backlogs=backlogs,
            window_s=settings.autoscaling_window_s,
            period_s=settings.autoscaling_period_s,
            # Other gateways sharing the store (workers included): their recorded counts.
            metric_store=MetricStore(core.store.engine),
            source=settings.identity,
            settle_s=settings.metrics_tick_s + 2.0,
        ),
        period_s=settings.autoscaling_period_s,
        notify=core.stack.autoscaling.notify,
        on_event=core.on_event,
        acts_on=endpoints.reconciler.leases.holds,
        wakeup=wakeup,
        components=endpoints.components,
    )
    service = ScalingService(
        store=store,
        endpoints=endpoints.service,
        wake=autoscaler.wake,
        region=settings.region,
        account_id=settings.account_id,
        components=endpoints.components,
        alarms_naming=alarms_naming,
    )
    return Scaling(service=service, autoscaler=autoscaler)
