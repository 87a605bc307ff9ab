"""The console's data, rendered as HTML fragments that console.js places in a page.

Plain f-strings, with every value that came from a user, a model or a process
(names, failure reasons, messages) passed through ``esc`` first: that is the one rule
that keeps a crafted failure reason or event message from running script in the
console, and the pages' Content-Security-Policy (no inline script) backs it up. No
template engine: the markup is a handful of tables, and rendering them is a few
string joins, which keeps a page of 100 endpoints well under a millisecond.

Tables carry ``data-label`` on each cell so the stylesheet can lay every row out as
a card on a phone-width screen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from shipyard.gateway.console.state import (
    EndpointDetail,
    EndpointRow,
    InstanceRow,
    Listing,
    VariantRow,
)
from shipyard.records import Job, TransformJob
from shipyard.storage.events import EventState

_FAILED = {"Failed", "ALARM", "UpdateRollbackFailed"}
_BUSY = {"Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting", "InProgress",
         "Stopping", "starting", "Baking", "INSUFFICIENT_DATA"}  # fmt: skip
_GOOD = {"InService", "Completed", "healthy", "OK"}


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def badge(status: str) -> str:
    kind = (
        "bad" if status in _FAILED or status == "unhealthy"
        else "busy" if status in _BUSY
        else "good" if status in _GOOD
        else "plain"
    )  # fmt: skip
    return f'<span class="badge {kind}">{esc(status)}</span>'


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    stamp = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f'<time datetime="{value.astimezone(UTC).isoformat()}">{stamp}</time>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, empty: str) -> str:
    """Cells are HTML already; each gets its column's name as ``data-label``."""
    body = "".join(
        "<tr>" + "".join(
            f'<td data-label="{esc(h)}">{cell}</td>' for h, cell in zip(headers, row, strict=True)
        ) + "</tr>"
        for row in rows
    )  # fmt: skip
    if not body:
        return f'<p class="muted">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return f'<table class="cards"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def link(kind: str, name: str) -> str:
    return f'<a href="/console/{kind}/{quote(name, safe="")}">{esc(name)}</a>'


def _failure(reason: str | None) -> str:
    if not reason:
        return ""
    return f'<div class="failure"><strong>Failure reason</strong><p>{esc(reason)}</p></div>'


# -- endpoints --------------------------------------------------------------------------


def _variant_line(v: VariantRow, total_weight: float) -> str:
    share = f" ({v.weight / total_weight:.0%})" if total_weight > 0 and not v.shadow else ""
    if v.serverless is not None:
        size = f"serverless {v.serverless['MemorySizeInMB']} MB, ≤{v.serverless['MaxConcurrency']}"
        counts = f"{v.healthy_instances} up"
    else:
        size = esc(v.instance_type)
        counts = f"{v.healthy_instances}/{v.desired_instances}"
    shadow = ' <span class="badge plain">shadow</span>' if v.shadow else ""
    return (
        f'<li><b>{esc(v.name)}</b>{shadow} <span class="counts">{counts}</span> '
        f'<span class="muted">{size} · weight {v.weight:g}{share} · {esc(v.routing)}</span></li>'
    )


def _variants_list(row: EndpointRow) -> str:
    total = sum(v.weight for v in row.variants if not v.shadow)
    copies = "".join(
        f'<li><b>{esc(c.name)}</b> <span class="counts">{c.current}/{c.desired}</span> '
        f'<span class="muted">copies on {esc(c.variant)}</span></li>'
        for c in row.components
    )
    return (
        '<ul class="variants">'
        + "".join(_variant_line(v, total) for v in row.variants)
        + copies
        + "</ul>"
    )


def overview(rows: Sequence[EndpointRow], *, total: int | None = None) -> str:
    """The endpoints listed (a page of ``total`` matching, when given)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = " · ".join(f"{n} {esc(status)}" for status, n in sorted(counts.items()))
    body = table(
        ("Endpoint", "Status", "Instances", "Last modified"),
        (
            (
                link("endpoints", r.name)
                + (' <span class="badge plain">async</span>' if r.is_async else ""),
                badge(r.status)
                + (f'<p class="reason">{esc(r.failure_reason)}</p>' if r.failure_reason else ""),
                _variants_list(r),
                when(r.modified),
            )
            for r in sorted(rows, key=lambda r: r.name)
        ),
        empty="No endpoints yet. Create one from a model's page (Models), with boto3 "
        "(CreateModel, CreateEndpointConfig, CreateEndpoint) or shipyard apply.",
    )
    listed = len(rows) if total is None else total
    shown = f" ({len(rows)} shown)" if listed > len(rows) else ""
    return (
        f'<p class="summary">{listed} endpoints{shown}{" · " + summary if summary else ""}</p>'
        + body
    )


def endpoint(detail: EndpointDetail) -> str:
    row = detail.row
    pending = (
        f"<dt>Updating to</dt><dd>{esc(row.pending_config_name)}</dd>"
        if row.pending_config_name else ""
    )  # fmt: skip
    parts = [
        f'<p class="status" role="status" aria-label="Status" data-status="{esc(row.status)}" '
        f'data-variants="{esc(",".join(v.name for v in row.variants if not v.shadow))}" '
        f'data-components="{esc(",".join(c.name for c in detail.components))}" '
        f'data-async="{int(row.is_async)}" data-captures="{int(row.captures)}">'
        f"{badge(row.status)}</p>",
        _failure(row.failure_reason),
        f'<dl class="facts"><dt>Endpoint config</dt><dd>{link("endpoint-configs", row.config_name)}'
        f"</dd>{pending}"
        f"<dt>Kind</dt><dd>{'asynchronous' if row.is_async else 'real-time'}</dd>"
        f"<dt>Last modified</dt><dd>{when(row.modified)}</dd>"
        f"<dt>Sessions open</dt><dd>{detail.sessions}</dd></dl>",
        "<h2>Variants</h2>",
        _variants_table(row.variants),
        "<h2>Instances</h2>",
        _instances(detail),
    ]
    if detail.deployment and row.pending_config_name:
        parts.append(_deployment(detail.deployment, row.pending_config_name))
    if detail.alarms:
        parts += ["<h2>Alarms</h2>", _alarms(detail)]
    if detail.components or detail.hosts:
        parts += ["<h2>Inference components</h2>", _components(detail)]
    if detail.multi_model:
        parts += ["<h2>Multi-model cache</h2>", _model_cache(detail)]
    if detail.serverless:
        parts += ["<h2>Serverless</h2>", _serverless(detail)]
    if row.is_async:
        parts += ["<h2>Async backlog</h2>", _backlog(detail)]
    return "".join(parts)


def _deployment(deployment: dict[str, Any], config: str) -> str:
    """The deployment under way: its policy, its step and the new fleet's share."""
    policy = deployment.get("config") or {}
    if "RollingUpdatePolicy" in policy:
        kind = "rolling"
    else:
        routing = (policy.get("BlueGreenUpdatePolicy") or {}).get("TrafficRoutingConfiguration")
        kind = f"blue/green, {str((routing or {}).get('Type', 'ALL_AT_ONCE')).lower()}"
    alarms = [
        a["AlarmName"] for a in (policy.get("AutoRollbackConfiguration") or {}).get("Alarms") or ()
    ]
    share = float(deployment.get("share", 0.0))
    stage = str(deployment.get("stage", "Creating"))
    roll_back = (
        f'<button type="button" data-rollback="{esc(alarms[0])}" '
        'data-needs="cloudwatch:SetAlarmState">Roll back</button> <span class="muted">sets '
        f"alarm {esc(alarms[0])} to ALARM: traffic returns to the old fleet, the new one "
        "stops.</span>"
        if alarms and stage != "RollingBack"
        else ""
    )
    return (
        '<section class="deployment" role="region" aria-label="Deployment">'
        "<h2>Deployment</h2>"
        f'<dl class="facts" data-deployment="{esc(stage)}">'
        f"<dt>To config</dt><dd>{esc(config)}</dd>"
        f"<dt>Policy</dt><dd>{esc(kind)}</dd>"
        f"<dt>Step</dt><dd>{badge(stage)}</dd>"
        f'<dt>New fleet\'s traffic</dt><dd><meter min="0" max="1" value="{share:.3f}"></meter> '
        f"{share:.0%}</dd>"
        f"<dt>Rolls back on</dt><dd>{esc(', '.join(alarms)) or 'no alarm'}</dd></dl>"
        f"{roll_back}</section>"
    )


def _alarms(detail: EndpointDetail) -> str:
    return table(
        ("Alarm", "Metric", "State", "Since", "Reason"),
        (
            (esc(a.name), esc(a.metric), badge(a.state), when(a.updated), esc(a.reason))
            for a in detail.alarms
        ),
        empty="No alarms.",
    )


def _variants_table(variants: Sequence[VariantRow]) -> str:
    total = sum(v.weight for v in variants if not v.shadow)
    return table(
        ("Variant", "Model", "Instance type", "Instances", "Weight", "Routing"),
        (
            (
                esc(v.name) + (' <span class="badge plain">shadow</span>' if v.shadow else ""),
                esc(v.model),
                "serverless" if v.serverless else esc(v.instance_type),
                f"{v.healthy_instances} up"
                if v.serverless
                else f"{v.healthy_instances}/{v.desired_instances}",
                f"{v.weight:g}"
                + (f" ({v.weight / total:.0%})" if total > 0 and not v.shadow else ""),
                esc(v.routing),
            )
            for v in variants
        ),
        empty="No variants.",
    )


def _instances(detail: EndpointDetail) -> str:
    starting = "".join(
        f'<p class="muted">{n} more starting for {esc(variant)}.</p>'
        for variant, n in sorted(detail.starting.items()) if n
    )  # fmt: skip
    if detail.mirrored:
        starting += (
            '<p class="muted">Another gateway sharing this store runs these instances; '
            "this one routes to them. Its console shows their restarts.</p>"
        )
    return (
        table(
            (
                "Instance",
                "Variant",
                "Health",
                "In flight",
                "Open streams",
                "Restarts",
                "Failed pings",
                "Latency ms",
            ),
            (
                (
                    esc(i.instance_id),
                    esc(i.variant),
                    badge(i.state),
                    str(i.in_flight),
                    str(i.streams),
                    "—" if i.restarts is None else str(i.restarts),
                    "—" if i.ping_failures is None else str(i.ping_failures),
                    f"{i.latency_ms:.1f}",
                )
                for i in detail.instances
            ),
            empty="No instances running.",
        )
        + starting
    )


def _components(detail: EndpointDetail) -> str:
    hosts = "".join(
        f'<p class="muted">Variant {esc(variant)}: {n} instance{"" if n == 1 else "s"}.</p>'
        for variant, n in sorted(detail.hosts.items())
    )
    sessions = f'<p class="muted">Open sessions: {detail.sessions}.</p>' if detail.sessions else ""
    return (
        table(
            ("Component", "Variant", "Status", "Instances", "Per copy", "Placed on instances"),
            (
                (
                    link("inference-components", c.name) + _failure(c.failure_reason),
                    esc(c.variant),
                    badge(c.status),
                    f'{c.current}/{c.desired} <span class="muted">copies</span>',
                    f"{c.cpus:g} cores, {c.memory_mb} MB",
                    esc(", ".join(str(i) for i in c.placed_on)) or "—",
                )
                for c in detail.components
            ),
            empty="No inference components.",
        )
        + hosts
        + sessions
    )


def _model_cache(detail: EndpointDetail) -> str:
    held: list[InstanceRow] = [i for i in detail.instances if i.variant in detail.multi_model]
    return table(
        ("Instance", "Models in memory (least recently used first)"),
        (
            (
                esc(i.instance_id),
                ", ".join(esc(m) for m in i.models) or '<span class="muted">none</span>',
            )
            for i in held
        ),
        empty="No instances.",
    )


def _serverless(detail: EndpointDetail) -> str:
    return table(
        ("Variant", "In flight / MaxConcurrency", "Instances", "Memory", "Provisioned"),
        (
            (
                esc(s.variant),
                f"{s.active} / {s.max_concurrency}",
                str(s.instances) + ("" if s.instances else " (cold)"),
                f"{s.memory_mb} MB",
                str(s.provisioned or 0),
            )
            for s in detail.serverless
        ),
        empty="No serverless variants.",
    )


def _backlog(detail: EndpointDetail) -> str:
    b = detail.backlog
    if b is None:
        return '<p class="muted">Nothing queued since the gateway started.</p>'
    warn = ' <span class="badge bad">waiting for capacity</span>' if b.without_capacity else ""
    return (
        f'<dl class="facts"><dt>Backlog</dt><dd data-backlog="{b.size}">{b.size}{warn}</dd>'
        f"<dt>Queued</dt><dd>{b.queued}</dd><dt>Running</dt><dd>{b.running}</dd>"
        f"<dt>Oldest waiting</dt><dd>{b.oldest_age_s:.1f} s</dd>"
        f"<dt>Instances</dt><dd>{b.instances}</dd></dl>"
    )


# -- jobs ---------------------------------------------------------------------------------


def _more(listing: Listing, what: str) -> str:
    counts = " · ".join(f"{n} {esc(s)}" for s, n in sorted(listing.by_status.items()))
    shown = len(listing.jobs)
    extra = f" (newest {shown} shown)" if shown < listing.total else ""
    return f'<p class="summary">{listing.total} {what}{extra}{" · " + counts if counts else ""}</p>'


def _duration(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return "—"
    seconds = int(((end or datetime.now(UTC)) - start).total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _progress(job: TransformJob) -> str:
    if job.objects_total is None:
        return '<span class="muted">listing input…</span>'
    total = max(job.objects_total, 1)
    return (
        f'<progress value="{job.objects_done}" max="{total}"></progress> '
        f"{job.objects_done}/{job.objects_total} objects · {job.records_done} records"
    )


def jobs(
    training: Listing,
    transforms: Listing,
    processing: Listing | None = None,
    schedules: Sequence[Any] = (),
) -> str:
    return (
        _training(training)
        + _processing(processing)
        + _transforms(transforms)
        + _schedules(schedules)
    )


def _processing(processing: Listing | None) -> str:
    if processing is None:
        return ""
    return (
        "<h2>Processing jobs</h2>"
        + _more(processing, "processing jobs")
        + table(
            ("Processing job", "Status", "Created", "Duration", "Exit message"),
            (
                (
                    link("processing-jobs", j.name),
                    badge(j.status.value),
                    when(j.created),
                    _duration(j.started, j.ended),
                    esc(j.model_artifacts or "—"),
                )
                for j in processing.jobs
            ),
            empty="No processing jobs.",
        )
    )


def _schedules(schedules: Sequence[Any]) -> str:
    if not schedules:
        return ""
    return "<h2>Monitoring schedules</h2>" + table(
        ("Schedule", "Status", "Expression", "Next run", "Created"),
        (
            (
                link("monitoring-schedules", s.name),
                badge(s.status),
                esc(_expression(s)),
                when(s.next_tick),
                when(s.created),
            )
            for s in schedules
        ),
        empty="No monitoring schedules.",
    )


def _expression(schedule: Any) -> str:
    config = schedule.request.get("MonitoringScheduleConfig") or {}
    return str((config.get("ScheduleConfig") or {}).get("ScheduleExpression", ""))


def _training(training: Listing) -> str:
    return (
        "<h2>Training jobs</h2>"
        + _more(training, "jobs")
        + table(
            ("Job", "Type", "Status", "Secondary status", "Created", "Duration"),
            (
                (
                    link("jobs", j.name),
                    esc(j.job_type or "—"),
                    badge(j.status.value),
                    esc(j.secondary_status),
                    when(j.created),
                    _duration(j.started, j.ended),
                )
                for j in training.jobs
            ),
            empty="No training jobs.",
        )
    )


def _transforms(transforms: Listing) -> str:
    return (
        "<h2>Transform jobs</h2>"
        + _more(transforms, "transform jobs")
        + table(
            ("Transform job", "Model", "Status", "Progress", "Created"),
            (
                (
                    link("transform-jobs", t.name),
                    esc(t.request.get("ModelName", "")),
                    badge(t.status.value),
                    _progress(t),
                    when(t.created),
                )
                for t in transforms.jobs
            ),
            empty="No transform jobs.",
        )
    )


def job(j: Job) -> str:
    output = j.model_artifacts or j.request.get("OutputDataConfig", {}).get("S3OutputPath", "")
    transitions = table(
        ("Secondary status", "Started", "Ended", "Message"),
        ((esc(t.status), when(t.start), when(t.end), esc(t.message)) for t in j.transitions),
        empty="No transitions yet.",
    )
    return (
        f'<p class="status">{badge(j.status.value)} <span class="secondary">'
        f"{esc(j.secondary_status)}</span></p>"
        + _failure(j.failure_reason)
        + f'<dl class="facts"><dt>Type</dt><dd>{esc(j.job_type or "—")}</dd>'
        f"<dt>Created</dt><dd>{when(j.created)}</dd><dt>Started</dt><dd>{when(j.started)}</dd>"
        f"<dt>Ended</dt><dd>{when(j.ended)}</dd>"
        f"<dt>Duration</dt><dd>{_duration(j.started, j.ended)}</dd>"
        f"<dt>Attempt</dt><dd>{j.attempt}</dd><dt>Output</dt><dd>{esc(output) or '—'}</dd></dl>"
        + "<h2>Progress</h2>"
        + transitions
    )


def processing_job(j: Job) -> str:
    app = j.request.get("AppSpecification") or {}
    outputs = (j.request.get("ProcessingOutputConfig") or {}).get("Outputs") or []
    where = ", ".join(str((o.get("S3Output") or {}).get("S3Uri", "")) for o in outputs)
    return (
        f'<p class="status">{badge(j.status.value)}</p>'
        + _failure(j.failure_reason)
        + f'<dl class="facts"><dt>Image</dt><dd>{esc(app.get("ImageUri", ""))}</dd>'
        f"<dt>Exit message</dt><dd>{esc(j.model_artifacts or '—')}</dd>"
        f"<dt>Schedule</dt><dd>{esc(j.job_type or '—')}</dd>"
        f"<dt>Created</dt><dd>{when(j.created)}</dd><dt>Started</dt><dd>{when(j.started)}</dd>"
        f"<dt>Ended</dt><dd>{when(j.ended)}</dd>"
        f"<dt>Duration</dt><dd>{_duration(j.started, j.ended)}</dd>"
        f"<dt>Outputs</dt><dd>{esc(where) or '—'}</dd></dl>"
    )


def monitoring_schedule(view: Any) -> str:
    """A schedule (monitoring/service.py's ScheduleView): its facts, then its runs, each
    with its violations."""
    s = view.schedule
    runs = table(
        ("Scheduled", "Status", "Window", "Processing job", "Violations"),
        (
            (
                when(r.execution.scheduled),
                badge(r.execution.status),
                f"{when(r.execution.window_start)} – {when(r.execution.window_end)}",
                link("processing-jobs", r.execution.job_name)
                if r.execution.detail.get("request")
                else "—",
                _violations(r.violations, r.execution.failure_reason),
            )
            for r in view.runs
        ),
        empty="No runs yet.",
    )
    return (
        f'<p class="status">{badge(s.status)}</p>'
        + _failure(s.failure_reason)
        + f'<dl class="facts"><dt>Endpoint</dt><dd>{link("endpoints", view.endpoint)}</dd>'
        f"<dt>Expression</dt><dd>{esc(_expression(s))}</dd>"
        f"<dt>Next run</dt><dd>{when(s.next_tick)}</dd>"
        f"<dt>Created</dt><dd>{when(s.created)}</dd></dl>" + "<h2>Runs</h2>" + runs
    )


def _violations(violations: list[dict[str, Any]] | None, failure: str | None) -> str:
    if failure:
        return esc(failure)
    if violations is None:
        return "—"
    if not violations:
        return "none"
    items = "".join(
        f"<li><strong>{esc(v.get('feature_name', ''))}</strong> "
        f"{esc(v.get('constraint_check_type', ''))}: {esc(v.get('description', ''))}</li>"
        for v in violations
    )
    return f"<ul>{items}</ul>"


def transform_job(t: TransformJob) -> str:
    source = t.request.get("TransformInput", {}).get("DataSource", {}).get("S3DataSource", {})
    output = t.request.get("TransformOutput", {}).get("S3OutputPath", "")
    return (
        f'<p class="status">{badge(t.status.value)}</p>'
        + _failure(t.failure_reason)
        + f'<p class="progress">{_progress(t)}</p>'
        + f'<dl class="facts"><dt>Model</dt><dd>{esc(t.request.get("ModelName", ""))}</dd>'
        f"<dt>Input</dt><dd>{esc(source.get('S3Uri', ''))}</dd>"
        f"<dt>Output</dt><dd>{esc(output)}</dd>"
        f"<dt>Created</dt><dd>{when(t.created)}</dd><dt>Started</dt><dd>{when(t.started)}</dd>"
        f"<dt>Ended</dt><dd>{when(t.ended)}</dd>"
        f"<dt>Duration</dt><dd>{_duration(t.started, t.ended)}</dd></dl>"
    )


# -- events ---------------------------------------------------------------------------------


def events(states: Sequence[EventState]) -> str:
    def delivery(s: EventState) -> str:
        if s.dispatched_at is not None:
            return badge("delivered") if s.event.topics else '<span class="muted">no topics</span>'
        return (
            f'<span class="badge busy">pending</span> <span class="muted">{s.attempts} tries</span>'
        )

    return table(
        ("Time", "Event", "Resource", "Status", "Message", "Notification"),
        (
            (
                when(s.event.time),
                esc(s.event.detail_type),
                _resource(s.event.detail, s.event.resource),
                _new_status(s.event.detail),
                esc(s.event.message),
                delivery(s),
            )
            for s in states
        ),
        empty="No events yet.",
    )


def _new_status(detail: dict[str, object]) -> str:
    """The status a state change moved to, as the API spells it."""
    for key, value in detail.items():
        if key.endswith(("Status", "State", "Stage")) and isinstance(value, str):
            return badge(value)
    state = detail.get("state")
    if isinstance(state, dict) and isinstance(state.get("value"), str):
        return badge(state["value"])  # an alarm's (CloudWatch's event shape)
    return '<span class="muted">—</span>'


def instance_logs(tails: Sequence[tuple[str, str]]) -> str:
    if not tails:
        return '<p class="muted">No instance logs.</p>'
    return "".join(
        f'<details class="tail" open><summary>{esc(instance)}</summary>'
        f'<pre class="log tail">{esc(text) or "(empty)"}</pre></details>'
        for instance, text in tails
    )


def _resource(detail: dict[str, object], arn: str) -> str:
    """A link to the endpoint or job an event is about (its detail has the name as
    given: ARNs lower-case it); an inference component by name, linked to the endpoint
    whose page shows it; else the ARN's last part."""
    component, endpoint = detail.get("InferenceComponentName"), detail.get("EndpointName")
    if isinstance(component, str) and isinstance(endpoint, str):
        return (
            f'{link("inference-components", component)} <span class="muted">on</span> '
            f"{link('endpoints', endpoint)}"
        )
    kinds = (
        ("EndpointName", "endpoints"),
        ("TrainingJobName", "jobs"),
        ("TransformJobName", "transform-jobs"),
        ("alarmName", "alarms"),
        ("ModelName", "models"),
    )
    for key, kind in kinds:
        name = detail.get(key)
        if isinstance(name, str):
            return link(kind, name)
    return esc(arn.rsplit("/", 1)[-1])


def not_found(what: str) -> str:
    return f'<p class="problem">{esc(what)}</p>'
