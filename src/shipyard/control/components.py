"""Inference components: the API's side (Create, Describe, List, Update, Delete).

A component is a model hosted on the instances of one variant of an endpoint whose
config names no model (records.VariantSpec.hosts_components), in a number of copies,
each its own model-server process reserving the component's cores and memory
(control/placement.py). The service only records what is wanted and wakes the
reconciler, which places, starts and stops copies (control/convergence.py) and records
the status they reach.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

from shipyard.control.placement import capacity_of, fits_one
from shipyard.errors import InvalidParameter, ResourceInUse, ResourceNotFound
from shipyard.host_access import HostAccess
from shipyard.records import (
    ComponentSpec,
    ComponentStatus,
    EndpointStatus,
    InferenceComponent,
    VariantSpec,
)
from shipyard.storage.components import ComponentStore, not_found
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.tags import Tagging


class ComponentService:
    """Records inference components and wakes the reconciler to converge to them."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        components: ComponentStore,
        wake: Callable[[], None],
        arn: Callable[[str, str], str],
        host_access: HostAccess,
        tagging: Tagging,
        current: Callable[[InferenceComponent], int] = lambda component: 0,
    ) -> None:
        self.store = store
        self.current = current
        """How many copies of a component serve now (the reconciler's fleets)."""
        self.components = components
        self._wake = wake
        self.arn = arn
        self.host_access = host_access
        self.tagging = tagging
        tagging.track("inference-component", self.list)

    def __repr__(self) -> str:
        return f"ComponentService({self.components!r})"

    def create(
        self,
        name: str,
        *,
        endpoint: str,
        variant: str | None,
        spec: ComponentSpec,
        copies: int,
        raw: dict[str, object],
    ) -> InferenceComponent:
        if spec.base is not None and variant is None:
            # An adapter names no variant: it runs where its base does.
            base = next((c for c in self.components.list(endpoint) if c.name == spec.base), None)
            variant = None if base is None else base.variant
        host = self._variant_of(endpoint, variant)
        self._check_spec(name, spec, host, endpoint)
        stamp = now()
        component = InferenceComponent(
            name=name,
            arn=self.arn("inference-component", name),
            endpoint=endpoint,
            variant=host.name,
            spec=spec,
            copies=copies,
            status=ComponentStatus.CREATING,
            created=stamp,
            modified=stamp,
            raw=raw,
        )
        self.components.create(component)
        self._wake()
        return component

    def describe(self, name: str) -> InferenceComponent:
        return self.components.get(name)

    def list(self) -> list[InferenceComponent]:
        return self.components.list()

    def update(
        self,
        name: str,
        *,
        spec: ComponentSpec | None,
        raw: dict[str, object] | None,
        copies: int | None,
    ) -> InferenceComponent:
        """A new specification (its copies replaced, a few at a time, never all at
        once) and/or a new copy count."""
        current = self._changeable(name)
        serving = current.served is not None and current.served.generation == current.generation
        if spec == current.spec and (serving or not current.failure_reason):
            # The same specification again (a stack file applied twice, or the one a failed
            # update rolled back to): nothing to replace; only a copy count, if given,
            # changes. One that failed to start is tried again.
            spec = None
            if copies is None:
                return current
        if spec is not None:
            if (spec.base is None) != (current.spec.base is None):
                # An adapter runs in its base's copies, a component in its own: one is not
                # made the other (its copies, or its adapters, would be stranded).
                kind = "an adapter" if current.spec.base is not None else "not an adapter"
                raise InvalidParameter(
                    f"Inference component {name} is {kind}: an update keeps it so "
                    "(BaseInferenceComponentName given or not, as at its creation)."
                )
            host = self._variant_of(current.endpoint, current.variant)
            self._check_spec(name, spec, host, current.endpoint)
            self.components.respecify(name, spec, dict(raw or {}), copies)
        elif copies is not None:
            self._set_copies(name, copies)
        self._wake()
        return self.components.get(name)

    def update_copies(
        self, name: str, copies: int, *, also: Callable[[Connection], None] | None = None
    ) -> InferenceComponent:
        """UpdateInferenceComponentRuntimeConfig: a new copy count. The autoscaler's
        steps come here too, ``also`` recording their activity in the same transaction."""
        self._changeable(name)
        self._set_copies(name, copies, also=also)
        self._wake()
        return self.components.get(name)

    def delete(self, name: str) -> None:
        component = self.components.get(name)
        adapters = [
            c.name
            for c in self.components.list(component.endpoint)
            if c.spec.base == name and c.status is not ComponentStatus.DELETING
        ]
        if adapters:
            raise ResourceInUse(
                f"Inference component {name} is the base of {', '.join(adapters)}; delete "
                "those first."
            )
        self.components.change(name, status=ComponentStatus.DELETING)
        self.tagging.forget(component.arn)
        self._wake()

    # -- checks -----------------------------------------------------------------------

    def _set_copies(
        self, name: str, copies: int, also: Callable[[Connection], None] | None = None
    ) -> None:
        if self.components.get(name).spec.base is not None:
            raise InvalidParameter(
                f"Inference component {name} is an adapter: it runs in the copies of its "
                "base component, so scale that one instead."
            )
        if not self.components.change(
            name,
            expect=[ComponentStatus.IN_SERVICE, ComponentStatus.CREATING, ComponentStatus.UPDATING],
            copies=copies,
            status=ComponentStatus.UPDATING,
            failure_reason=None,
            also=also,
        ):
            raise not_found(name)

    def _changeable(self, name: str) -> InferenceComponent:
        current = self.components.get(name)
        if current.status in (ComponentStatus.DELETING, ComponentStatus.FAILED):
            raise InvalidParameter(
                f"Cannot update inference component {name}: it is {current.status.value}."
            )
        return current

    def _variant_of(self, endpoint: str, variant: str | None) -> VariantSpec:
        """The variant of ``endpoint`` that will host the component: the named one, or
        the endpoint's only one."""
        try:
            ep = self.store.get_endpoint(endpoint)
        except ResourceNotFound:
            raise InvalidParameter(
                f'Could not find endpoint "{self.arn("endpoint", endpoint)}".'
            ) from None
        if ep.status in (EndpointStatus.DELETING, EndpointStatus.FAILED):
            raise InvalidParameter(
                f"Cannot deploy an inference component to endpoint {endpoint}: it is "
                f"{ep.status.value}."
            )
        config = self.store.get_endpoint_config(ep.pending_config_name or ep.config_name)
        if not config.hosts_components:
            raise InvalidParameter(
                f"Endpoint {endpoint} serves models named in its endpoint configuration "
                f"{config.name}; inference components need an endpoint whose production "
                "variants name no ModelName."
            )
        if variant is None:
            if len(config.production_variants) != 1:
                raise InvalidParameter(
                    f"Endpoint {endpoint} has {len(config.production_variants)} production "
                    "variants: VariantName is required."
                )
            return config.production_variants[0]
        for spec in config.production_variants:
            if spec.name == variant:
                return spec
        raise InvalidParameter(f"Endpoint {endpoint} has no production variant named {variant}.")

    def _check_spec(self, name: str, spec: ComponentSpec, host: VariantSpec, endpoint: str) -> None:
        if spec.base is not None:
            self._check_adapter(name, spec, endpoint)
            return
        if (spec.model_name is None) == (spec.image is None):
            raise InvalidParameter(
                f"Inference component {name}: its Specification needs either ModelName or "
                "Container (with an Image), and not both."
            )
        if spec.requirements is None:
            raise InvalidParameter(
                f"Inference component {name}: Specification.ComputeResourceRequirements "
                "is required."
            )
        if spec.model_name is not None:
            try:
                model = self.store.get_model(spec.model_name, kept=False)
            except ResourceNotFound:
                raise InvalidParameter(
                    f'Could not find model "{self.arn("model", spec.model_name)}".'
                ) from None
            if model.multi_model or model.multi_container:
                raise InvalidParameter(
                    f"Model {model.name} has several containers or is a MultiModel model; "
                    "an inference component runs one single-model container."
                )
        else:
            self.host_access.check_process(
                image=spec.image or "",
                environment=spec.environment,
                image_field="Specification.Container.Image",
                environment_field="Specification.Container.Environment",
            )
            self.host_access.check_location(
                spec.artifact_url, "Specification.Container.ArtifactUrl"
            )
        needs = spec.requirements
        if needs.max_memory_mb is not None and needs.max_memory_mb < needs.min_memory_mb:
            raise InvalidParameter(
                f"Inference component {name}: MaxMemoryRequiredInMb ({needs.max_memory_mb}) "
                f"is less than MinMemoryRequiredInMb ({needs.min_memory_mb})."
            )
        if needs.accelerators:
            raise InvalidParameter(
                f"Inference component {name} asks for {needs.accelerators:g} accelerator "
                f"devices; the instances of {host.instance_type} here have none."
            )
        if not fits_one(host.instance_type, needs.cpus, needs.min_memory_mb):
            size = capacity_of(host.instance_type)
            assert size is not None
            raise InvalidParameter(
                f"Inference component {name} needs {needs.cpus:g} CPU cores and "
                f"{needs.min_memory_mb} MB of memory per copy; an instance of "
                f"{host.instance_type} has {size.vcpus} cores and "
                f"{size.memory_bytes >> 20} MB."
            )

    def _check_adapter(self, name: str, spec: ComponentSpec, endpoint: str) -> None:
        assert spec.base is not None
        try:
            base = self.components.get(spec.base)
        except ResourceNotFound:
            raise InvalidParameter(
                f"Inference component {name}: its base inference component {spec.base} "
                "does not exist."
            ) from None
        if base.endpoint != endpoint or base.spec.base is not None:
            raise InvalidParameter(
                f"Inference component {name}: its base {spec.base} must be a component "
                f"of endpoint {endpoint} that is not an adapter itself."
            )
        if spec.requirements is not None or spec.image is not None or spec.model_name:
            raise InvalidParameter(
                f"Inference component {name} is an adapter (BaseInferenceComponentName): "
                "it takes its base's copies, model and compute resources, so its "
                "Specification gives only Container.ArtifactUrl."
            )
        if not spec.artifact_url:
            raise InvalidParameter(
                f"Inference component {name} is an adapter (BaseInferenceComponentName): "
                "Specification.Container.ArtifactUrl, where its adapter is, is required."
            )
        self.host_access.check_location(spec.artifact_url, "Specification.Container.ArtifactUrl")
