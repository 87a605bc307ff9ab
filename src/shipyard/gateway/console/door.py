"""The console door: pages under ``/console``, their data under ``/console/api/``.

Pages are shells (pages.py) and static files; the data comes from small GET views,
HTML fragments for what people read and JSON for what the page computes on (chart
counters, log chunks). Store reads run in a worker thread; the gateway's in-memory
state (fleets, backlog readings, the metrics registry) is read on the event loop,
between two awaits, so it is consistent and never waits on a lock the data path holds
for long. Invocations never come here: the gateway sends them to the runtime door
before Starlette routes anything (app.py), so the console costs the data path nothing
but the CPU its own requests take.

With an ``auth:`` section the pages and static files load unsigned and every view is
signed by the page's script; gateway/edge/auth.py scopes each view as the action it
reads (e.g. ``sagemaker:DescribeEndpoint``, ``shipyard:GetMetrics``). A key scoped by
resource sees only what it reaches: a view of one endpoint or job (its logs and
metrics included) is refused unless the key reaches that resource's ARN, and the lists
(endpoints, jobs, events) keep what it reaches.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib import resources as package_files
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from shipyard import __version__
from shipyard.errors import AccessDenied, ResourceNotFound, ShipyardError
from shipyard.events.kinds import DEPLOYMENT, DEPLOYMENT_STEP
from shipyard.gateway.console import fragments, listings, pages
from shipyard.gateway.console.history import MetricsHistory
from shipyard.gateway.console.logs import instance_tails
from shipyard.gateway.console.resources import Filter, ResourceReads, page_of
from shipyard.gateway.console.state import ConsoleState, Reaches
from shipyard.gateway.edge.auth import admitted
from shipyard.gateway.wire.errors import control_error_response
from shipyard.job_contract import open_untrusted, untrusted_size
from shipyard.provisioning.fleet import TRANSFORM_JOB_LOGS
from shipyard.records import Job

LOG_CHUNK_BYTES = 64 * 1024
"""Most log bytes one poll returns; a page opened on a long log starts at its tail."""

EVENTS_SHOWN = 100

DEPLOYMENTS_SHOWN = 20
"""Steps and ends of deployments an endpoint's page shows, newest first."""

_PAGE_HEADERS = {
    # No inline script or style anywhere: a value that slipped past escaping still
    # cannot run. data: only for the empty favicon.
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

View = Callable[[Request], Awaitable[Response]]

STATIC_FILES = (
    "console.js",
    "signing.js",
    "polling.js",
    "charts.js",
    "actions.js",
    "tryit.js",
    "console.css",
)
"""console.js is an ES module importing the others: no bundler, no build step."""

_IMPORT = re.compile(rb'from "\./([a-z]+)\.js"')


class ConsoleDoor:
    """Routes of the web console; see the module."""

    def __init__(
        self,
        *,
        state: ConsoleState,
        resources: ResourceReads,
        log_files: Callable[[str], list[Path]],
        logs_dir: Path,
        auth: bool,
        region: str,
        processing_log_files: Callable[[str], list[Path]] | None = None,
    ) -> None:
        self.state = state
        self.resources = resources
        self.log_files = log_files
        self.processing_log_files = processing_log_files
        """A processing job's log files; None: the console shows no processing jobs."""
        self.logs_dir = logs_dir
        """Where instances log: ``<logs_dir>/<endpoint>/<id>.log``, and a transform job's
        under ``<logs_dir>/TRANSFORM_JOB_LOGS/<job>/``."""
        self.auth = auth
        self.region = region
        self.history = MetricsHistory(state.counters)
        """Sampled by the app's lifespan (``history.run``)."""
        folder = package_files.files("shipyard.gateway.console") / "static"
        self._static = {name: _versioned((folder / name).read_bytes()) for name in STATIC_FILES}

    def __repr__(self) -> str:
        return f"ConsoleDoor(auth={self.auth})"

    def routes(self) -> list[BaseRoute]:
        page, one = self._page, self._one
        api = [  # a view of one resource asks first whether the key reaches it
            Route("/whoami", self.whoami_view),
            Route("/endpoints", self.endpoints_view),
            Route("/endpoints/{name}", one("endpoint", self.endpoint_view)),
            Route("/endpoints/{name}/metrics", one("endpoint", self.metrics_view)),
            Route("/endpoints/{name}/logs", one("endpoint", self.endpoint_logs_view)),
            Route("/endpoints/{name}/history", one("endpoint", self.endpoint_history_view)),
            Route("/endpoints/{name}/requests", one("endpoint", self.requests_view)),
            Route("/endpoints/{name}/captured", one("endpoint", self.captured_view)),
            Route("/models", self.models_view),
            Route("/models/{name}", one("model", self.model_view)),
            Route("/endpoint-configs", self.configs_view),
            Route("/endpoint-configs/{name}", one("endpoint-config", self.config_view)),
            Route("/inference-components", self.components_view),
            Route(
                "/inference-components/{name}",
                one("inference-component", self.component_view),
            ),
            Route("/alarms", self.alarms_view),
            Route("/alarms/{name}", one("alarm", self.alarm_view)),
            Route("/jobs", self.jobs_view),
            Route("/jobs/{name}", one("training-job", self.job_view)),
            Route("/jobs/{name}/log", one("training-job", self.log_view)),
            Route("/processing-jobs/{name}", one("processing-job", self.processing_view)),
            Route("/processing-jobs/{name}/log", one("processing-job", self.processing_log_view)),
            Route(
                "/monitoring-schedules/{name}",
                one("monitoring-schedule", self.schedule_view),
            ),
            Route("/transform-jobs/{name}", one("transform-job", self.transform_view)),
            Route("/transform-jobs/{name}/logs", one("transform-job", self.transform_logs_view)),
            Route("/events", self.events_view),
        ]
        lists = (
            ("Models", "/console/models", pages.models),
            ("Endpoint configs", "/console/endpoint-configs", pages.configs),
            ("Inference components", "/console/inference-components", pages.components),
            ("Alarms", "/console/alarms", pages.alarms),
        )
        ones = (
            ("Models", "/console/models/{name}", pages.model),
            ("Endpoint configs", "/console/endpoint-configs/{name}", pages.config),
            ("Inference components", "/console/inference-components/{name}", pages.component),
            ("Alarms", "/console/alarms/{name}", pages.alarm),
        )
        return [
            Route("/console", page("Endpoints", "Endpoints", lambda _: pages.overview())),
            Route("/console/", page("Endpoints", "Endpoints", lambda _: pages.overview())),
            Route("/console/endpoints/{name}", page(None, "Endpoints", pages.endpoint)),
            *(Route(path, page(title, title, _unnamed(body))) for title, path, body in lists),
            *(Route(path, page(None, active, body)) for active, path, body in ones),
            Route("/console/jobs", page("Jobs", "Jobs", lambda _: pages.jobs())),
            Route("/console/jobs/{name}", page(None, "Jobs", pages.job)),
            Route("/console/transform-jobs/{name}", page(None, "Jobs", pages.transform_job)),
            Route("/console/processing-jobs/{name}", page(None, "Jobs", pages.processing_job)),
            Route(
                "/console/monitoring-schedules/{name}",
                page(None, "Jobs", pages.monitoring_schedule),
            ),
            Route("/console/events", page("Events", "Events", lambda _: pages.events())),
            Route("/console/static/{file}", self.static),
            Mount("/console/api", routes=api),
        ]

    # -- pages ------------------------------------------------------------------------

    def _page(
        self, title: str | None, active: str, body: Callable[[str], str]
    ) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            name = request.path_params.get("name", "")
            html = pages.shell(
                title=title or name,
                active=active,
                body=body(name),
                auth=self.auth,
                region=self.region,
            )
            return HTMLResponse(html, headers=_PAGE_HEADERS)

        return handle

    async def static(self, request: Request) -> Response:
        name = request.path_params["file"]
        content = self._static.get(name)
        if content is None:
            return Response(
                "Not found", status_code=404, media_type="text/plain", headers=_API_HEADERS
            )
        media_type = _STATIC_TYPES[os.path.splitext(name)[1]]
        # The URL carries the version (pages.py), so a cached copy is never stale.
        return Response(content, media_type=media_type, headers={"Cache-Control": "max-age=3600"})

    # -- keys scoped by resource ------------------------------------------------------

    def _one(self, kind: str, view: View) -> View:
        """``view`` of the resource ``{name}`` of ``kind``, refused as the edge refuses
        (403, ``{"__type", "message"}``) unless the caller's key reaches its ARN."""

        async def handle(request: Request) -> Response:
            name = request.path_params["name"]
            arn = self.resources.alarm_arn(name) if kind == "alarm" else self.state.arn(kind, name)
            try:
                admitted(request.scope).reach(arn)
            except AccessDenied as exc:
                refusal = control_error_response(exc)
                refusal.headers.update(_API_HEADERS)
                return refusal
            return await view(request)

        return handle

    # -- views ------------------------------------------------------------------------

    async def whoami_view(self, request: Request) -> Response:
        """What the signed-in key may call and reach (``shipyard:GetCallerPermissions``):
        the console disables what it may not use. Without ``auth:``, everything."""
        edge = admitted(request.scope)
        caller = edge.caller
        answer: dict[str, object] = {
            "auth": caller is not None,
            "key": caller.access_key_id if caller is not None else None,
            "allow": list(caller.allow) if caller is not None else ["*"],
            "resources": list(caller.resources) if caller is not None else ["*"],
            # For the page to write the ARNs the resource patterns match.
            "arn": self.state.arn("endpoint", "x").rsplit(":", 1)[0],
        }
        return JSONResponse(answer, headers=_API_HEADERS)

    async def endpoints_view(self, request: Request) -> Response:
        reaches = _reaches(request)
        endpoints, configs = await run_in_threadpool(self.state.endpoint_records, reaches)
        components = await run_in_threadpool(self.resources.all_components)
        shown = page_of(  # by name, as the overview lists them
            endpoints,
            Filter.of(request.query_params),
            name=lambda e: e.name,
            status=lambda e: e.status.value,
            created=lambda e: e.name,
            newest_first=False,
        )
        rows = self.state.rows(shown.items, configs, components)
        return _fragment(fragments.overview(rows, total=shown.total) + listings.pager(shown))

    async def endpoint_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            endpoint, config = await run_in_threadpool(self.state.endpoint_record, name)
        except ResourceNotFound:
            return _fragment(fragments.not_found(f'Could not find endpoint "{name}".'), 404)
        components = (
            await run_in_threadpool(self.state.components_of, name)
            if config is not None and config.hosts_components
            else []
        )
        alarms = await run_in_threadpool(self.state.alarms_of, name)
        detail = replace(self.state.detail(endpoint, config, components), alarms=alarms)
        return _fragment(fragments.endpoint(detail))

    async def endpoint_history_view(self, request: Request) -> Response:
        """An endpoint's scaling policies and deployment history: read less often than
        its state (pages.py)."""
        name = request.path_params["name"]
        policies = await run_in_threadpool(self.resources.policies_of, name)
        steps = await run_in_threadpool(
            self.state.events.recent_about,
            self.state.arn("endpoint", name),
            (DEPLOYMENT, DEPLOYMENT_STEP),
            DEPLOYMENTS_SHOWN,
        )
        return _fragment(
            "<h2>Scaling policies</h2>"
            + listings.policies(policies)
            + "<h2>Deployment history</h2>"
            + fragments.events(steps)
        )

    async def requests_view(self, request: Request) -> Response:
        found = await run_in_threadpool(self.resources.requests, request.path_params["name"])
        return _fragment(listings.requests(found))

    async def captured_view(self, request: Request) -> Response:
        capture = await run_in_threadpool(self.resources.captured, request.path_params["name"])
        return _fragment(listings.captured(capture))

    async def models_view(self, request: Request) -> Response:
        found = await run_in_threadpool(
            self.resources.models, Filter.of(request.query_params), _reaches(request)
        )
        return _fragment(listings.models(found))

    async def model_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            detail = await run_in_threadpool(self.resources.model, name)
        except ShipyardError:
            return _fragment(fragments.not_found(f'Could not find model "{name}".'), 404)
        return _fragment(listings.model(detail))

    async def configs_view(self, request: Request) -> Response:
        found = await run_in_threadpool(
            self.resources.configs, Filter.of(request.query_params), _reaches(request)
        )
        return _fragment(listings.configs(found))

    async def config_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            config = await run_in_threadpool(self.resources.config, name)
        except ShipyardError:
            return _fragment(
                fragments.not_found(f'Could not find endpoint configuration "{name}".'), 404
            )
        return _fragment(listings.config(config))

    async def components_view(self, request: Request) -> Response:
        found = await run_in_threadpool(
            self.resources.components, Filter.of(request.query_params), _reaches(request)
        )
        return _fragment(listings.components(found))

    async def component_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            component = await run_in_threadpool(self.resources.component, name)
        except ShipyardError:
            return _fragment(
                fragments.not_found(f'Could not find inference component "{name}".'), 404
            )
        row = self.state.component_row(component)
        return _fragment(listings.component(component, row))

    async def alarms_view(self, request: Request) -> Response:
        found = await run_in_threadpool(
            self.resources.alarms, Filter.of(request.query_params), _reaches(request)
        )
        return _fragment(listings.alarms(found))

    async def alarm_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        detail = await run_in_threadpool(self.resources.alarm, name)
        if detail is None:
            return _fragment(fragments.not_found(f"Could not find alarm {name}."), 404)
        return _fragment(listings.alarm(detail))

    async def metrics_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        variants = self.state.series(name)
        answer: dict[str, object] = {
            "t": time.time(),
            "variants": variants,
            "history": self.history.readings(name),
        }
        if request.query_params.get("history") == "1":  # the page's first poll
            answer["datapoints"] = await run_in_threadpool(self.state.datapoints, name)
        return JSONResponse(answer, headers=_API_HEADERS)

    async def jobs_view(self, request: Request) -> Response:
        reaches = _reaches(request)
        wanted = Filter.of(request.query_params)
        training = await run_in_threadpool(self.state.jobs, reaches, wanted.name, wanted.status)
        transforms = await run_in_threadpool(
            self.state.transforms, reaches, wanted.name, wanted.status
        )
        processing = await run_in_threadpool(self.state.processing, reaches)
        schedules = await run_in_threadpool(self.state.schedules, reaches)
        shown = processing if self.processing_log_files is not None else None
        return _fragment(fragments.jobs(training, transforms, shown, schedules))

    async def processing_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            job = await run_in_threadpool(self.state.describe_processing, name)
        except ShipyardError:
            return _fragment(fragments.not_found(f'Could not find processing job "{name}".'), 404)
        return _fragment(fragments.processing_job(job))

    async def schedule_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            view = await run_in_threadpool(self.state.schedule, name)
        except ShipyardError:
            message = f'Could not find monitoring schedule "{name}".'
            return _fragment(fragments.not_found(message), 404)
        return _fragment(fragments.monitoring_schedule(view))

    async def job_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            job = await run_in_threadpool(self.state.describe_job, name)
        except ShipyardError:
            return _fragment(fragments.not_found(f'Could not find training job "{name}".'), 404)
        return _fragment(fragments.job(job))

    async def transform_view(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            job = await run_in_threadpool(self.state.describe_transform, name)
        except ShipyardError:
            return _fragment(fragments.not_found(f'Could not find transform job "{name}".'), 404)
        return _fragment(fragments.transform_job(job))

    async def events_view(self, request: Request) -> Response:
        resource = request.query_params.get("resource", "")[:256]
        states = await run_in_threadpool(
            self.state.recent_events, EVENTS_SHOWN, _reaches(request), resource
        )
        return _fragment(fragments.events(states))

    async def endpoint_logs_view(self, request: Request) -> Response:
        return await self._instance_logs(self.logs_dir, request.path_params["name"])

    async def transform_logs_view(self, request: Request) -> Response:
        logs_dir = self.logs_dir / TRANSFORM_JOB_LOGS
        return await self._instance_logs(logs_dir, request.path_params["name"])

    async def _instance_logs(self, logs_dir: Path, name: str) -> Response:
        tails = await run_in_threadpool(instance_tails, logs_dir, name)
        return _fragment(fragments.instance_logs(tails))

    async def log_view(self, request: Request) -> Response:
        """The job's log from ``offset`` (or its tail), whole lines, and where to go on.

        ``done`` tells the page to stop polling: the job has ended and nothing is left.
        """
        return await self._job_log(request, self.state.describe_job, self.log_files, "training")

    async def processing_log_view(self, request: Request) -> Response:
        files = self.processing_log_files or (lambda name: [])
        return await self._job_log(request, self.state.describe_processing, files, "processing")

    async def _job_log(
        self,
        request: Request,
        describe: Callable[[str], Job],
        log_files: Callable[[str], list[Path]],
        kind: str,
    ) -> Response:
        name = request.path_params["name"]
        asked = request.query_params.get("offset", "tail")
        try:
            job = await run_in_threadpool(describe, name)
            files = log_files(name)
        except ShipyardError:
            return JSONResponse({"message": f"Could not find {kind} job {name}."}, 404)
        offset = None if asked == "tail" else int(asked) if asked.isdigit() else 0
        text, next_offset = await run_in_threadpool(_read_log, files, offset, not job.active)
        done = not job.active and next_offset >= await run_in_threadpool(_total_size, files)
        return JSONResponse(
            {"text": text, "next": next_offset, "status": job.status.value, "done": done},
            headers=_API_HEADERS,
        )


def _versioned(content: bytes) -> bytes:
    """``content`` with its imports of the other modules naming this version, as the
    pages name console.js: a browser never mixes a cached module with a newer one."""
    version = __version__.encode()
    return _IMPORT.sub(lambda m: b'from "./' + m[1] + b".js?v=" + version + b'"', content)


def _unnamed(body: Callable[[], str]) -> Callable[[str], str]:
    return lambda _: body()


def _reaches(request: Request) -> Reaches | None:
    """What the caller's key reaches, for a list to keep; None: everything."""
    edge = admitted(request.scope)
    return None if edge.reaches_all else edge.reaches


def _fragment(html: str, status_code: int = 200) -> Response:
    return HTMLResponse(html, status_code=status_code, headers=_API_HEADERS)


def _total_size(files: list[Path]) -> int:
    return sum(untrusted_size(path) for path in files)


def _read_log(files: list[Path], offset: int | None, final: bool) -> tuple[str, int]:
    """Whole lines of the files read as one stream, from ``offset`` (None: the tail).

    A last line without its newline is left for the next poll (unless a line is longer
    than a chunk, or the job has ended: ``final``), so a character is never cut in two.
    A log the job's code replaced (a link, a FIFO) reads as empty (``open_untrusted``).
    """
    total = _total_size(files)
    start = max(0, total - LOG_CHUNK_BYTES) if offset is None else min(offset, total)
    data = bytearray()
    base = 0
    for path in files:
        size = untrusted_size(path)
        if start < base + size and len(data) < LOG_CHUNK_BYTES:
            try:
                with open_untrusted(path) as f:
                    f.seek(max(start - base, 0))
                    data += f.read(LOG_CHUNK_BYTES - len(data))
            except OSError:
                break
        base += size
    if offset is None and start > 0:
        # Started mid-file: drop the partial first line.
        cut = data.find(b"\n") + 1
        start += cut
        data = data[cut:]
    end = data.rfind(b"\n") + 1
    if final or (end == 0 and len(data) >= LOG_CHUNK_BYTES):
        end = len(data)
    return data[:end].decode(errors="replace"), start + end
