"""Endpoints put together: the provisioner that starts instances on the backend, the
data-capture writer their traffic is copied to, the reconciler converging fleets to the
store, and the service (the API) recording what is wanted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shipyard.backends import Capabilities, FullBackend
from shipyard.capture.writer import CaptureWriter
from shipyard.control.components import ComponentService
from shipyard.control.endpoints import EndpointService
from shipyard.control.reconciler import Reconciler
from shipyard.core import Core
from shipyard.provisioning.fleet import Provisioner
from shipyard.routing.router import Router
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.leases import ENDPOINT


@dataclass(frozen=True)
class Endpoints:
    provisioner: Provisioner
    capture: CaptureWriter
    reconciler: Reconciler
    service: EndpointService
    components: ComponentService


def build(
    core: Core,
    *,
    backend: FullBackend,
    capabilities: Capabilities,
    router: Router,
    unknown_topics: Callable[[Sequence[str]], list[str]],
) -> Endpoints:
    settings = core.settings
    provisioner = Provisioner(
        store=core.store,
        backend=backend,
        capabilities=capabilities,
        artifacts=ArtifactStore(filesystems=core.filesystems),
        home=settings.home,
        start_timeout_s=settings.instance_start_timeout_s,
        drain_timeout_s=settings.drain_timeout_s,
        # Gateways sharing the store read routes every routes_refresh_s: a few rounds,
        # for one whose loop is busy.
        hand_over_s=4 * settings.routes_refresh_s,
        s3_endpoint_url=settings.s3_endpoint_url,
        serverless_slots=settings.serverless_slots_per_instance,
        worker=settings.worker,
    )
    capture = CaptureWriter(
        objects=core.objects,
        metrics=core.metrics,
        flush_interval_s=settings.capture_flush_interval_s,
        max_buffer_bytes=settings.capture_buffer_bytes,
    )
    reconciler = Reconciler(
        store=core.store,
        provisioner=provisioner,
        router=router,
        metrics=core.metrics,
        leases=core.leases(ENDPOINT),
        routes_refresh_s=settings.routes_refresh_s,
        health_check_period_s=settings.health_check_period_s,
        max_in_flight=settings.max_queue_per_instance,
        model_routing=settings.multi_model_routing,
        unhealthy_restart_after_s=settings.unhealthy_restart_after_s,
        serverless_idle_s=settings.serverless_idle_s,
        serverless_slots=settings.serverless_slots_per_instance,
        capture=capture,
    )
    deployer = reconciler.converger.deployer
    deployer.notify = tuple(core.stack.deployments.notify)
    deployer.on_event = core.on_event
    service = EndpointService(
        store=core.store,
        wake=reconciler.wake,
        current_counts=reconciler.current_instance_counts,
        unknown_topics=unknown_topics,
        on_event=core.on_event,
        region=settings.region,
        account_id=settings.account_id,
        max_endpoints=settings.max_endpoints,
        max_instances_per_variant=settings.max_instances_per_variant,
        host_access=core.host_access,
        max_instances=settings.max_instances,
        max_instance_memory_bytes=settings.max_instance_memory_bytes,
        tagging=core.tagging,
    )
    components = ComponentService(
        store=core.store,
        components=reconciler.converger.components,
        wake=reconciler.wake,
        arn=service.arn,
        host_access=core.host_access,
        tagging=core.tagging,
        current=reconciler.current_copies,
    )
    return Endpoints(
        provisioner=provisioner,
        capture=capture,
        reconciler=reconciler,
        service=service,
        components=components,
    )
