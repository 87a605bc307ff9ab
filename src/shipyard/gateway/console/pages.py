"""The console's pages: shells with no data in them, one per URL.

A browser cannot sign a navigation, so with an ``auth:`` section a page loads unsigned
(it and ``/healthz`` are all that answer unsigned: SECURITY.md) and must therefore hold
nothing a caller without a key may not see: its title, its navigation, and empty regions
that name the ``/console/api/`` view filling them. ``console.js`` fetches those views
(signed, when the body says ``data-auth``) and polls them; the markup of the data itself
is rendered here on the server, in fragments.py, so the script only places it.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from shipyard import __version__

LIST_EVERY_MS = 5000
"""How often the lists (endpoints, jobs, events) are read again: each read of 100
endpoints or of the newest jobs costs the gateway about 10 ms of CPU, which its data
path shares; an endpoint's own page (about 1 ms a read) is read every 2 s."""

CAPTURE_EVERY_MS = 10_000
"""Captured data is read from files (a listing and a few reads): less often."""
HISTORY_EVERY_MS = 10_000
"""An endpoint's scaling policies and deployment history (two small queries); a
deployment's live steps are in the endpoint's own view, read every 2 s."""

_NAV = (
    ("Endpoints", "/console"),
    ("Models", "/console/models"),
    ("Endpoint configs", "/console/endpoint-configs"),
    ("Inference components", "/console/inference-components"),
    ("Jobs", "/console/jobs"),
    ("Alarms", "/console/alarms"),
    ("Events", "/console/events"),
)

_SIGN_IN = """<form id="signin" class="signin" hidden>
<h2>Sign in</h2>
<p>This gateway checks AWS Signature V4 on every call. Enter an access key from its
stack file's <code>auth:</code> section; it stays in this tab (sessionStorage) and
signs the console's calls in the browser.</p>
<label>Access key id <input name="key" autocomplete="username" required></label>
<label>Secret access key <input name="secret" type="password" autocomplete="current-password"
 required></label>
<button type="submit">Sign in</button>
</form>"""


def shell(*, title: str, active: str, body: str, auth: bool, region: str) -> str:
    """A whole page: header, navigation, the sign-in form (hidden) and ``body``."""
    nav = "".join(
        f'<a href="{href}"{" aria-current=page" if name == active else ""}>{name}</a>'
        for name, href in _NAV
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · shipyard</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/static/console.css?v={__version__}">
<script type="module" src="/console/static/console.js?v={__version__}"></script>
</head>
<body data-auth="{1 if auth else 0}" data-region="{escape(region)}">
<header class="top">
<a class="brand" href="/console">shipyard</a>
<nav>{nav}</nav>
<button id="signout" class="link" type="button" hidden>Sign out</button>
</header>
{_SIGN_IN}
<p id="problem" class="problem" role="alert" hidden></p>
<main id="content" data-name="{escape(title)}">
<h1>{escape(title)}</h1>
<p id="outcome" class="outcome" role="status" aria-live="polite"></p>
{body}
</main>
</body>
</html>
"""


def view(path: str, *, every_ms: int, label: str, when: str = "") -> str:
    """An empty region that console.js fills from ``path`` and refreshes; with ``when``,
    hidden and not read until the endpoint's view says it applies (``data-<when>="1"``:
    an endpoint's queue, its captured data), so an endpoint without them costs nothing."""
    condition = f' data-when="{escape(when)}" hidden' if when else ""
    return (
        f'<section class="view" data-view="{escape(path)}" data-every-ms="{every_ms}" '
        f'aria-label="{escape(label)}"{condition}><p class="muted">Loading…</p></section>'
    )


def _list(path: str, label: str, statuses: tuple[str, ...] = ()) -> str:
    """A filter (a part of the name, a status, as List* takes them) over a list's view."""
    choice = ""
    if statuses:
        options = "".join(f"<option>{escape(s)}</option>" for s in statuses)
        choice = (
            '<label>Status <select name="status"><option value="">any</option>'
            f"{options}</select></label>"
        )
    return (
        f'<form class="filter" role="search" aria-label="Filter {escape(label.lower())}">'
        f'<label>Name contains <input name="name" type="search" autocomplete="off"></label>'
        f"{choice}</form>" + view(path, every_ms=LIST_EVERY_MS, label=label)
    )


def overview() -> str:
    statuses = ("InService", "Creating", "Updating", "RollingBack", "Failed", "Deleting")
    return _list("/console/api/endpoints", "Endpoints", statuses)


def models() -> str:
    return _list("/console/api/models", "Models")


def model(name: str) -> str:
    return (
        _actions(
            ("create-endpoint", "Create endpoint", "sagemaker:CreateEndpoint", "model"),
            ("delete-model", "Delete model", "sagemaker:DeleteModel", "model"),
        )
        + _dialog("create-endpoint", "Create endpoint")
        + _dialog("delete-model", "Delete model")
        + view(f"/console/api/models/{quote(name, safe='')}", every_ms=LIST_EVERY_MS, label="Model")
    )


def configs() -> str:
    return _list("/console/api/endpoint-configs", "Endpoint configs")


def config(name: str) -> str:
    return (
        _actions(
            (
                "delete-config",
                "Delete endpoint config",
                "sagemaker:DeleteEndpointConfig",
                "endpoint-config",
            ),
        )  # fmt: skip
        + _dialog("delete-config", "Delete endpoint config")
        + view(
            f"/console/api/endpoint-configs/{quote(name, safe='')}",
            every_ms=LIST_EVERY_MS,
            label="Endpoint config",
        )
    )


def components() -> str:
    statuses = ("InService", "Creating", "Updating", "Failed", "Deleting")
    return _list("/console/api/inference-components", "Inference components", statuses)


def component(name: str) -> str:
    return (
        _actions(
            (
                "copies",
                "Update copies",
                "sagemaker:UpdateInferenceComponentRuntimeConfig",
                "inference-component",
            ),
            (
                "delete-component",
                "Delete inference component",
                "sagemaker:DeleteInferenceComponent",
                "inference-component",
            ),
        )  # fmt: skip
        + _dialog("copies", "Update copies")
        + _dialog("delete-component", "Delete inference component")
        + view(
            f"/console/api/inference-components/{quote(name, safe='')}",
            every_ms=2000,
            label="Inference component",
        )
    )


def alarms() -> str:
    return _list("/console/api/alarms", "Alarms", ("OK", "ALARM", "INSUFFICIENT_DATA"))


def alarm(name: str) -> str:
    return view(f"/console/api/alarms/{quote(name, safe='')}", every_ms=2000, label="Alarm")


def _actions(*buttons: tuple[str, str, str, str]) -> str:
    """Buttons opening the page's action forms. ``data-needs`` is the action the button
    calls (console.js disables it, saying so, when the key may not), ``data-on`` the kind
    of resource whose ARN the key must reach (the page's own)."""
    return (
        '<div class="actions" role="toolbar" aria-label="Actions">'
        + "".join(
            f'<button type="button" data-open="{escape(key)}" data-needs="{escape(needs)}" '
            f'data-on="{escape(on)}">{escape(label)}</button>'
            for key, label, needs, on in buttons
        )
        + "</div>"
    )


def _dialog(key: str, label: str) -> str:
    """An empty form console.js fills when its button opens it (it needs the resource's
    current state: variants, configs), hidden until then."""
    return (
        f'<section class="panel" data-panel="{escape(key)}" role="region" '
        f'aria-label="{escape(label)}" hidden></section>'
    )


_TRY_IT = """<section class="tryit" role="region" aria-labelledby="tryit-title">
<h2 id="tryit-title">Try it</h2>
<form data-form="invoke" data-needs="sagemaker-runtime:InvokeEndpoint" data-on="endpoint">
<label class="wide">Body <textarea name="body" rows="4" spellcheck="false">[[1, 2]]</textarea>
</label>
<label>Content type <input name="contentType" value="application/json"></label>
<label>Variant <select name="variant"><option value="">by weight</option></select></label>
<label data-if="components" hidden>Inference component <select name="component"></select>
</label>
<label>Target model <input name="targetModel" placeholder="multi-model only"></label>
<label>Session <input name="session" placeholder="optional: NEW_SESSION or an id"></label>
<label class="check"><input type="checkbox" name="stream"> Stream the answer</label>
<button type="submit">Invoke</button>
</form>
<section class="response" role="region" aria-label="Response" hidden></section>
</section>"""


def endpoint(name: str) -> str:
    base = f"/console/api/endpoints/{quote(name, safe='')}"
    actions = _actions(
        ("weights", "Update weights and capacity",
         "sagemaker:UpdateEndpointWeightsAndCapacities", "endpoint"),
        ("update", "Update endpoint", "sagemaker:UpdateEndpoint", "endpoint"),
        ("scaling", "Scaling policy", "application-autoscaling:PutScalingPolicy", "endpoint"),
        ("delete", "Delete endpoint", "sagemaker:DeleteEndpoint", "endpoint"),
    )  # fmt: skip
    panels = "".join(
        _dialog(key, label)
        for key, label in (
            ("weights", "Update weights and capacity"),
            ("update", "Update endpoint"),
            ("scaling", "Scaling policy"),
            ("delete", "Delete endpoint"),
        )
    )
    charts = "".join(
        f'<figure class="chart" data-chart="{kind}"><figcaption>{caption}'
        f'<span class="now"></span></figcaption><canvas height="140"></canvas>'
        f'<div class="legend"></div></figure>'
        for kind, caption in (
            ("invocations", "Invocations / s"),
            ("latency", "Latency, ms (mean)"),
            ("errors", "Errors / s (4xx + 5xx)"),
        )
    )
    return (
        actions
        + panels
        + view(base, every_ms=2000, label="Endpoint")
        + _TRY_IT
        + f'<section class="charts" data-metrics="{base}/metrics" data-every-ms="2000" '
        f'aria-label="Charts">{charts}</section>'
        + view(f"{base}/history", every_ms=HISTORY_EVERY_MS, label="History")
        + view(
            f"{base}/requests", every_ms=LIST_EVERY_MS, label="Asynchronous requests", when="async"
        )
        + view(
            f"{base}/captured", every_ms=CAPTURE_EVERY_MS, label="Captured data", when="captures"
        )
        + "<h2>Instance logs</h2>"
        + view(f"{base}/logs", every_ms=3000, label="Instance logs")
    )


def jobs() -> str:
    statuses = ("InProgress", "Completed", "Failed", "Stopping", "Stopped")
    return _list("/console/api/jobs", "Jobs", statuses)


def job(name: str) -> str:
    base = f"/console/api/jobs/{quote(name, safe='')}"
    stop = _actions(("stop-job", "Stop job", "sagemaker:StopTrainingJob", "training-job"))
    stop += _dialog("stop-job", "Stop job")
    return (
        stop
        + view(base, every_ms=2000, label="Job")
        + (
            f'<h2>Log</h2><pre class="log" data-log="{base}/log" data-every-ms="1000" '
            f'aria-label="Log" tabindex="0"></pre>'
        )
    )


def transform_job(name: str) -> str:
    base = f"/console/api/transform-jobs/{quote(name, safe='')}"
    stop = _actions(("stop-transform", "Stop job", "sagemaker:StopTransformJob", "transform-job"))
    stop += _dialog("stop-transform", "Stop job")
    return (
        stop
        + view(base, every_ms=2000, label="Transform job")
        + "<h2>Instance logs</h2>"
        + view(f"{base}/logs", every_ms=3000, label="Instance logs")
    )


def processing_job(name: str) -> str:
    base = f"/console/api/processing-jobs/{quote(name, safe='')}"
    return view(base, every_ms=2000, label="Processing job") + (
        f'<h2>Log</h2><pre class="log" data-log="{base}/log" data-every-ms="1000" '
        f'aria-label="Log" tabindex="0"></pre>'
    )


def monitoring_schedule(name: str) -> str:
    base = f"/console/api/monitoring-schedules/{quote(name, safe='')}"
    return view(base, every_ms=5000, label="Monitoring schedule")


def events() -> str:
    return (
        '<form class="filter" role="search" aria-label="Filter events">'
        '<label>Resource <input name="resource" type="search" autocomplete="off" '
        'placeholder="a name: endpoint, component, job, alarm"></label></form>'
        + view("/console/api/events", every_ms=LIST_EVERY_MS, label="Events")
    )
