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

_NAV = (("Endpoints", "/console"), ("Jobs", "/console/jobs"), ("Events", "/console/events"))

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
<script src="/console/static/console.js?v={__version__}" defer></script>
</head>
<body data-auth="{1 if auth else 0}" data-region="{escape(region)}">
<header class="top">
<a class="brand" href="/console">shipyard</a>
<nav>{nav}</nav>
<button id="signout" class="link" type="button" hidden>Sign out</button>
</header>
{_SIGN_IN}
<p id="problem" class="problem" role="alert" hidden></p>
<main id="content">
<h1>{escape(title)}</h1>
{body}
</main>
</body>
</html>
"""


def view(path: str, *, every_ms: int, label: str) -> str:
    """An empty region that console.js fills from ``path`` and refreshes."""
    return (
        f'<section class="view" data-view="{escape(path)}" data-every-ms="{every_ms}" '
        f'aria-label="{escape(label)}"><p class="muted">Loading…</p></section>'
    )


def overview() -> str:
    return view("/console/api/endpoints", every_ms=LIST_EVERY_MS, label="Endpoints")


def endpoint(name: str) -> str:
    base = f"/console/api/endpoints/{quote(name, safe='')}"
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
        f'<section class="charts" data-metrics="{base}/metrics" data-every-ms="2000" '
        f'aria-label="Charts">{charts}</section>'
        + view(base, every_ms=2000, label="Endpoint")
        + "<h2>Instance logs</h2>"
        + view(f"{base}/logs", every_ms=3000, label="Instance logs")
    )


def jobs() -> str:
    return view("/console/api/jobs", every_ms=LIST_EVERY_MS, label="Jobs")


def job(name: str) -> str:
    base = f"/console/api/jobs/{quote(name, safe='')}"
    return view(base, every_ms=2000, label="Job") + (
        f'<h2>Log</h2><pre class="log" data-log="{base}/log" data-every-ms="1000" '
        f'aria-label="Log" tabindex="0"></pre>'
    )


def transform_job(name: str) -> str:
    base = f"/console/api/transform-jobs/{quote(name, safe='')}"
    return (
        view(base, every_ms=2000, label="Transform job")
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
    return view("/console/api/events", every_ms=LIST_EVERY_MS, label="Events")
