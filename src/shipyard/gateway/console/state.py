"""What the console shows, read from the store and from the gateway's memory.

Two kinds of source, read two ways:

- the store (endpoints, configs, jobs, transform jobs, events): blocking SQLAlchemy
  calls, which the door runs in a worker thread so the event loop never waits on them;
- the gateway's memory (the reconciler's fleets, the async consumer's backlog readings,
  the metrics registry): plain attribute reads on the event loop, no I/O and no lock
  but prometheus_client's own, held for one read of each series.

None of it is on the data path: invocations take the gateway's fast path straight to
the runtime door and never reach this module. The records returned here are plain
snapshots; nothing holds a reference into live objects after a call returns.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shipyard.async_inference.consumer import BacklogReading
from shipyard.cloudwatch.service import CloudWatchService, MetricStat, Query
from shipyard.control.endpoints import EndpointService
from shipyard.errors import ShipyardError
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, Slot
from shipyard.records import (
    Endpoint,
    EndpointConfig,
    Event,
    InferenceComponent,
    Job,
    TransformJob,
    VariantSpec,
)
from shipyard.routing.serverless import ServerlessAdmission
from shipyard.routing.table import EndpointRoute
from shipyard.storage.events import EventLog, EventState

HISTORY_S = 1800
"""How far back the charts start, from the stored datapoints."""

_CHARTED = (
    ("Invocations", "Sum"),
    ("Invocation4XXErrors", "Sum"),
    ("Invocation5XXErrors", "Sum"),
    ("ModelLatency", "Average"),
    ("OverheadLatency", "Average"),
)

_WANTED = {
    "shipyard_invocations_total": "invocations",
    "shipyard_invocation_4xx_errors_total": "errors_4xx",
    "shipyard_invocation_5xx_errors_total": "errors_5xx",
    "shipyard_model_latency_seconds_sum": "model_latency_sum_s",
    "shipyard_model_latency_seconds_count": "model_latency_count",
    "shipyard_overhead_latency_seconds_sum": "overhead_latency_sum_s",
}
"""Series the charts read, by their sample name, and the key each is sent under."""

MAX_LISTED = 50
"""Most jobs (and transform jobs) a list shows, newest first; the rest are counted.

Every row shown costs its JSON decoded on the gateway's CPU, which the data path shares
(a thread holding the GIL delays the event loop), so lists stay short."""

MAX_SCANNED = 500
"""For a key scoped by resource, the newest jobs (or events) looked through for those it
reaches: its lists, and their counts, are of what it reaches among these."""

Reaches = Callable[[str], bool]
"""Whether the caller's key reaches a resource, by its ARN (``auth.Caller.reaches``)."""


@dataclass(frozen=True, slots=True)
class VariantRow:
    """One variant of an endpoint as the console shows it."""

    name: str
    model: str
    instance_type: str
    desired_instances: int
    healthy_instances: int
    weight: float
    routing: str
    serverless: dict[str, int] | None = None
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """One endpoint on the overview: status, variants and their instance counts."""

    name: str
    status: str
    failure_reason: str | None
    config_name: str
    pending_config_name: str | None
    modified: datetime
    variants: tuple[VariantRow, ...]
    is_async: bool
    components: tuple[ComponentRow, ...] = ()
    """An endpoint of inference components: each one's copies, healthy and desired."""
    captures: bool = False
    """Its config captures data (DataCaptureConfig with a destination, enabled)."""


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One instance of a variant: where it stands with the reconciler and the router."""

    instance_id: str
    variant: str
    state: str
    """``healthy``, ``unhealthy`` or ``starting``."""
    in_flight: int
    restarts: int | None
    """None where this gateway only routes to it (another one runs its fleet)."""
    ping_failures: int | None
    latency_ms: float
    models: tuple[str, ...]
    """Multi-model: the TargetModels the gateway believes it holds, least recent first."""
    streams: int = 0
    """Bidirectional streams open on it (InvokeEndpointWithBidirectionalStream)."""


@dataclass(frozen=True, slots=True)
class ServerlessRow:
    variant: str
    active: int
    """Requests admitted and not finished."""
    max_concurrency: int
    memory_mb: int
    provisioned: int | None
    instances: int


@dataclass(frozen=True, slots=True)
class ComponentRow:
    """One inference component of an endpoint: its copies and where they are placed."""

    name: str
    variant: str
    status: str
    failure_reason: str | None
    desired: int
    current: int
    cpus: float
    memory_mb: int
    placed_on: tuple[int, ...]
    """The instance (index in its variant) of each copy."""


@dataclass(frozen=True, slots=True)
class EndpointDetail:
    """Everything the endpoint page shows but its charts."""

    row: EndpointRow
    instances: tuple[InstanceRow, ...]
    starting: dict[str, int]
    multi_model: frozenset[str]
    """Variants that serve a MultiModel model."""
    serverless: tuple[ServerlessRow, ...]
    backlog: BacklogReading | None
    mirrored: bool = False
    """Another gateway sharing the store runs the fleet; this one only routes to it."""
    components: tuple[ComponentRow, ...] = ()
    hosts: dict[str, int] = field(default_factory=dict)
    """Per variant of inference components: its instances."""
    sessions: int = 0
    """Sessions open on the endpoint (on this gateway)."""
    alarms: tuple[AlarmRow, ...] = ()
    """CloudWatch alarms on the endpoint's metrics."""
    deployment: dict[str, Any] | None = None
    """The deployment under way (Endpoint.deployment), if any."""


@dataclass(frozen=True, slots=True)
class AlarmRow:
    """A CloudWatch alarm whose dimensions name the endpoint."""

    name: str
    metric: str
    state: str
    reason: str
    updated: datetime


@dataclass(frozen=True, slots=True)
class Listing:
    """The newest ``MAX_LISTED`` of a kind of job, and how many there are in all."""

    jobs: tuple[Any, ...]
    total: int
    by_status: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobReads:
    """How the console reads training and transform jobs (store calls: they block)."""

    newest_jobs: Callable[[int], tuple[list[Job], dict[str, int]]]
    describe_job: Callable[[str], Job]
    newest_transforms: Callable[[int], tuple[list[TransformJob], dict[str, int]]]
    describe_transform: Callable[[str], TransformJob]
    newest_processing: Callable[[int], tuple[list[Job], dict[str, int]]] | None = None
    """Processing jobs, as ``newest_jobs``; None: the console shows none."""
    describe_processing: Callable[[str], Job] | None = None
    schedules: Callable[[], list[Any]] | None = None
    """Model Monitor's schedules (storage/monitoring.py's Schedule); None: none shown."""
    schedule: Callable[[str], Any] | None = None
    """A schedule's page: monitoring/service.py's ``schedule_view`` (raises when unknown)."""


class ConsoleState:
    """Reads for the console; the store methods block (run them in a thread)."""

    def __init__(
        self,
        *,
        endpoints: EndpointService,
        fleets: Mapping[str, Fleet],
        routes: Mapping[str, EndpointRoute],
        backlogs: Mapping[str, BacklogReading],
        metrics: Metrics,
        jobs: JobReads,
        events: EventLog,
        components: Callable[[str], list[InferenceComponent]] = lambda endpoint: [],
        sessions: Callable[[str], int] = lambda endpoint: 0,
        cloudwatch: CloudWatchService | None = None,
        fleet_of: Callable[[str], Fleet | None] | None = None,
    ) -> None:
        self.cloudwatch = cloudwatch
        """Where the charts' history and the alarms come from (a store read: it blocks)."""
        self.endpoints = endpoints
        self.components_of = components
        """An endpoint's inference components (a store read: it blocks)."""
        self.sessions = sessions
        self.fleets = fleets
        """The fleets this gateway runs (their instances, with their processes)."""
        self.fleet_of = fleet_of or fleets.get
        """An endpoint's fleet, run here or by the gateway that holds it (the mirror's
        copy): its healthy counts and copies, as DescribeEndpoint counts them."""
        self.routes = routes
        self.backlogs = backlogs
        self.metrics = metrics
        self.describe_job = jobs.describe_job
        self.describe_transform = jobs.describe_transform
        self._jobs = jobs
        self.events = events

    def __repr__(self) -> str:
        return f"ConsoleState(fleets={len(self.fleets)})"

    # -- from the store (blocking) ----------------------------------------------------

    def endpoint_records(
        self, reaches: Reaches | None = None
    ) -> tuple[list[Endpoint], dict[str, EndpointConfig]]:
        """Every endpoint (that ``reaches``) and the configs they name: two queries,
        whatever their number."""
        endpoints = self.endpoints.list_endpoints()
        if reaches is not None:
            endpoints = [e for e in endpoints if reaches(e.arn)]
        configs = {c.name: c for c in self.endpoints.list_endpoint_configs()}
        for endpoint in endpoints:  # one the user deleted is kept while the endpoint runs it
            if endpoint.config_name not in configs:
                with contextlib.suppress(ShipyardError):
                    configs[endpoint.config_name] = self.endpoints.store.get_endpoint_config(
                        endpoint.config_name
                    )
        return endpoints, configs

    def endpoint_record(self, name: str) -> tuple[Endpoint, EndpointConfig | None]:
        endpoint = self.endpoints.store.get_endpoint(name)
        try:
            # What it runs, though the user may have deleted it (MetadataStore._retire).
            config = self.endpoints.store.get_endpoint_config(endpoint.config_name)
        except ShipyardError:
            config = None
        return endpoint, config

    def arn(self, kind: str, name: str) -> str:
        """The ARN of resource ``name`` of ``kind`` (``endpoint``, ``training-job``...)."""
        return self.endpoints.arn(kind, name)

    def jobs(self, reaches: Reaches | None = None, name: str = "", status: str = "") -> Listing:
        """The newest training jobs; with a filter (a part of the name, a status: as
        ListTrainingJobs takes them), those among the newest ``MAX_SCANNED`` that match."""
        if reaches is None and not name and not status:
            return _listing(*self._jobs.newest_jobs(MAX_LISTED))
        found = self._jobs.newest_jobs(MAX_SCANNED)[0]
        return _reached(found, _matching(reaches, name, status))

    def transforms(
        self, reaches: Reaches | None = None, name: str = "", status: str = ""
    ) -> Listing:
        if reaches is None and not name and not status:
            return _listing(*self._jobs.newest_transforms(MAX_LISTED))
        found = self._jobs.newest_transforms(MAX_SCANNED)[0]
        return _reached(found, _matching(reaches, name, status))

    def processing(self, reaches: Reaches | None = None) -> Listing:
        newest = self._jobs.newest_processing
        if newest is None:
            return Listing((), 0)
        if reaches is None:
            return _listing(*newest(MAX_LISTED))
        return _reached(newest(MAX_SCANNED)[0], reaches)

    def describe_processing(self, name: str) -> Job:
        if self._jobs.describe_processing is None:
            raise ShipyardError(f"No processing job {name}.")
        return self._jobs.describe_processing(name)

    def schedules(self, reaches: Reaches | None = None) -> list[Any]:
        if self._jobs.schedules is None:
            return []
        found = self._jobs.schedules()
        return found if reaches is None else [s for s in found if reaches(s.arn)]

    def schedule(self, name: str) -> Any:
        if self._jobs.schedule is None:
            raise ShipyardError(f"No monitoring schedule {name}.")
        return self._jobs.schedule(name)

    def recent_events(
        self, limit: int, reaches: Reaches | None = None, resource: str = ""
    ) -> list[EventState]:
        """The ``limit`` newest events (about resources that ``reaches``, and about the
        resource named ``resource`` when given: among the newest ``MAX_SCANNED``)."""
        if reaches is None and not resource:
            return self.events.recent_events(limit)
        scanned = self.events.recent_events(max(limit, MAX_SCANNED))
        return [
            s
            for s in scanned
            if (reaches is None or reaches(self.about(s.event)))
            and (not resource or names(s.event, resource))
        ][:limit]

    def about(self, event: Event) -> str:
        """The ARN of the resource an event is about: its ``resource``, but for a scaling
        activity (whose resource is the scalable target) the endpoint it scales, as the
        control door scopes Application Auto Scaling's ``ResourceId``."""
        resource_id = event.detail.get("ResourceId")
        if event.source == "aws.application-autoscaling" and isinstance(resource_id, str):
            kind, _, rest = resource_id.partition("/")
            if kind == "endpoint" and rest:
                return self.arn("endpoint", rest.split("/")[0])
        return event.resource

    # -- from memory (on the event loop) ----------------------------------------------

    def rows(
        self,
        endpoints: Iterable[Endpoint],
        configs: Mapping[str, EndpointConfig],
        components: Iterable[InferenceComponent] = (),
    ) -> list[EndpointRow]:
        hosted: dict[str, list[InferenceComponent]] = {}
        for c in components:
            hosted.setdefault(c.endpoint, []).append(c)
        return [self.row(e, configs.get(e.config_name), hosted.get(e.name, ())) for e in endpoints]

    def row(
        self,
        endpoint: Endpoint,
        config: EndpointConfig | None,
        components: Sequence[InferenceComponent] = (),
    ) -> EndpointRow:
        specs: dict[str, VariantSpec] = {v.name: v for v in config.variants} if config else {}
        counted = self.fleet_of(endpoint.name)
        healthy = {} if counted is None else counted.healthy()
        variants = []
        # Names as the user gave them: a config or model deleted and its name taken by a
        # new one is kept under a hidden name (MetadataStore._make_room), which its own
        # request still names.
        given = {
            v.get("VariantName"): v.get("ModelName")
            for key in ("ProductionVariants", "ShadowProductionVariants")
            for v in (config.raw.get(key) or [] if config else [])
        }
        for state in endpoint.variants:
            spec = specs.get(state.name)
            variants.append(
                VariantRow(
                    name=state.name,
                    model=str(given.get(state.name) or spec.model_name) if spec else "",
                    instance_type=spec.instance_type if spec else "",
                    desired_instances=state.desired_instance_count,
                    healthy_instances=healthy.get(state.name, 0),
                    weight=state.desired_weight,
                    routing=spec.routing_strategy.value if spec else "",
                    serverless=spec.serverless.describe() if spec and spec.serverless else None,
                    shadow=state.shadow,
                )
            )
        return EndpointRow(
            name=endpoint.name,
            status=endpoint.status.value,
            failure_reason=endpoint.failure_reason,
            config_name=str(config.raw.get("EndpointConfigName", endpoint.config_name))
            if config
            else endpoint.config_name,
            pending_config_name=endpoint.pending_config_name,
            modified=endpoint.modified,
            variants=tuple(variants),
            is_async=bool(config and config.async_config),
            captures=_captures(config),
            components=tuple(_component_row(c, counted) for c in components) if components else (),
        )

    def detail(
        self,
        endpoint: Endpoint,
        config: EndpointConfig | None,
        components: Sequence[InferenceComponent] = (),
    ) -> EndpointDetail:
        fleet = self.fleets.get(endpoint.name)
        counted = self.fleet_of(endpoint.name)
        instances: list[InstanceRow] = []
        serverless: list[ServerlessRow] = []
        multi_model: set[str] = set()
        if fleet is not None:
            for variant, slots in fleet.slots.items():
                for slot in slots:
                    instances.append(_instance_row(slot.spec.instance_id, variant, slot))
                template = fleet.templates.get(variant)
                if template is not None and (template.prefix or template.agent):
                    multi_model.add(variant)
            for variant, route in fleet.serverless.items():
                serverless.append(
                    ServerlessRow(
                        variant=variant,
                        active=route.active,
                        max_concurrency=route.config.max_concurrency,
                        memory_mb=route.config.memory_mb,
                        provisioned=route.config.provisioned_concurrency,
                        instances=len(fleet.slots.get(variant, ())),
                    )
                )
        table = self.routes.get(endpoint.name) if fleet is None else None
        if table is not None:
            instances, multi_model, serverless = _from_route(table)
        return EndpointDetail(
            row=self.row(endpoint, config, components),
            instances=tuple(instances),
            starting=dict(fleet.starting) if fleet is not None else {},
            multi_model=frozenset(multi_model),
            serverless=tuple(serverless),
            backlog=self.backlogs.get(endpoint.name),
            mirrored=table is not None,
            components=tuple(_component_row(c, counted) for c in components),
            hosts=dict(counted.hosts) if counted is not None else {},
            sessions=self.sessions(endpoint.name),
            deployment=endpoint.deployment,
        )

    def component_row(self, component: InferenceComponent) -> ComponentRow:
        """A component's copies as its endpoint's fleet counts them (on the event loop)."""
        return _component_row(component, self.fleet_of(component.endpoint))

    def alarms_of(self, endpoint: str) -> tuple[AlarmRow, ...]:
        """The alarms on ``endpoint``'s metrics (a store read: it blocks)."""
        if self.cloudwatch is None:
            return ()
        return tuple(
            AlarmRow(
                name=a.name,
                metric=str(a.config.get("MetricName") or "metric math"),
                state=a.state,
                reason=a.reason,
                updated=a.state_updated,
            )
            for a in self.cloudwatch.describe_alarms()
            if {"Name": "EndpointName", "Value": endpoint} in (a.config.get("Dimensions") or ())
        )

    def datapoints(self, endpoint: str, *, seconds: int = HISTORY_S) -> list[dict[str, Any]]:
        """The endpoint's 10 s datapoints of the last ``seconds``, as the charts draw
        them: per period and variant, invocations and errors per second and the mean
        latency in ms (store reads: they block)."""
        if self.cloudwatch is None:
            return []
        try:
            variants = [v.name for v in self.endpoints.store.get_endpoint(endpoint).variants]
        except ShipyardError:
            return []
        queries: list[Query] = []
        for n, variant in enumerate(sorted(variants)):
            where = (("EndpointName", endpoint), ("VariantName", variant))
            for metric, stat in _CHARTED:
                stats = MetricStat("AWS/SageMaker", metric, where, 10, stat)
                queries.append(Query(f"q{n}_{metric}", stat=stats, label=variant))
        end = time.time()
        results = self.cloudwatch.metric_data(queries, end - seconds, end) if queries else []
        periods: dict[int, dict[str, dict[str, float | None]]] = {}
        for query, result in zip(queries, results, strict=True):
            metric = query.id.split("_", 1)[1]
            for at, value in result.points.items():
                values = periods.setdefault(at, {}).setdefault(result.label, {})
                values[metric] = value
        out = []
        for at in sorted(periods):
            shown = {}
            for variant, v in periods[at].items():
                latency = (v.get("ModelLatency") or 0.0) + (v.get("OverheadLatency") or 0.0)
                errors = (v.get("Invocation4XXErrors") or 0.0) + (
                    v.get("Invocation5XXErrors") or 0.0
                )
                shown[variant] = {
                    "invocations": (v.get("Invocations") or 0.0) / 10,
                    "errors": errors / 10,
                    "latency": latency / 1000 if v.get("ModelLatency") is not None else None,
                }
            out.append({"t": at + 10, "values": shown})
        return out

    def series(self, endpoint: str) -> dict[str, dict[str, float]]:
        """Per variant, the endpoint's cumulative counters now; the page takes the rates."""
        return self.counters(only=endpoint).get(endpoint, {})

    def counters(self, *, only: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
        """Per endpoint (or ``only`` one) and variant, the cumulative counters charts need.

        Read from the registry's own samples: one pass over each metric's series, so
        the cost grows with the number of variants served, never with traffic.
        """
        m = self.metrics
        out: dict[str, dict[str, dict[str, float]]] = {}
        metrics = (m.invocations, m.errors_4xx, m.errors_5xx, m.model_latency, m.overhead_latency)
        for metric in metrics:
            for family in metric.collect():
                for sample in family.samples:
                    key = _WANTED.get(sample.name)
                    endpoint = sample.labels.get("endpoint", "")
                    if key is None or (only is not None and endpoint != only):
                        continue
                    variants = out.setdefault(endpoint, {})
                    counters = variants.setdefault(
                        sample.labels["variant"], dict.fromkeys(_WANTED.values(), 0.0)
                    )
                    counters[key] = sample.value
        return out


def _captures(config: EndpointConfig | None) -> bool:
    capture = (config.raw.get("DataCaptureConfig") or {}) if config is not None else {}
    return bool(capture.get("DestinationS3Uri")) and capture.get("EnableCapture") is not False


_NAMED_BY = (
    "EndpointName",
    "InferenceComponentName",
    "TrainingJobName",
    "TransformJobName",
    "alarmName",
    "ModelName",
    "EndpointConfigName",
)


def names(event: Event, resource: str) -> bool:
    """Whether ``event`` is about the resource named ``resource`` (an endpoint's events
    include its components' and its deployments'), by name as given or by its ARN."""
    if any(event.detail.get(key) == resource for key in _NAMED_BY):
        return True
    return event.resource.lower().rsplit("/", 1)[-1] == resource.lower()


def _component_row(c: InferenceComponent, fleet: Fleet | None) -> ComponentRow:
    slots = fleet.slots.get(c.name, []) if fleet is not None else []
    needs = c.spec.requirements
    return ComponentRow(
        name=c.name,
        variant=c.variant,
        status=c.status.value,
        failure_reason=c.failure_reason,
        desired=c.copies,
        current=sum(1 for s in slots if s.instance is not None and s.instance.healthy),
        cpus=needs.cpus if needs is not None else 0.0,
        memory_mb=needs.min_memory_mb if needs is not None else 0,
        placed_on=tuple(fleet.placement.get(c.name, ())) if fleet is not None else (),
    )


def _instance_row(instance_id: str, variant: str, slot: Slot) -> InstanceRow:
    instance = slot.instance
    if instance is None:
        return InstanceRow(
            instance_id, variant, "starting", 0, slot.restarts, slot.ping_failures, 0.0, ()
        )
    return InstanceRow(
        instance_id=instance_id,
        variant=variant,
        state="healthy" if instance.healthy else "unhealthy",
        in_flight=instance.in_flight,
        restarts=slot.restarts,
        ping_failures=slot.ping_failures,
        latency_ms=instance.latency_s * 1000,
        models=tuple(instance.models),
        streams=instance.bidi_streams,
    )


def _from_route(route: EndpointRoute) -> tuple[list[InstanceRow], set[str], list[ServerlessRow]]:
    """What the router's table says of a fleet another gateway runs: its instances as
    published there, without the restarts and pings only their supervisor knows."""
    instances: list[InstanceRow] = []
    multi_model: set[str] = set()
    serverless: list[ServerlessRow] = []
    for v in route.variants:
        for i in v.instances:
            state = "healthy" if i.healthy else "unhealthy"
            latency_ms = i.latency_s * 1000
            instances.append(
                InstanceRow(
                    i.instance_id,
                    v.name,
                    state,
                    i.in_flight,
                    None,
                    None,
                    latency_ms,
                    tuple(i.models),
                    i.bidi_streams,
                )
            )
        if v.dispatch.names_model:
            multi_model.add(v.name)
        admission = v.admission
        if isinstance(admission, ServerlessAdmission):
            config = admission.config
            serverless.append(
                ServerlessRow(
                    variant=v.name,
                    active=admission.active,
                    max_concurrency=config.max_concurrency,
                    memory_mb=config.memory_mb,
                    provisioned=config.provisioned_concurrency,
                    instances=len(v.instances),
                )
            )
    return instances, multi_model, serverless


def _listing(jobs: Sequence[Any], by_status: dict[str, int]) -> Listing:
    return Listing(tuple(jobs), sum(by_status.values()), by_status)


def _matching(
    reaches: Reaches | None, name: str, status: str
) -> Callable[[Job | TransformJob], bool]:
    needle = name.lower()
    return lambda j: (
        (reaches is None or reaches(j.arn))
        and needle in j.name.lower()
        and (not status or j.status.value == status)
    )


def _reached(jobs: Sequence[Job | TransformJob], keep: Callable[[Any], bool]) -> Listing:
    """The newest ``MAX_LISTED`` of the ``jobs`` to ``keep`` (that the key reaches, that
    match a filter), counted among those alone: a scoped key learns nothing of the
    others, not even how many there are."""
    kept = [j for j in jobs if keep(j)]
    by_status: dict[str, int] = {}
    for job in kept:
        by_status[job.status.value] = by_status.get(job.status.value, 0) + 1
    return Listing(tuple(kept[:MAX_LISTED]), len(kept), by_status)
