"""The composition root: builds every component from Settings and wires them together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from shipyard import heap
from shipyard.async_inference import assembly as async_assembly
from shipyard.autoscaling import assembly as scaling_assembly
from shipyard.backends import BackendContext, create_backend
from shipyard.background import Loops, Wakeup
from shipyard.cloudwatch import assembly as cloudwatch_assembly
from shipyard.control import assembly as endpoint_assembly
from shipyard.control.endpoints import EndpointService
from shipyard.core import Core
from shipyard.errors import ShipyardError
from shipyard.events import assembly as events_assembly
from shipyard.events.kinds import component_events, endpoint_events
from shipyard.gateway.api.actions import registry
from shipyard.gateway.api.control import ControlDoor
from shipyard.gateway.api.facade import JobsDoor
from shipyard.gateway.api.stack_config import StackConfigDoor
from shipyard.gateway.console import ConsoleDoor, ConsoleState, JobReads, ResourceReads
from shipyard.gateway.doors import assembly as doors_assembly
from shipyard.gateway.edge.assembly import edge, serving_tls
from shipyard.gateway.ops.routes import healthz, metrics_endpoint
from shipyard.gateway.ops.worker_metrics import WorkerMetrics
from shipyard.gateway.wire.errors import unknown_path_response
from shipyard.http.server import ServeWhole
from shipyard.jobs import assembly as jobs_assembly
from shipyard.logs.service import LogService
from shipyard.metrics import Metrics
from shipyard.monitoring import assembly as monitoring_assembly
from shipyard.processing import assembly as processing_assembly
from shipyard.routing import assembly as routing_assembly
from shipyard.settings import Settings
from shipyard.stack_config import StackConfig
from shipyard.stackfile import JobsConfig, StackFile
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.events import EventLog
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.secrets import shared_secret
from shipyard.transform import assembly as transform_assembly

log = logging.getLogger(__name__)

StartupHook = Callable[[EndpointService], Awaitable[None]]


class Gateway:
    """The gateway's ASGI app: every component, built from Settings and wired together.

    Requests pass the edge (read once, signatures checked: gateway/edge/signatures.py), then
    the path router (http/paths.py): the data path's doors straight, everything else
    through Starlette's routing.
    """

    def __init__(self, settings: Settings, *, on_startup: StartupHook | None = None) -> None:
        stack = StackFile.load(settings.config) if settings.config else StackFile()
        settings = settings.with_stack(stack)
        self.tls = serving_tls(settings, stack)
        """The certificate and key this gateway serves HTTPS (and gRPC) with, if any."""
        settings.home.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.store = MetadataStore(
            settings.db_url, announce=endpoint_events, announce_component=component_events
        )
        self.metrics = Metrics()
        self.worker_metrics = WorkerMetrics.of(self.metrics.registry, settings)
        self.loops = Loops()
        events = events_assembly.build(settings, stack, self.store)
        self.topics, self.dispatcher = events.topics, events.dispatcher
        core = Core.of(
            settings, stack, store=self.store, metrics=self.metrics, on_event=self.dispatcher.wake
        )
        self.objects = core.objects
        routing = routing_assembly.build(settings, self.store, self.metrics)
        self.router, self.shadows = routing.router, routing.shadows
        self.invocations, self.session_closes = routing.invocations, routing.session_closes
        self.backend, capabilities = create_backend(
            settings.backend, BackendContext.of(settings, stack, filesystems=core.filesystems)
        )
        endpoints = endpoint_assembly.build(
            core,
            backend=self.backend,
            capabilities=capabilities,
            router=self.router,
            unknown_topics=lambda targets: self.topics.resolve(targets).unknown,
        )
        self.provisioner, self.capture = endpoints.provisioner, endpoints.capture
        self.reconciler, self.service = endpoints.reconciler, endpoints.service
        self.components = endpoints.components
        scale_now = Wakeup()
        """Wakes the autoscaler: the async consumer sets it when requests wait for an
        endpoint scaled to zero."""
        asynchronous = async_assembly.build(
            core, invocations=self.invocations, on_backlog_without_capacity=scale_now.set
        )
        self.consumer = asynchronous.consumer
        jobs = jobs_assembly.build(core, self.backend)
        self.jobs, self.supervisor = jobs.service, jobs.supervisor
        processing = processing_assembly.build(core, self.backend)
        self.processing, self.processing_supervisor = processing.service, processing.supervisor
        transforms = transform_assembly.build(
            core, self.provisioner, budget=self.service.check_budget
        )
        self.transforms, self.transform_supervisor = transforms.service, transforms.supervisor
        scaling = scaling_assembly.build(
            core,
            endpoints=endpoints,
            router=self.router,
            backlogs=self.consumer.backlogs,
            wakeup=scale_now,
            alarms_naming=cloudwatch_assembly.naming_alarms(core),
        )
        self.scaling, self.autoscaler = scaling.service, scaling.autoscaler
        self.cloudwatch = cloudwatch_assembly.build(
            core,
            router=self.router,
            backlogs=self.consumer.backlogs,
            run_policy=self.autoscaler.run_step_policy,
            policy_by_arn=self.scaling.policy_by_arn,
            unknown_topics=lambda targets: self.topics.resolve(targets).unknown,
            fleets=self.reconciler.fleets,
            backend=self.provisioner.backend,  # multi-container instances added up
        )
        monitoring = monitoring_assembly.build(
            core,
            processing=self.processing,
            endpoints=self.service,
            cloudwatch=self.cloudwatch.service,
        )
        self.monitoring, self.monitor_runs = monitoring.service, monitoring.runs
        self.console = self._console(settings, stack)
        self._on_startup = on_startup
        self.app = Starlette(
            routes=self._routes(settings, stack),
            lifespan=self._lifespan,
            exception_handlers={404: _unknown_path, 405: _unknown_path},
        )
        try:  # the stack file's templates, now that they can be held to botocore's shapes
            self.jobs.check_templates(self.jobs.config, host_access=False)
        except ShipyardError as exc:
            raise ValueError(exc.message) from None  # `serve` says so and exits 2
        self.app.state.ready = False
        self.doors = doors_assembly.build(
            settings,
            stack,
            invocations=self.invocations,
            async_requests=asynchronous.requests,
            metrics=self.metrics,
            secure=self.tls is not None,
            is_ready=lambda: bool(self.app.state.ready),
            fallback=self.app,
        )
        self._entry = edge(self.doors.paths, settings, stack)
        self.serve_whole: ServeWhole = self._entry.serve_whole
        """For the HTTP protocol (http/server.py): the callback path's driver, which
        serves an invocation whose body is whole with no ASGI cycle or task."""

    def _routes(self, settings: Settings, stack: StackFile) -> list[BaseRoute]:
        """Every door but the data path's: the control plane's ``POST /`` (one action
        registry), the jobs facade, live stack config, operations and the console."""
        control_door = ControlDoor(
            actions=registry(
                endpoints_service=self.service,
                components=self.components,
                jobs=self.jobs,
                transforms=self.transforms,
                scaling=self.scaling,
                log_service=LogService(
                    jobs=self.jobs, processing=self.processing, logs_dir=settings.home / "logs"
                ),
                cloudwatch_service=self.cloudwatch.service,
                processing=self.processing,
                monitoring_service=self.monitoring,
            ),
            arn=self.service.arn,
            alarm_arn=self.cloudwatch.service.alarm_arn,
            namespace_arn=self.cloudwatch.service.namespace_arn,
        )
        jobs_door = JobsDoor(jobs=self.jobs)
        stack_door = StackConfigDoor(
            StackConfig(
                topics=self.topics,
                jobs=self.jobs,
                transforms=self.transforms,
                declared=stack.topics,
                jobs_declared="jobs" in stack.model_fields_set,
                origin=settings.config.stem if settings.config else None,
                default_jobs=JobsConfig(limit=settings.max_active_jobs),
                autoscaling_notify=stack.autoscaling.notify,
            )
        )
        return [
            Route("/", control_door.handle, methods=["POST"]),
            Route(
                "/service/{service}/operation/{operation}",
                control_door.handle_rpc_v2,
                methods=["POST"],
            ),
            Route("/inference", jobs_door.inference, methods=["POST"]),
            Route("/jobs/{name}/logs", jobs_door.logs, methods=["GET"]),
            Route("/stack", stack_door.get, methods=["GET"]),
            Route("/stack", stack_door.put, methods=["PUT"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route(
                "/metrics",
                metrics_endpoint(  # type: ignore[arg-type]
                    self.metrics,
                    region=settings.region,
                    account_id=settings.account_id,
                    workers=self.worker_metrics,
                ),
                methods=["GET"],
            ),
            *self.console.routes(),
        ]

    def _console(self, settings: Settings, stack: StackFile) -> ConsoleDoor:
        """The web console: reads of the store and of this gateway's memory, never of
        the data path (gateway/console/)."""
        state = ConsoleState(
            endpoints=self.service,
            fleets=self.reconciler.fleets,
            fleet_of=self.reconciler.fleet_of,
            routes=self.router.routes,
            backlogs=self.consumer.backlogs,
            metrics=self.metrics,
            jobs=JobReads(
                newest_jobs=self.jobs.store.newest,
                describe_job=self.jobs.describe,
                newest_transforms=self.transforms.store.newest,
                describe_transform=self.transforms.describe,
                newest_processing=self.processing.store.newest,
                describe_processing=self.processing.describe,
                schedules=self.monitoring.list_schedules,
                schedule=self.monitoring.schedule_view,
            ),
            events=EventLog(self.store.engine),
            components=self.components.components.list,
            sessions=self.invocations.sessions.count,
            cloudwatch=self.cloudwatch.service,
        )
        return ConsoleDoor(
            state=state,
            resources=ResourceReads(
                endpoints=self.service,
                components=self.components.list,
                cloudwatch=self.cloudwatch.service,
                scaling=self.scaling,
                queue=AsyncQueue(self.store.engine),
                objects=self.objects,
            ),
            log_files=self.jobs.log_files,
            processing_log_files=self.processing.log_files,
            logs_dir=settings.home / "logs",
            auth=stack.auth is not None,
            region=settings.region,
        )

    def __repr__(self) -> str:
        return f"Gateway(home={str(self.settings.home)!r}, store={self.store!r})"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._entry(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(self.store.migrate)
        # Session ids are signed with the store's key, so every gateway reads them alike;
        # the sessions closed before this start stay closed.
        self.invocations.sessions.key = await asyncio.to_thread(
            shared_secret, self.store.engine, "sessions"
        )
        await self.session_closes.exchange()
        self.backend.stop_leftovers()
        await self.reconciler.announce_known()
        # Started in this order and stopped in the reverse one: the consumer and the
        # job supervisor stop feeding the dispatcher before it stops.
        self.loops.start("reconciler", self.reconciler.run)
        self.loops.start("session-closes", self.session_closes.run)
        self.loops.start("event-dispatcher", self.dispatcher.run)
        self.loops.start("job-supervisor", self.supervisor.run)
        self.loops.start("processing-supervisor", self.processing_supervisor.run)
        self.loops.start("monitor-runs", self.monitor_runs.run)
        self.loops.start("async-consumer", self.consumer.run)
        self.loops.start("autoscaler", self.autoscaler.run)
        self.loops.start("transform-supervisor", self.transform_supervisor.run)
        self.loops.start("capture-writer", self.capture.run)
        self.loops.start("console-history", self.console.history.run)
        self.loops.start("cloudwatch-recorder", self.cloudwatch.recorder.run)
        self.loops.start("alarm-evaluator", self.cloudwatch.evaluator.run)
        await self.doors.start_grpc(self.settings, self.tls)
        await self.doors.start_http2(self.settings, self.tls)
        if self.worker_metrics is not None:
            await self.worker_metrics.start()
        if self._on_startup is not None:
            await self._on_startup(self.service)
        heap.settle(full=False)
        app.state.ready = True
        log.info(
            "gateway ready: account %s, region %s, home %s",
            self.settings.account_id,
            self.settings.region,
            self.settings.home,
        )
        try:
            yield
        finally:
            app.state.ready = False
            await self.doors.stop_grpc(self.settings.drain_timeout_s)
            await self.doors.stop_http2(self.settings.drain_timeout_s)
            await self.loops.stop()
            try:  # the last closes answered, for the store's other gateways
                await self.session_closes.exchange()
            except Exception:
                log.exception("sharing the last closes of sessions failed")
            if self.worker_metrics is not None:
                await self.worker_metrics.close()
            await self.capture.close()  # the doors take no more requests: flush the rest
            # Job runners are left running on purpose: the next gateway re-attaches.
            await self.shadows.close()
            await self.reconciler.stop_all()
            self.backend.close()
            self.router.close()
            self.store.close()
            log.info("gateway stopped")


async def _unknown_path(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    return unknown_path_response(request.url.path, request.method, status)


def create_app(settings: Settings, *, on_startup: StartupHook | None = None) -> Gateway:
    return Gateway(settings, on_startup=on_startup)
