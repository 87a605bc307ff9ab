"""CloudWatch put together: the recorder, the service and the alarms' evaluator."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shipyard.async_inference.consumer import BacklogReading
from shipyard.backends.base import Backend
from shipyard.cloudwatch.alarms import (
    AlarmActions,
    AlarmEvaluator,
    PolicyRunner,
    action_check,
    alarms_naming,
)
from shipyard.cloudwatch.recorder import Instances, Readings, Recorder
from shipyard.cloudwatch.service import CloudWatchService
from shipyard.core import Core
from shipyard.provisioning.fleet import Fleet
from shipyard.records import ScalingPolicy
from shipyard.routing.router import Router
from shipyard.storage.metrics import MetricStore


@dataclass(frozen=True)
class CloudWatch:
    service: CloudWatchService
    recorder: Recorder
    evaluator: AlarmEvaluator


def build(
    core: Core,
    *,
    router: Router,
    backlogs: dict[str, BacklogReading],
    run_policy: PolicyRunner,
    policy_by_arn: Callable[[str], ScalingPolicy | None],
    unknown_topics: Callable[[Sequence[str]], list[str]],
    fleets: Mapping[str, Fleet] | None = None,
    backend: Backend | None = None,
) -> CloudWatch:
    settings = core.settings
    store = MetricStore(core.store.engine)
    actions = AlarmActions(
        store=store,
        region=settings.region,
        account_id=settings.account_id,
        run_policy=run_policy,
        on_event=core.on_event,
    )
    service = CloudWatchService(
        store=store,
        region=settings.region,
        account_id=settings.account_id,
        check_action=action_check(policy_by_arn=policy_by_arn, unknown_topics=unknown_topics),
        transition=actions.transition,
        retention_days=settings.metrics_retention_days,
        max_series=settings.max_metric_series,
        max_alarms=settings.max_alarms,
    )
    recorder = Recorder(
        store=store,
        read=Readings(metrics=core.metrics, router=router, backlogs=backlogs).take,
        source=settings.identity,
        read_slowly=None
        if fleets is None or backend is None
        else Instances(fleets=fleets, backend=backend).take,
        retention_days=settings.metrics_retention_days,
        tick_s=settings.metrics_tick_s,
    )
    evaluator = AlarmEvaluator(
        service=service,
        actions=actions,
        leases=core.leases("alarms"),
        tick_s=settings.metrics_tick_s,
        lag_s=settings.metrics_tick_s + 2.0,
    )
    return CloudWatch(service=service, recorder=recorder, evaluator=evaluator)


def naming_alarms(core: Core) -> Callable[[str], list[tuple[str, str]]]:
    """A policy's ARN -> (name, ARN) of the alarms whose actions name it, read from the
    store: for Application Auto Scaling, built before CloudWatch (which runs its step
    policies)."""
    return functools.partial(alarms_naming, MetricStore(core.store.engine))
