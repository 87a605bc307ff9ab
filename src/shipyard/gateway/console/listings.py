"""Fragments for models, endpoint configs, inference components and alarms: their
lists and pages. Every value passes through ``fragments.esc``, the one escaping rule.

A list is a summary line (how many matched the filter), a table with one row per
resource, its first cell a link named exactly as the resource, and a pager when more
matched than a page holds (console.js turns ``data-page`` into the view's ``page``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shipyard.gateway.console.captured import Body, Capture
from shipyard.gateway.console.fragments import badge, esc, link, table, when
from shipyard.gateway.console.resources import PAGE_SIZE, AlarmDetail, ModelDetail, Page, shown_name
from shipyard.gateway.console.state import ComponentRow
from shipyard.records import (
    AsyncRequest,
    EndpointConfig,
    InferenceComponent,
    Model,
    ScalingPolicy,
    VariantSpec,
)


def _summary(page: Page[Any], what: str) -> str:
    f = page.filter
    asked = " matching" if f.name or f.status else ""
    start = f.page * PAGE_SIZE
    shown = (
        f" (rows {start + 1}–{start + len(page.items)})"
        if page.total > PAGE_SIZE and page.items
        else ""
    )
    return f'<p class="summary">{page.total}{asked} {esc(what)}{shown}</p>'


def pager(page: Page[Any]) -> str:
    buttons = []
    if page.filter.page > 0:
        buttons.append(
            f'<button type="button" data-page="{page.filter.page - 1}">Previous page</button>'
        )
    if page.more:
        buttons.append(
            f'<button type="button" data-page="{page.filter.page + 1}">Next page</button>'
        )
    return f'<nav class="pager" aria-label="Pages">{"".join(buttons)}</nav>' if buttons else ""


def _facts(pairs: Sequence[tuple[str, str]]) -> str:
    """A definition list; values are HTML already."""
    return (
        '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"
    )


def _json(value: object) -> str:
    return (
        f'<pre class="json">{esc(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>'
    )


# -- models ---------------------------------------------------------------------------------


def models(page: Page[Model]) -> str:
    return (
        _summary(page, "models")
        + table(
            ("Model", "Image", "Model data", "Created"),
            (
                (
                    link("models", m.name),
                    esc(m.image),
                    esc(m.model_data_url or "—"),
                    when(m.created),
                )
                for m in page.items
            ),
            empty="No models. Create one with CreateModel (boto3, the SDK or shipyard apply).",
        )
        + pager(page)
    )


def model(detail: ModelDetail) -> str:
    m = detail.model
    used = ", ".join(link("endpoint-configs", c) for c in detail.used_by) or "no endpoint config"
    env = "".join(
        f"<li><code>{esc(k)}={esc(v)}</code></li>" for k, v in sorted(m.environment.items())
    )
    return (
        _facts(
            (
                ("Image", esc(m.image)),
                ("Model data", esc(m.model_data_url or "—")),
                ("Execution role", esc(m.execution_role_arn or "—")),
                ("Created", when(m.created)),
                ("Used by", used),
                ("Environment", f'<ul class="plain">{env}</ul>' if env else "—"),
            )
        )
        + f"<details><summary>As created</summary>{_json(m.raw)}</details>"
    )


# -- endpoint configs -------------------------------------------------------------------------


def configs(page: Page[EndpointConfig]) -> str:
    return (
        _summary(page, "endpoint configs")
        + table(
            ("Endpoint config", "Variants", "Kind", "Created"),
            (
                (
                    link("endpoint-configs", shown_name(c)),
                    ", ".join(_variant_brief(v) for v in c.variants),
                    "asynchronous" if c.async_config else "real-time",
                    when(c.created),
                )
                for c in page.items
            ),
            empty="No endpoint configs.",
        )
        + pager(page)
    )


def _variant_brief(v: VariantSpec) -> str:
    runs = link("models", v.model_name) if v.model_name else "components"
    return f"{esc(v.name)} ({runs}, {esc(v.instance_type or 'serverless')} × {v.instance_count})"


def config(c: EndpointConfig) -> str:
    variants = table(
        ("Variant", "Model", "Instance type", "Instances", "Weight", "Routing"),
        (
            (
                esc(v.name) + (' <span class="badge plain">shadow</span>' if v.shadow else ""),
                link("models", v.model_name) if v.model_name else "inference components",
                esc(v.instance_type or "serverless"),
                str(v.instance_count),
                f"{v.weight:g}",
                esc(v.routing_strategy.value),
            )
            for v in c.variants
        ),
        empty="No variants.",
    )
    capture = c.raw.get("DataCaptureConfig")
    return (
        _facts(
            (
                ("Kind", "asynchronous" if c.async_config else "real-time"),
                ("Created", when(c.created)),
                ("Data capture", esc((capture or {}).get("DestinationS3Uri", "off"))),
            )
        )
        + "<h2>Variants</h2>"
        + variants
        + f"<details><summary>As created</summary>{_json(c.raw)}</details>"
    )


# -- inference components ---------------------------------------------------------------------


def components(page: Page[InferenceComponent]) -> str:
    return (
        _summary(page, "inference components")
        + table(
            ("Inference component", "Endpoint", "Variant", "Status", "Copies wanted", "Modified"),
            (
                (
                    link("inference-components", c.name),
                    link("endpoints", c.endpoint),
                    esc(c.variant),
                    badge(c.status.value),
                    str(c.copies),
                    when(c.modified),
                )
                for c in page.items
            ),
            empty="No inference components.",
        )
        + pager(page)
    )


def component(c: InferenceComponent, row: ComponentRow) -> str:
    spec = c.spec
    runs = (
        link("models", spec.model_name) if spec.model_name else esc(spec.image or spec.base or "—")
    )
    failure = (
        f'<div class="failure"><strong>Failure reason</strong><p>{esc(c.failure_reason)}</p></div>'
        if c.failure_reason
        else ""
    )
    return (
        f'<p class="status" role="status" aria-label="Status">{badge(c.status.value)}</p>'
        + failure
        + _facts(
            (
                ("Endpoint", link("endpoints", c.endpoint)),
                ("Variant", esc(c.variant)),
                ("Runs", runs),
                (
                    "Copies (healthy/desired)",
                    f'<span data-copies="{row.current}">{row.current}/{row.desired}</span>',
                ),
                ("Per copy", f"{row.cpus:g} cores, {row.memory_mb} MB"),
                ("Placed on instances", esc(", ".join(str(i) for i in row.placed_on)) or "—"),
                ("Modified", when(c.modified)),
            )
        )
    )


# -- alarms ----------------------------------------------------------------------------------


def alarms(page: Page[Any]) -> str:
    return (
        _summary(page, "alarms")
        + table(
            ("Alarm", "Metric", "State", "Since", "Reason"),
            (
                (
                    link("alarms", a.name),
                    esc(a.config.get("MetricName") or "metric math"),
                    badge(a.state),
                    when(a.state_updated),
                    esc(a.reason),
                )
                for a in page.items
            ),
            empty="No alarms. Create one with PutMetricAlarm.",
        )
        + pager(page)
    )


def alarm(detail: AlarmDetail) -> str:
    a = detail.alarm
    c = a.config
    dims = ", ".join(
        f"{esc(d.get('Name'))}={esc(d.get('Value'))}" for d in c.get("Dimensions") or ()
    )
    endpoint = next(
        (d.get("Value") for d in c.get("Dimensions") or () if d.get("Name") == "EndpointName"), None
    )
    condition = (
        f"{esc(c.get('Statistic') or c.get('ExtendedStatistic') or '')} of "
        f"{esc(c.get('MetricName') or 'metric math')} {esc(c.get('ComparisonOperator', ''))} "
        f"{esc(c.get('Threshold'))} for {esc(c.get('EvaluationPeriods'))} × "
        f"{esc(c.get('Period', ''))} s"
    )
    history = table(
        ("Time", "Type", "Summary"),
        ((when(h.time), esc(h.item_type), esc(h.summary)) for h in detail.history),
        empty="No history yet.",
    )
    return (
        f'<p class="status" role="status" aria-label="Status">{badge(a.state)}</p>'
        + _facts(
            (
                ("Reason", esc(a.reason)),
                ("Condition", condition),
                ("Dimensions", dims or "—"),
                ("Endpoint", link("endpoints", str(endpoint)) if endpoint else "—"),
                ("Since", when(a.state_updated)),
            )
        )
        + "<h2>History</h2>"
        + history
    )


# -- on an endpoint's page -----------------------------------------------------------------------


def policies(found: Sequence[ScalingPolicy]) -> str:
    def target(p: ScalingPolicy) -> str:
        metric = (p.config.get("PredefinedMetricSpecification") or {}).get(
            "PredefinedMetricType"
        ) or (p.config.get("CustomizedMetricSpecification") or {}).get("MetricName", "custom")
        return f"{esc(metric)} at {esc(p.config.get('TargetValue', '—'))}"

    return table(
        ("Policy", "Scales", "Type", "Target"),
        ((esc(p.name), esc(p.resource_id), esc(p.policy_type), target(p)) for p in found),
        empty="No scaling policies.",
    )


def requests(found: Sequence[AsyncRequest] | None) -> str:
    """An asynchronous endpoint's newest requests: where each stands, and where its
    output (or failure) went."""
    if found is None:
        return ""  # a real-time endpoint: no queue

    def went(r: AsyncRequest) -> str:
        if r.status.value == "Failed":
            reason = f'<p class="reason">{esc(r.failure_reason)}</p>' if r.failure_reason else ""
            return f"{esc(r.failure_location)}{reason}"
        return esc(r.output_location)

    return "<h2>Asynchronous requests</h2>" + table(
        ("Inference id", "Status", "Received", "Finished", "Attempts", "Output or failure"),
        (
            (
                esc(r.inference_id),
                badge(r.status.value),
                when(r.received),
                when(r.finished),
                str(r.attempts),
                went(r),
            )
            for r in found
        ),
        empty="No requests yet.",
    )


def _shown(body: Body | None) -> str:
    if body is None:
        return '<span class="muted">—</span>'
    kind = f'<span class="muted">{esc(body.content_type)}, {body.size} bytes</span>'
    if body.text is None:
        return kind + ' <span class="muted">(binary)</span>'
    return f'<pre class="answer">{esc(body.text)}</pre>{kind}'


def captured(capture: Capture | None) -> str:
    if capture is None:
        return ""  # capture is off
    where = f'<h2>Captured data</h2><p class="summary">Captured to {esc(capture.destination)}</p>'
    if capture.problem:
        return where + f'<p class="problem">{esc(capture.problem)}</p>'
    return where + table(
        ("Time", "Variant", "Inference or event id", "Input", "Output"),
        (
            (esc(r.time), esc(r.variant), esc(r.inference_id), _shown(r.input), _shown(r.output))
            for r in capture.records
        ),
        empty="Nothing captured yet.",
    )
