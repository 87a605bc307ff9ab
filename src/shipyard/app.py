"""The composition root: builds every component from Settings and wires them together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shipyard import heap
from shipyard.async_inference.consumer import Consumer
from shipyard.async_inference.queue import AsyncInvocations
from shipyard.autoscaling.autoscaler import Autoscaler, MetricReader
from shipyard.autoscaling.scaling import ScalingService
from shipyard.backends import BackendContext, FullBackend, create_backend
from shipyard.backends.environment import s3_variables
from shipyard.background import Loops, Wakeup
from shipyard.capture.writer import CaptureWriter
from shipyard.control.endpoints import EndpointService
from shipyard.control.leases import Leases
from shipyard.control.reconciler import Reconciler
from shipyard.events.dispatcher import Dispatcher
from shipyard.events.kinds import Announcer, training_job_event, transform_job_event
from shipyard.events.notify import Notifier
from shipyard.events.topics import Topics
from shipyard.gateway.actions import registry
from shipyard.gateway.async_invocations import AsyncDoor
from shipyard.gateway.console import ConsoleDoor, ConsoleState, JobReads
from shipyard.gateway.control import ControlDoor
from shipyard.gateway.edge import edge, serving_tls
from shipyard.gateway.errors import unknown_path_response
from shipyard.gateway.facade import JobsDoor
from shipyard.gateway.oip import InferenceProtocol
from shipyard.gateway.oip_rest import OipRestDoor
from shipyard.gateway.ops import healthz, metrics_endpoint
from shipyard.gateway.paths import PathRouter
from shipyard.gateway.runtime import RuntimeDoor
from shipyard.gateway.stack_config import StackConfigDoor
from shipyard.gateway.streaming import ResponseStreamDoor
from shipyard.gateway.validation import RequestValidator
from shipyard.host_access import HostAccess
from shipyard.jobs.service import JobService
from shipyard.jobs.supervisor import JobSupervisor
from shipyard.logs.service import LogService
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Provisioner
from shipyard.routing.invocation import Invocations
from shipyard.routing.router import Router
from shipyard.routing.shadow import ShadowCopier
from shipyard.settings import Settings
from shipyard.stack_config import StackConfig
from shipyard.stackfile import JobsConfig, StackFile
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.events import EventLog
from shipyard.storage.filesystems import Filesystems
from shipyard.storage.jobs import JobStore
from shipyard.storage.leases import ENDPOINT, TRAINING_JOB, TRANSFORM_JOB, LeaseStore
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.objects import ObjectStore
from shipyard.storage.scaling import ScalingStore
from shipyard.storage.tags import Tagging, TagStore
from shipyard.storage.transform_jobs import TransformStore
from shipyard.transform.service import TransformService
from shipyard.transform.supervisor import TransformSupervisor

log = logging.getLogger(__name__)

# Shapes whose AWS pattern allows only https/s3 URLs or registry images; shipyard also
# takes file:// and plain paths, and cmd: images.
# DestinationS3Uri likewise; SnsTopicArn also takes topic names and apprise URLs.
_LOCAL_URI_SHAPES = frozenset({"Url", "ContainerImage", "S3Uri", "DestinationS3Uri", "SnsTopicArn"})

StartupHook = Callable[[EndpointService], Awaitable[None]]


class Gateway:
    """The gateway's ASGI app: every component, built from Settings and wired together.

    Requests pass the edge (read once, signatures checked: gateway/signatures.py), then
    the path router (gateway/paths.py): the data path's doors straight, everything else
    through Starlette's routing.
    """

    def __init__(self, settings: Settings, *, on_startup: StartupHook | None = None) -> None:
        stack = StackFile.load(settings.config) if settings.config else StackFile()
        if stack.account_id is not None and "account_id" not in settings.model_fields_set:
            settings.account_id = stack.account_id
        self.tls = serving_tls(settings, stack)
        """The certificate and key this gateway serves HTTPS (and gRPC) with, if any."""
        self.host_access = HostAccess.from_auth(stack.auth)
        settings.home.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.metrics = Metrics()
        self.loops = Loops()
        self.filesystems = Filesystems(
            s3_endpoint_url=settings.s3_endpoint_url, file_roots=self.host_access.file_roots
        )
        """The one storage layer: every store of this gateway reaches S3 through it, and
        opens no local file a caller names outside ``auth.file_roots``."""
        self.objects = ObjectStore(filesystems=self.filesystems)
        """The one object store (data capture, async inputs and outputs, transforms)."""
        self.scale_now = Wakeup()
        """Wakes the autoscaler: the async consumer sets it when requests wait for an
        endpoint scaled to zero."""
        self.store = MetadataStore(settings.db_url)
        self.router = Router(
            timeout_s=settings.invocation_timeout_s,
            max_response_bytes=settings.max_response_bytes,
        )
        self.metrics.watch_in_flight(self.router.in_flight)
        self.shadows = ShadowCopier(
            router=self.router,
            max_pending=settings.shadow_max_pending_copies,
            dropped=self.metrics.shadow_copies_dropped,
        )
        self.topics = Topics(stack.topics)
        self.dispatcher = Dispatcher(
            log=EventLog(self.store.engine),
            topics=self.topics,
            notifier=Notifier(),
            lease_s=settings.event_lease_s,
        )
        self.backend, capabilities = create_backend(
            settings.backend,
            BackendContext(
                home=settings.home,
                environ=os.environ,
                s3=s3_variables(os.environ, s3_endpoint_url=settings.s3_endpoint_url),
                warm_spares=settings.warm_spares,
                ray_address=settings.ray_address,
                start_timeout_s=settings.instance_start_timeout_s,
                sandbox_file_roots=tuple(stack.auth.file_roots)
                if stack.auth is not None and stack.auth.sandbox
                else None,
            ),
        )
        backend = self.backend
        self.provisioner = provisioner = Provisioner(
            store=self.store,
            backend=backend,
            capabilities=capabilities,
            artifacts=ArtifactStore(filesystems=self.filesystems),
            home=settings.home,
            start_timeout_s=settings.instance_start_timeout_s,
            drain_timeout_s=settings.drain_timeout_s,
            s3_endpoint_url=settings.s3_endpoint_url,
            serverless_slots=settings.serverless_slots_per_instance,
        )
        self.capture = CaptureWriter(
            objects=self.objects,
            metrics=self.metrics,
            flush_interval_s=settings.capture_flush_interval_s,
            max_buffer_bytes=settings.capture_buffer_bytes,
        )
        self.reconciler = Reconciler(
            store=self.store,
            provisioner=provisioner,
            router=self.router,
            metrics=self.metrics,
            leases=self._leases(ENDPOINT),
            routes_refresh_s=settings.routes_refresh_s,
            health_check_period_s=settings.health_check_period_s,
            max_in_flight=settings.max_queue_per_instance,
            model_routing=settings.multi_model_routing,
            unhealthy_restart_after_s=settings.unhealthy_restart_after_s,
            serverless_idle_s=settings.serverless_idle_s,
            serverless_slots=settings.serverless_slots_per_instance,
            capture=self.capture,
        )
        self.tagging = Tagging(store=TagStore(self.store.engine))
        self.service = EndpointService(
            store=self.store,
            wake=self.reconciler.wake,
            current_counts=self.reconciler.current_instance_counts,
            unknown_topics=lambda targets: self.topics.resolve(targets).unknown,
            on_event=self.dispatcher.wake,
            region=settings.region,
            account_id=settings.account_id,
            max_endpoints=settings.max_endpoints,
            max_instances_per_variant=settings.max_instances_per_variant,
            host_access=self.host_access,
            max_instances=settings.max_instances,
            max_instance_memory_bytes=settings.max_instance_memory_bytes,
            tagging=self.tagging,
        )
        self.invocations = Invocations(
            self.router,
            shadows=self.shadows,
            region=settings.region,
            account_id=settings.account_id,
        )
        self.runtime = RuntimeDoor(
            invocations=self.invocations,
            max_payload_bytes=settings.max_payload_bytes,
            body_timeout_s=settings.body_read_timeout_s,
        )
        self.streaming = ResponseStreamDoor(runtime=self.runtime)
        self.oip = InferenceProtocol(runtime=self.runtime, is_ready=lambda: self.app.state.ready)
        self.oip_rest = OipRestDoor(self.oip)
        self._grpc: Any = None
        if settings.grpc_port is not None and stack.auth is not None:
            raise ValueError(
                "grpc_port: the gRPC door cannot check AWS signatures, and the stack file "
                "has an auth: section; serve the Open Inference Protocol over REST (/v2)."
            )
        self._build_jobs(settings, stack, backend)
        self._build_async(settings)
        self._build_scaling(settings, stack)
        self._build_transforms(settings, stack)
        control = ControlDoor(
            actions=registry(
                validator=RequestValidator(unpatterned=_LOCAL_URI_SHAPES),
                endpoints_service=self.service,
                jobs=self.jobs,
                transforms=self.transforms,
                scaling=self.scaling,
                log_service=LogService(jobs=self.jobs, logs_dir=settings.home / "logs"),
            ),
            arn=self.service.arn,
        )
        jobs_door = JobsDoor(jobs=self.jobs)
        stack_door = self._stack_config(settings, stack)
        self._on_startup = on_startup
        self.app = Starlette(
            routes=[
                Route("/", control.handle, methods=["POST"]),
                Route("/inference", jobs_door.inference, methods=["POST"]),
                Route("/jobs/{name}/logs", jobs_door.logs, methods=["GET"]),
                Route("/stack", stack_door.get, methods=["GET"]),
                Route("/stack", stack_door.put, methods=["PUT"]),
                Route("/healthz", healthz, methods=["GET"]),
                Route("/metrics", metrics_endpoint(self.metrics), methods=["GET"]),  # type: ignore[arg-type]
                *self._console(settings, stack).routes(),
            ],
            lifespan=self._lifespan,
            exception_handlers={404: _unknown_path, 405: _unknown_path},
        )
        self.app.state.ready = False
        doors = PathRouter(
            endpoint_doors={
                "invocations": self.runtime,
                "async-invocations": self.async_door,
                "invocations-response-stream": self.streaming,
            },
            v2=self.oip_rest,
            fallback=self.app,
        )
        self._entry = edge(doors, settings, stack)

    def _stack_config(self, settings: Settings, stack: StackFile) -> StackConfigDoor:
        """``/stack``: the topics and jobs sections, changed live by ``shipyard apply``."""
        config = StackConfig(
            topics=self.topics,
            jobs=self.jobs,
            transforms=self.transforms,
            declared=stack.topics,
            jobs_declared="jobs" in stack.model_fields_set,
            origin=settings.config.stem if settings.config else None,
            default_jobs=JobsConfig(limit=settings.max_active_jobs),
            autoscaling_notify=stack.autoscaling.notify,
        )
        return StackConfigDoor(config)

    def _build_jobs(self, settings: Settings, stack: StackFile, backend: FullBackend) -> None:
        """The job service, its supervisor and the event dispatcher that announces jobs."""
        config = (
            stack.jobs
            if "jobs" in stack.model_fields_set
            else JobsConfig(limit=settings.max_active_jobs)
        )
        announcer = Announcer(training_job_event, notify=config.notify)
        job_store = JobStore(self.store.engine)
        jobs_dir = settings.home / "jobs"
        self.supervisor = JobSupervisor(
            store=job_store,
            backend=backend,
            announcer=announcer,
            metrics=self.metrics,
            jobs_dir=jobs_dir,
            s3_endpoint_url=settings.s3_endpoint_url,
            stop_grace_s=settings.job_stop_grace_s,
            poll_period_s=settings.job_poll_period_s,
            on_event=self.dispatcher.wake,
            claim=self._leases(TRAINING_JOB).claim,
        )
        self.jobs = JobService(
            store=job_store,
            config=config,
            announcer=announcer,
            wake=self.supervisor.wake,
            jobs_dir=jobs_dir,
            region=settings.region,
            account_id=settings.account_id,
            host_access=self.host_access,
            tagging=self.tagging,
        )

    def _console(self, settings: Settings, stack: StackFile) -> ConsoleDoor:
        """The web console: reads of the store and of this gateway's memory, never of
        the data path (gateway/console/)."""
        state = ConsoleState(
            endpoints=self.service,
            fleets=self.reconciler.fleets,
            routes=self.router.routes,
            backlogs=self.consumer.backlogs,
            metrics=self.metrics,
            jobs=JobReads(
                newest_jobs=self.jobs.store.newest,
                describe_job=self.jobs.describe,
                newest_transforms=self.transforms.store.newest,
                describe_transform=self.transforms.describe,
            ),
            events=EventLog(self.store.engine),
        )
        self.console = ConsoleDoor(
            state=state,
            log_files=self.jobs.log_files,
            logs_dir=settings.home / "logs",
            auth=stack.auth is not None,
            region=settings.region,
        )
        return self.console

    def _leases(self, kind: str) -> Leases:
        """This gateway's leases on resources of ``kind``: what it runs of them when
        other gateways share the store."""
        return Leases(
            store=LeaseStore(self.store.engine, holder=self.settings.identity),
            kind=kind,
            lease_s=self.settings.lease_s,
            renew_s=self.settings.lease_renew_s,
        )

    def _build_async(self, settings: Settings) -> None:
        """The asynchronous-inference queue, its door and its consumer."""
        queue = AsyncQueue(self.store.engine)
        self.consumer = Consumer(
            queue=queue,
            invocations=self.invocations,
            objects=self.objects,
            metrics=self.metrics,
            owner=settings.identity,
            region=settings.region,
            account_id=settings.account_id,
            on_event=self.dispatcher.wake,
            on_backlog_without_capacity=self.scale_now.set,
        )
        self.async_door = AsyncDoor(
            router=self.router,
            invocations=AsyncInvocations(
                queue=queue, wake=self.consumer.wake, host_access=self.host_access
            ),
            account_id=settings.account_id,
            region=settings.region,
        )

    def _build_transforms(self, settings: Settings, stack: StackFile) -> None:
        """Batch transform: its service and the supervisor that runs its jobs."""
        store = TransformStore(self.store.engine)
        announcer = Announcer(transform_job_event, notify=stack.jobs.notify)
        self.transform_supervisor = TransformSupervisor(
            store=store,
            models=self.store,
            provisioner=self.provisioner,
            objects=self.objects,
            metrics=self.metrics,
            announcer=announcer,
            on_event=self.dispatcher.wake,
            claim=self._leases(TRANSFORM_JOB).claim,
        )
        self.transforms = TransformService(
            store=store,
            models=self.store,
            announcer=announcer,
            wake=self.transform_supervisor.wake,
            region=settings.region,
            account_id=settings.account_id,
            max_instances=settings.max_instances_per_variant,
            host_access=self.host_access,
            tagging=self.tagging,
        )

    def _build_scaling(self, settings: Settings, stack: StackFile) -> None:
        """Application Auto Scaling: its API and the autoscaler that acts on it."""
        store = ScalingStore(self.store.engine)
        self.autoscaler = Autoscaler(
            store=store,
            endpoints=self.service,
            reader=MetricReader(
                metrics=self.metrics,
                router=self.router,
                healthy=self.reconciler.current_instance_counts,
                backlogs=self.consumer.backlogs,
                window_s=settings.autoscaling_window_s,
                period_s=settings.autoscaling_period_s,
            ),
            period_s=settings.autoscaling_period_s,
            notify=stack.autoscaling.notify,
            on_event=self.dispatcher.wake,
            acts_on=self.reconciler.leases.holds,
            wakeup=self.scale_now,
        )
        self.scaling = ScalingService(
            store=store,
            endpoints=self.service,
            wake=self.autoscaler.wake,
            region=settings.region,
            account_id=settings.account_id,
        )

    def __repr__(self) -> str:
        return f"Gateway(home={str(self.settings.home)!r}, store={self.store!r})"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._entry(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(self.store.migrate)
        self.backend.stop_leftovers()
        await self.reconciler.announce_known()
        # Started in this order and stopped in the reverse one: the consumer and the
        # job supervisor stop feeding the dispatcher before it stops.
        self.loops.start("reconciler", self.reconciler.run)
        self.loops.start("event-dispatcher", self.dispatcher.run)
        self.loops.start("job-supervisor", self.supervisor.run)
        self.loops.start("async-consumer", self.consumer.run)
        self.loops.start("autoscaler", self.autoscaler.run)
        self.loops.start("transform-supervisor", self.transform_supervisor.run)
        self.loops.start("capture-writer", self.capture.run)
        self.loops.start("console-history", self.console.history.run)
        if self.settings.grpc_port is not None:
            from shipyard.gateway.oip_grpc import start_grpc

            pem = None
            if self.tls is not None:  # gRPC takes the PEM text, not the files
                pem = (self.tls[0].read_bytes(), self.tls[1].read_bytes())
            self._grpc = await start_grpc(
                self.oip,
                host=self.settings.host,
                port=self.settings.grpc_port,
                max_message_bytes=self.settings.max_payload_bytes + 64 * 1024,
                tls=pem,
            )
        if self._on_startup is not None:
            await self._on_startup(self.service)
        heap.settle()
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
            if self._grpc is not None:  # takes no more calls, answers those in flight
                await self._grpc.stop(self.settings.drain_timeout_s)
            await self.loops.stop()
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
