"""Fleets and their instances: start one, wait for its first ``/ping``, drain and stop.

The Provisioner is the reconciler's hands: it knows how an instance comes up and goes
down (through the Backend) but not when; deciding that is the Reconciler's job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipyard.backends import Capabilities
from shipyard.backends.base import (
    Backend,
    InstanceHandle,
    InstanceSpec,
    Resources,
    runtime_for,
    variant_resources,
)
from shipyard.backends.containers import CONTAINER_MODELS_DIR
from shipyard.errors import BackendError, FleetFailed, ShipyardError
from shipyard.provisioning.containers import (
    ContainerGroups,
    GroupHandle,
    GroupSpec,
    GroupTemplate,
    group_spec,
)
from shipyard.records import EndpointConfig, InferenceComponent, Model
from shipyard.routing.instance import Instance
from shipyard.routing.model_agent import ModelAgent
from shipyard.routing.serverless import ServerlessAdmission
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.metadata import MetadataStore

SHADOW_CPU_NICE = 10
"""How much lower a shadow variant's instances run than production ones (nice(2)): a
shadow must not take the CPU of the instances whose answers clients wait for."""


def builtin_concurrency(environment: dict[str, str]) -> int:
    """How many requests a built-in runtime instance works on at once: its handler
    threads (SAGEMAKER_MODEL_SERVER_WORKERS, default 1, as runtime/workers.py). Past
    that, LEAST_OUTSTANDING_REQUESTS holds requests at the gateway (and pipelines one
    more to fast instances).

    With server-side batching (SHIPYARD_MAX_BATCH_SIZE, runtime/batching.py) it is a
    full batch per thread plus one more being gathered: held at the gateway instead,
    requests would reach the instance one answer at a time and batches would never
    fill.

    Text generation (SHIPYARD_TASK, runtime/tasks) decodes up to a batch of requests
    together, so it takes that many at once: more would only wait in the instance.
    """
    try:
        threads = max(int(environment.get("SAGEMAKER_MODEL_SERVER_WORKERS", "1")), 1)
        batch = int(environment.get("SHIPYARD_MAX_BATCH_SIZE", "").strip() or "0")
    except ValueError:
        return 1  # the instance refuses to start with it, and says why
    if environment.get("SHIPYARD_TASK", "").strip() == "text-generation":
        return max(batch, threads)  # a sequence per request, decoded together
    return batch * (threads + 1) if batch > 0 else threads


def takes_copies(spec: InstanceSpec) -> bool:
    """Whether the instance runs the built-in runtime alone, which takes a shadow's
    copies many at a time (contract.COPIES_PATH)."""
    return not isinstance(spec, GroupSpec) and runtime_for(spec.image) == "python"


def instance_concurrency(spec: InstanceSpec) -> int | None:
    """Requests the instance works on at once, when known: a built-in runtime's handler
    threads; for a group of containers, its narrowest built-in container's. A user's
    own server may take any number at once, so its concurrency is left unknown."""
    if isinstance(spec, GroupSpec):
        known = [c for c in map(instance_concurrency, spec.members) if c is not None]
        return min(known) if known else None
    if runtime_for(spec.image) == "python":
        return builtin_concurrency(spec.environment)
    return None


@dataclass(frozen=True, slots=True)
class VariantTemplate:
    """How every instance of one variant starts."""

    image: str
    environment: dict[str, str]
    model_url: str | None
    """The artifact each instance fetches on its host (None: none, or multi-model)."""
    prefix: str | None = None
    """For a MultiModel model: the ModelDataUrl prefix its TargetModels are found under."""
    agent: ModelAgent | None = None
    """For a MultiModel ``cmd:`` image: what loads models into its instances."""
    group: GroupTemplate | None = None
    """For a multi-container model: its containers, each a process of every instance.
    ``environment`` then holds only what the gateway adds to each container's own."""
    start_timeout_s: float | None = None
    """How long an instance has to pass its first ``/ping`` (an inference component's
    StartupParameters.ContainerStartupHealthCheckTimeoutInSeconds); None: the gateway's
    ``instance_start_timeout_s``."""
    adapters_token: str | None = None
    """An inference component's: what its copies' ``/adapters`` route takes
    (InstanceSpec.adapters_token); None for any other variant, whose instances have none."""


@dataclass(eq=False)
class Slot:
    """One instance the reconciler keeps alive: its spec, process and router view."""

    spec: InstanceSpec
    variant: str
    scratch: Path | None = None
    """The instance's own folder (multi-model: its disk cache), removed when it stops."""
    handle: InstanceHandle | None = None
    instance: Instance | None = None
    ping_failures: int = 0
    failing_since: float | None = None
    """When its pings began to fail (monotonic), None while they succeed."""
    restarts: int = 0
    restart_at: float = 0.0
    retired: bool = False
    """Taken out of its fleet for good (stopped by ``Provisioner.stop_slots`` or
    ``drain_and_stop``: its fleet replaced or scaled in, a serverless instance idle or
    over its memory): never restarted."""
    start_timeout_s: float | None = None
    """Its template's ``start_timeout_s``."""

    def __repr__(self) -> str:
        return f"Slot(id={self.spec.instance_id!r}, variant={self.variant!r})"


@dataclass(slots=True)
class ComponentCopies:
    """What a fleet runs of one inference component (its slots are ``Fleet.slots[name]``)."""

    variant: str
    generation: int
    """The component's specification generation its copies run."""
    resources: Resources | None = None
    """What each copy reserves (its ComputeResourceRequirements)."""
    token: str = ""
    """What its copies' ``/adapters`` route takes (contract.ADAPTERS_TOKEN)."""


@dataclass(frozen=True, slots=True)
class AdapterOf:
    """An adapter component a fleet serves in the copies of its base component."""

    base: str
    src: str
    """Its artifact (Container.ArtifactUrl), which each base copy fetches and loads."""
    generation: int


TRANSFORM_JOB_LOGS = "transform_jobs"
"""The folder under ``<home>/logs`` of transform jobs' instance logs, one folder per job:
a name no endpoint can have (SageMaker's names have no underscore), so an endpoint and a
job of the same name never share their logs, each read under its own kind's scope."""


@dataclass(eq=False)
class Fleet:
    """The instances serving one endpoint config of one endpoint."""

    endpoint: str
    config: EndpointConfig
    slots: dict[str, list[Slot]]
    weights: dict[str, float]
    templates: dict[str, VariantTemplate] = field(default_factory=dict)
    serverless: dict[str, ServerlessAdmission] = field(default_factory=dict)
    """Per serverless variant: its admission and demand, kept across routing tables."""
    starting: dict[str, int] = field(default_factory=dict)
    """Per variant: instances being started (a scale-out, or a serverless variant's
    demand), not in ``slots`` yet. The routing table counts them as capacity coming."""
    adoptable: bool = False
    """An endpoint's fleet, whose instances the next holder of its lease may adopt if
    they outlive this gateway (InstanceSpec.endpoint); not a transform job's."""
    components: dict[str, ComponentCopies] = field(default_factory=dict)
    """For an endpoint of inference components: each component's copies are the slots
    (and template) under its name; this says which variant hosts them, and of which
    specification they are."""
    hosts: dict[str, int] = field(default_factory=dict)
    """Per variant of inference components: the instances it has (placement.py)."""
    placement: dict[str, list[int]] = field(default_factory=dict)
    """Per inference component: the instance (index in its variant) of each copy."""
    adapters: dict[str, AdapterOf] = field(default_factory=dict)
    """Adapter components (BaseInferenceComponentName), served by their base's copies."""
    logs: str = ""
    """Where its instances log, under ``<home>/logs``: the endpoint's own folder when
    empty; ``TRANSFORM_JOB_LOGS/<job>`` for a transform job's."""

    def all_slots(self) -> list[Slot]:
        return [s for slots in self.slots.values() for s in slots]

    def healthy(self) -> dict[str, int]:
        """Per variant (and inference component), its instances (copies) that answer
        their health checks now: what DescribeEndpoint, the console and the CLI show.

        A variant of inference components has no processes of its own (its copies are
        them): of its ``hosts`` instances, one is down only when copies are placed on
        it and none of them answers."""
        counts = {
            name: sum(1 for s in slots if s.instance is not None and s.instance.healthy)
            for name, slots in self.slots.items()
        }
        for variant, hosts in self.hosts.items():
            up: set[int] = set()
            placed: set[int] = set()
            for name, copies in self.components.items():
                if copies.variant != variant:
                    continue
                slots, hosts_of = self.slots.get(name, []), self.placement.get(name, [])
                for slot, host in zip(slots, hosts_of, strict=False):  # copies being placed
                    placed.add(host)
                    if slot.instance is not None and slot.instance.healthy:
                        up.add(host)
            counts[variant] = hosts - len({h for h in placed - up if h < hosts})
        return counts


class Provisioner:
    """Starts and stops the instances of fleets."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        backend: Backend,
        capabilities: Capabilities,
        artifacts: ArtifactStore,
        home: Path,
        start_timeout_s: float,
        drain_timeout_s: float,
        hand_over_s: float = 0.0,
        s3_endpoint_url: str | None = None,
        serverless_slots: int = 1,
        worker: int | None = None,
    ) -> None:
        self.store = store
        self._own = backend
        # Multi-container instances are started as groups of the backend's (containers.py).
        self.backend: Backend = ContainerGroups(backend)
        self.capabilities = capabilities
        self.artifacts = artifacts
        self.home = home
        self.s3_endpoint_url = s3_endpoint_url
        self.serverless_slots = serverless_slots
        self.start_timeout_s = start_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.hand_over_s = hand_over_s
        """How long an instance taken out of this gateway's routing table keeps serving
        before it is stopped: other gateways sharing the store route to it until they
        read the new routes."""
        self._ids = itertools.count(1)
        # Workers on one home (cli/workers.py) never name two instances alike: logs and
        # scratch folders are named by the id, and a taken-over fleet starts again at 1.
        self._id_tag = f"w{worker}-" if worker else ""

    def __repr__(self) -> str:
        return f"Provisioner(backend={self.backend!r})"

    @property
    def adopts(self) -> bool:
        """Whether instances outlive their gateway, for the next one to adopt."""
        return hasattr(self._own, "adopt")

    async def launch(
        self,
        endpoint: str,
        config: EndpointConfig,
        counts: dict[str, int],
        weights: dict[str, float],
        *,
        environment: dict[str, str] | None = None,
        warm: bool = False,
        adoptable: bool = False,
        take_over: dict[str, Any] | None = None,
        logs: str = "",
    ) -> Fleet:
        """Start every instance of ``config`` and return once all pass ``/ping``.

        ``environment`` is added to every instance's (a transform job's own variables);
        ``warm`` lets them start from warm spares (InstanceSpec.warm).

        ``adoptable``: an endpoint's fleet (Fleet.adoptable). ``take_over`` (which implies
        it): the endpoint's fleet is started by a gateway that runs none of it,
        and this is what the endpoint's previous lease holder recorded of its fleet
        (mirror.routes_of; empty: nothing). On a backend whose instances outlive their
        gateway, those of ``config`` that still answer are adopted instead of started,
        and every other instance filed under the endpoint is stopped.

        ``logs``: where the instances log under ``<home>/logs`` (Fleet.logs).
        """
        fleet = Fleet(
            endpoint=endpoint,
            config=config,
            slots={},
            weights=dict(weights),
            adoptable=adoptable or take_over is not None,
            logs=logs,
        )
        for variant in config.variants:
            if variant.hosts_components:
                # Its instances are where copies are placed: the copies are the processes,
                # started once its components are (control/convergence.py).
                fleet.slots[variant.name] = []
                fleet.hosts[variant.name] = counts.get(variant.name, variant.instance_count)
                continue
            model = await asyncio.to_thread(self.store.get_model, variant.model_name)
            template = await self._template(model, variant.name)
            template.environment.update(environment or {})
            startup = _startup_timeout(config, variant.name, self.start_timeout_s)
            if startup is not None:
                template = dataclasses.replace(template, start_timeout_s=startup)
            if variant.serverless is not None:
                # The runtime serves as many requests at once as the router sends it.
                template.environment.setdefault(
                    "SAGEMAKER_MODEL_SERVER_WORKERS", str(self.serverless_slots)
                )
            fleet.templates[variant.name] = template
            fleet.slots[variant.name] = [
                self.new_slot(endpoint, fleet, variant.name, warm=warm)
                for _ in range(counts.get(variant.name, variant.instance_count))
            ]
        slots = fleet.all_slots()
        try:
            if take_over is not None:
                await self._adopt(fleet, take_over)
            results = await asyncio.gather(
                *(self.start_slot(s) for s in slots if s.handle is None), return_exceptions=True
            )
        except BaseException:
            # Cancelled (the gateway is stopping): instances that did come up must not outlive it.
            await self.stop_slots(slots)
            raise
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop_slots(slots)
            first = failures[0]
            if not isinstance(first, FleetFailed | ShipyardError):
                raise first
            raise FleetFailed(str(first))
        return fleet

    async def _adopt(self, fleet: Fleet, recorded: dict[str, Any]) -> None:
        """Give ``fleet``'s slots the recorded instances that still answer ``/ping``, as
        far as they go; then stop every other instance filed under the endpoint."""
        adopt = getattr(self._own, "adopt", None)
        sweep = getattr(self._own, "sweep", None)
        if adopt is None or sweep is None:
            return  # its instances died with their gateway
        kept: set[str] = set()
        if recorded.get("config") == fleet.config.name:
            found = await asyncio.gather(
                *(
                    self._adopt_slot(adopt, slot, instance)
                    for variant in recorded.get("variants", [])
                    for slot, instance in zip(
                        fleet.slots.get(variant["name"], []),
                        [i for i in variant["instances"] if i.get("ref") and i.get("healthy")],
                        strict=False,
                    )
                )
            )
            kept = {ref for ref in found if ref is not None}
        await asyncio.to_thread(sweep, fleet.endpoint, keep=kept)

    async def _adopt_slot(self, adopt: Any, slot: Slot, recorded: dict[str, Any]) -> str | None:
        """The actor's ref once ``slot`` runs the recorded instance; None: it does not."""
        if isinstance(slot.spec, GroupSpec):
            return None
        handle = await adopt(
            recorded["ref"],
            url=recorded["url"],
            instance_id=slot.spec.instance_id,
            log_path=slot.spec.log_path,
        )
        if handle is None:
            return None
        instance = Instance(
            slot.spec.instance_id,
            slot.variant,
            handle.url,
            concurrency=instance_concurrency(slot.spec),
            takes_copies=takes_copies(slot.spec),
        )
        if self.backend.exit_reason(handle) is not None or not await self.ping(
            instance, timeout_s=2.0
        ):
            instance.pool.close()
            await self.backend.stop(handle, timeout_s=5.0)
            return None
        slot.handle, slot.instance = handle, instance
        return str(recorded["ref"])

    async def component_template(self, component: InferenceComponent) -> VariantTemplate:
        """How each copy of ``component`` starts: its model's container, or the
        container its Specification gives."""
        spec = component.spec
        if spec.model_name is not None:
            model = await asyncio.to_thread(self.store.get_model, spec.model_name)
        else:
            model = Model(
                name=component.name,
                arn=component.arn,
                image=spec.image or "",
                model_data_url=spec.artifact_url,
                environment=dict(spec.environment),
                execution_role_arn=None,
                created=component.created,
            )
        template = await self._template(model, component.name)
        template.environment["SHIPYARD_INFERENCE_COMPONENT"] = component.name
        # Its copies take adapters from the gateway alone (routing/adapters.py).
        template = dataclasses.replace(template, adapters_token=secrets.token_hex(16))
        if spec.startup_timeout_s is not None:
            template = dataclasses.replace(template, start_timeout_s=spec.startup_timeout_s)
        return template

    async def _template(self, model: Model, variant: str) -> VariantTemplate:
        """Nothing is fetched here: each instance fetches its artifact (or, multi-model,
        what it is asked for) on its own host."""
        self._check_runnable(model, variant)
        environment = {} if model.multi_container else dict(model.environment)
        if self.s3_endpoint_url:
            environment["SHIPYARD_S3_ENDPOINT_URL"] = self.s3_endpoint_url
        if model.multi_container:
            environment["SAGEMAKER_MULTI_MODEL"] = "false"
            group = GroupTemplate.of(model)
            first = group.containers[0]
            return VariantTemplate(first.image, environment, first.model_url, group=group)
        if not model.multi_model:
            # Set, not left out: a gateway started with it set must not pass it down.
            environment["SAGEMAKER_MULTI_MODEL"] = "false"
            return VariantTemplate(model.image, environment, model.model_data_url or None)
        prefix = model.model_data_url or ""
        if not model.model_cache_enabled:
            # ModelCacheSetting Disabled: keep one model in memory and none on disk.
            environment.setdefault("SHIPYARD_MODEL_CACHE_MAX_MODELS", "1")
            environment.setdefault("SHIPYARD_MODEL_DISK_CACHE_BYTES", "1")
        environment["SAGEMAKER_MULTI_MODEL"] = "true"
        environment["SHIPYARD_MODEL_PREFIX"] = prefix
        agent = None
        kind = runtime_for(model.image)
        if kind in ("cmd", "docker"):
            agent = ModelAgent(
                prefix=prefix,
                fetch=self.artifacts.fetch_model,
                folder=self.scratch_dir,
                # A container sees its models where the container backend mounts them.
                models_at=CONTAINER_MODELS_DIR if kind == "docker" else None,
            )
        return VariantTemplate(model.image, environment, None, prefix=prefix, agent=agent)

    def _check_runnable(self, model: Model, variant: str) -> None:
        """FleetFailed, saying why, when the backend cannot run ``model``'s instances."""
        for image in dict.fromkeys(str(c.get("Image", "")) for c in model.containers):
            self._check_image(image, variant)
        kind = runtime_for(model.image)
        if model.multi_model and kind == "cmd" and not self.capabilities.shared_disk:
            raise FleetFailed(
                f"Production variant {variant}: a multi-model cmd: server is loaded from the "
                "gateway's disk, which this gateway's backend does not share; use the "
                "built-in runtime (shipyard/python)."
            )

    def _check_image(self, image: str, variant: str) -> None:
        kind = runtime_for(image)
        if kind not in self.capabilities.runtimes:
            if kind == "docker":
                raise FleetFailed(
                    f"Image {image} is a container image, which needs a Docker "
                    "engine; this gateway's backend runs none. Use shipyard/python or "
                    "cmd:<command>."
                )
            raise FleetFailed(
                f"Production variant {variant}: this gateway's backend cannot run {kind} "
                f"images (it runs: {', '.join(sorted(self.capabilities.runtimes))})."
            )

    def scratch_dir(self, instance_id: str) -> Path:
        """The folder of one multi-model instance: its model directory and working folder."""
        return self.home / "instances" / instance_id

    def new_slot(self, endpoint: str, fleet: Fleet, variant: str, *, warm: bool = False) -> Slot:
        """A new instance of ``variant``, not started yet.

        A multi-model instance gets an empty folder of its own as its model directory:
        its disk cache lives there, and two processes must never share one (each evicts
        what it does not know the other uses). A restart of the slot keeps the folder.
        """
        template = fleet.templates[variant]
        instance_id = f"{endpoint}-{variant}-{self._id_tag}{next(self._ids)}"
        log_dir = self.home / "logs" / (fleet.logs or endpoint)
        log_dir.mkdir(parents=True, exist_ok=True)
        scratch = None
        if template.prefix is not None:
            scratch = self.scratch_dir(instance_id)
            shutil.rmtree(scratch, ignore_errors=True)  # left by an earlier gateway run
            scratch.mkdir(parents=True)
        spec = InstanceSpec(
            instance_id=instance_id,
            image=template.image,
            model_url=template.model_url,
            workdir=scratch,
            environment=dict(template.environment),
            log_path=log_dir / f"{instance_id}.log",
            s3_access=any(
                (uri or "").startswith("s3://")
                for uri in (
                    template.prefix,
                    template.model_url,
                    template.environment.get("SAGEMAKER_SUBMIT_DIRECTORY"),
                )
            ),
            warm=warm
            or any(v.name == variant and v.serverless is not None for v in fleet.config.variants),
            cpu_nice=SHADOW_CPU_NICE
            if any(v.name == variant and v.shadow for v in fleet.config.variants)
            else 0,
            resources=fleet.components[variant].resources
            if variant in fleet.components
            else next(
                (variant_resources(v) for v in fleet.config.variants if v.name == variant), None
            ),
            endpoint=endpoint if fleet.adoptable else None,
            adapters_token=template.adapters_token,
        )
        if template.group is not None:
            spec = group_spec(spec, template.group)
        return Slot(
            spec=spec, variant=variant, scratch=scratch, start_timeout_s=template.start_timeout_s
        )

    async def start_slot(self, slot: Slot) -> None:
        """Start the slot's process and wait for its first good ``/ping``."""
        try:
            handle = await self.backend.start(slot.spec)
        except BackendError as exc:
            raise FleetFailed(str(exc)) from exc
        instance = Instance(
            slot.spec.instance_id,
            slot.variant,
            handle.url,
            concurrency=instance_concurrency(slot.spec),
            socket_path=handle.socket_path,
            takes_copies=takes_copies(slot.spec),
            streams_both_ways=getattr(handle, "streams_both_ways", None),
        )
        if isinstance(handle, GroupHandle):
            handle.attach(instance)
        try:
            await self._wait_ready(slot, handle, instance)
        except BaseException:
            # Failed, timed out or cancelled (gateway stopping): never leave it running.
            instance.pool.close()
            await self.backend.stop(handle, timeout_s=5.0)
            raise
        slot.handle, slot.instance = handle, instance

    async def _wait_ready(self, slot: Slot, handle: InstanceHandle, instance: Instance) -> None:
        timeout_s = slot.start_timeout_s or self.start_timeout_s
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            reason = self.backend.exit_reason(handle)
            if reason is not None:
                raise FleetFailed(
                    f"Instance {slot.spec.instance_id} of production variant {slot.variant} "
                    f"failed to start: {reason}"
                )
            if await self.ping(instance, timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                raise FleetFailed(
                    f"Instance {slot.spec.instance_id} of production variant {slot.variant} "
                    f"did not pass the /ping health check within {timeout_s:g} s."
                )
            await asyncio.sleep(delay)
            # At most 0.1 s between pings: a ping on a fresh loopback connection costs far
            # less than the time a longer pause would leave a started instance idle.
            delay = min(delay * 1.5, 0.1)

    async def ping(self, instance: Instance, *, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                response = await instance.pool.ping()
        except (TimeoutError, OSError, Exception):
            return False
        return response.status == 200

    async def sweep(self, endpoint: str) -> None:
        """Stop every instance still filed under ``endpoint`` on a backend whose
        instances outlive their gateway (a deleted endpoint's, started by a gateway that
        died before it could stop them)."""
        sweep = getattr(self._own, "sweep", None)
        if sweep is not None:
            await asyncio.to_thread(sweep, endpoint)

    async def let_go(self, slots: Sequence[Slot]) -> None:
        """Give up ``slots`` to the gateway that takes their endpoint's lease over: those
        whose instances outlive this gateway are left running, for it to adopt or stop
        (a gateway that lost a lease cannot tell whether the new holder adopted them
        already); the others are stopped."""
        left = [s for s in slots if getattr(s.handle, "ref", None) is not None]
        for slot in left:
            slot.retired = True  # the new holder's now: never started again here
            if slot.instance is not None:
                slot.instance.pool.close()
            slot.handle, slot.instance = None, None
            if slot.scratch is not None:  # this gateway's folder, not the instance's
                await asyncio.to_thread(shutil.rmtree, slot.scratch, True)
        await self.stop_slots([s for s in slots if s not in left])

    async def drain_and_stop(self, slots: Sequence[Slot]) -> None:
        """Stop ``slots``, out of this gateway's routing table already, once no gateway
        can send them more: after ``hand_over_s`` (the other gateways read the new
        routes meanwhile) and once their requests in flight here are answered (bounded);
        the instance's own shutdown answers what other gateways sent before it.

        Cancelled while it waits (the gateway stopping), it still stops them: they are
        in no fleet any more, so nothing else would."""
        for slot in slots:
            slot.retired = True  # from now on: never restarted (supervision.py)
        try:
            if self.hand_over_s > 0 and any(s.instance is not None for s in slots):
                await asyncio.sleep(self.hand_over_s)
            deadline = time.monotonic() + self.drain_timeout_s
            while time.monotonic() < deadline and any(
                s.instance is not None and s.instance.in_flight > 0 for s in slots
            ):
                await asyncio.sleep(0.05)
        finally:
            await self.stop_slots(slots)

    async def stop_slots(self, slots: Sequence[Slot]) -> None:
        """Stop ``slots`` for good: they are retired, so a health check that had already
        taken one up (its fleet replaced meanwhile) leaves it stopped."""
        for slot in slots:
            slot.retired = True

        async def stop(slot: Slot) -> None:
            if slot.instance is not None:
                slot.instance.pool.close()
            if slot.handle is not None:
                await self.backend.stop(slot.handle)
            slot.handle, slot.instance = None, None
            if slot.scratch is not None:
                await asyncio.to_thread(shutil.rmtree, slot.scratch, True)

        await asyncio.gather(*(stop(s) for s in slots))


def _startup_timeout(config: EndpointConfig, variant: str, default_s: float) -> float | None:
    """How long the variant's instances have to pass their first ``/ping``, if its config
    says: its ContainerStartupHealthCheckTimeoutInSeconds (else ``default_s``), plus its
    ModelDataDownloadTimeoutInSeconds when set. An instance here fetches its model data
    as it starts, so the download and the health check are one wait, bounded by both."""
    variants = [*(config.raw.get("ProductionVariants") or ())]
    variants += config.raw.get("ShadowProductionVariants") or ()
    for raw in variants:
        if isinstance(raw, dict) and raw.get("VariantName") == variant:
            health = _seconds(raw.get("ContainerStartupHealthCheckTimeoutInSeconds"))
            download = _seconds(raw.get("ModelDataDownloadTimeoutInSeconds"))
            if download is None:
                return health
            return download + (default_s if health is None else health)
    return None


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None
