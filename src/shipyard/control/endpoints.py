"""EndpointService: validate, record desired state, describe status.

Both the control plane and the CLI land here. It never sees HTTP and never starts a
process: it writes desired state to the store and wakes the reconciler.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection

from shipyard.control import deployments
from shipyard.errors import InvalidParameter, ResourceLimitExceeded, ResourceNotFound
from shipyard.events.kinds import test_notification_event
from shipyard.host_access import HostAccess
from shipyard.instance_types import GIB, memory_bytes
from shipyard.records import (
    AsyncConfig,
    ComponentStatus,
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    Model,
    VariantSpec,
    VariantState,
)
from shipyard.routing import priorities
from shipyard.storage.components import ComponentStore
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.metrics import MetricStore
from shipyard.storage.tags import Tagging, TagStore
from shipyard.storage.transform_jobs import TransformStore


class EndpointService:
    """Models, endpoint configs and endpoints: the desired state of real-time serving."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        wake: Callable[[], None],
        current_counts: Callable[[str], dict[str, int]],
        unknown_topics: Callable[[Sequence[str]], list[str]],
        on_event: Callable[[], None],
        region: str,
        account_id: str,
        max_endpoints: int,
        max_instances_per_variant: int,
        host_access: HostAccess | None = None,
        max_instances: int | None = None,
        max_instance_memory_bytes: int | None = None,
        tagging: Tagging | None = None,
    ) -> None:
        self.store = store
        self.components = ComponentStore.of(store)
        self.host_access = host_access or HostAccess()
        self.tagging = tagging or Tagging(store=TagStore(store.engine))
        self.tagging.track("model", self.list_models)
        self.tagging.track("endpoint-config", self.list_endpoint_configs)
        self.tagging.track("endpoint", self.list_endpoints)
        self.max_instances = max_instances
        self.max_instance_memory_bytes = max_instance_memory_bytes
        self._wake = wake
        self._current_counts = current_counts
        self._unknown_topics = unknown_topics
        self._on_event = on_event
        self.region = region
        self.account_id = account_id
        self.max_endpoints = max_endpoints
        self.max_instances_per_variant = max_instances_per_variant

    def __repr__(self) -> str:
        return f"EndpointService({self.store!r})"

    def arn(self, kind: str, name: str) -> str:
        # SageMaker lower-cases resource names in ARNs.
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:{kind}/{name.lower()}"

    # -- models -----------------------------------------------------------------------

    def create_model(
        self,
        name: str,
        *,
        image: str,
        model_data_url: str | None,
        environment: dict[str, str],
        execution_role_arn: str | None,
        raw: dict[str, object],
    ) -> Model:
        self.host_access.check_process(
            image=image,
            environment=environment,
            image_field="PrimaryContainer.Image",
            environment_field="PrimaryContainer.Environment",
        )
        self.host_access.check_location(model_data_url, "PrimaryContainer.ModelDataUrl")
        model = Model(
            name=name,
            arn=self.arn("model", name),
            image=image,
            model_data_url=model_data_url,
            environment=environment,
            execution_role_arn=execution_role_arn,
            created=now(),
            raw=raw,
        )
        self.store.create_model(model)
        return model

    def describe_model(self, name: str) -> Model:
        return self.store.get_model(name, kept=False)

    def list_models(self) -> list[Model]:
        return self.store.list_models()

    def delete_model(self, name: str) -> None:
        with self._missing_by_arn("model", "model", name):
            self.store.delete_model(name)
        self.tagging.forget(self.arn("model", name))

    # -- endpoint configs -------------------------------------------------------------

    def create_endpoint_config(
        self,
        name: str,
        variants: Sequence[VariantSpec],
        *,
        raw: dict[str, object],
        async_config: AsyncConfig | None = None,
    ) -> EndpointConfig:
        if async_config is not None:
            self._check_async(async_config)
        # SageMaker compares variant names whatever their case: p1 and P1 are one name.
        names = [v.name.casefold() for v in variants]
        if len(set(names)) != len(names):
            raise InvalidParameter(
                "Variant names must be unique within an endpoint config, across "
                "ProductionVariants and ShadowProductionVariants."
            )
        _check_shadow_counts(variants, async_config)
        _check_component_variants(variants, raw)
        for variant in variants:
            if variant.hosts_components:
                self._check_instance_count(variant.name, variant.instance_count)
                continue
            try:
                model = self.store.get_model(variant.model_name, kept=False)
            except ResourceNotFound:
                raise InvalidParameter(
                    f'Could not find model "{self.arn("model", variant.model_name)}".'
                ) from None
            if variant.shadow and model.multi_model:
                raise InvalidParameter(
                    f"Shadow variant {variant.name} serves a MultiModel model; shadow "
                    "variants do not support multi-model endpoints."
                )
            if variant.serverless is not None and (async_config is not None or model.multi_model):
                what = "AsyncInferenceConfig" if async_config is not None else "a MultiModel model"
                raise InvalidParameter(
                    f"Production variant {variant.name} has a ServerlessConfig; serverless "
                    f"endpoints do not support {what}."
                )
            queued = priorities.configured_variables(model.environment)
            if queued and (async_config is not None or model.multi_model):
                what = "AsyncInferenceConfig" if async_config is not None else "a MultiModel model"
                raise InvalidParameter(
                    f"Model {model.name} sets Environment {queued[0]}; an endpoint config "
                    f"with {what} does not hold requests in a priority queue."
                )
            if async_config is not None and model.multi_model:
                # InvokeEndpointAsync has no TargetModel, so no request could name a model.
                raise InvalidParameter(
                    f"Model {model.name} is a MultiModel model; an endpoint config with "
                    "AsyncInferenceConfig cannot serve it."
                )
            self._check_instance_count(variant.name, variant.instance_count)
        config = EndpointConfig(
            name=name,
            arn=self.arn("endpoint-config", name),
            variants=tuple(variants),
            created=now(),
            raw=raw,
            async_config=async_config,
        )
        self.store.create_endpoint_config(config)
        return config

    def describe_endpoint_config(self, name: str) -> EndpointConfig:
        return self.store.get_endpoint_config(name, kept=False)

    def list_endpoint_configs(self) -> list[EndpointConfig]:
        return self.store.list_endpoint_configs()

    def delete_endpoint_config(self, name: str) -> None:
        with self._missing_by_arn("endpoint configuration", "endpoint-config", name):
            self.store.delete_endpoint_config(name)
        self.tagging.forget(self.arn("endpoint-config", name))

    # -- endpoints --------------------------------------------------------------------

    def create_endpoint(
        self, name: str, config_name: str, *, deployment: dict[str, Any] | None = None
    ) -> Endpoint:
        """Create an endpoint; ``deployment`` (a DeploymentConfig) is checked and kept for
        its updates (RetainDeploymentConfig)."""
        config = self._config_for_endpoint(config_name)
        if deployment is not None:
            deployments.check(deployment, config, self._alarm_exists)
        self._check_budget(
            [(v.instance_type, v.instance_count) for v in config.variants], replacing=None
        )
        stamp = now()
        endpoint = Endpoint(
            name=name,
            arn=self.arn("endpoint", name),
            config_name=config.name,
            status=EndpointStatus.CREATING,
            failure_reason=None,
            created=stamp,
            modified=stamp,
            variants=tuple(
                VariantState(v.name, v.weight, v.instance_count, v.shadow) for v in config.variants
            ),
            last_deployment=deployment,
        )
        events = []
        if config.async_config is not None:
            test = test_notification_event(
                config.async_config,
                endpoint=name,
                endpoint_arn=endpoint.arn,
                at=stamp,
                region=self.region,
            )
            events = [test] if test is not None else []
        self.store.create_endpoint(endpoint, max_endpoints=self.max_endpoints, events=events)
        self._wake()
        if events:
            self._on_event()
        return endpoint

    def describe_endpoint(self, name: str) -> tuple[Endpoint, dict[str, int]]:
        """The endpoint and, per variant, how many instances serve it right now."""
        return self.store.get_endpoint(name), self._current_counts(name)

    def list_endpoints(self) -> list[Endpoint]:
        return self.store.list_endpoints()

    def update_endpoint(
        self,
        name: str,
        config_name: str,
        *,
        deployment: dict[str, Any] | None = None,
        retain_deployment: bool = False,
        retain_variants: bool = False,
        exclude_retained: Sequence[str] = (),
    ) -> Endpoint:
        """A blue/green update to ``config_name``, carried out as ``deployment`` (a
        DeploymentConfig: control/deployments.py) says; with ``retain_deployment`` and
        none given, as the last one given said. With ``retain_variants``
        (RetainAllVariantProperties) each variant the endpoint already has keeps its
        instance count and weight (an autoscaled count, an UpdateEndpointWeightsAnd-
        Capacities), but for the properties ``exclude_retained`` names
        (``DesiredInstanceCount``, ``DesiredWeight``), taken from the new config."""
        config = self._config_for_endpoint(config_name)
        self._check_components_kept(name, config)
        retained = None
        if retain_variants or retain_deployment:
            with self._missing_by_arn("endpoint", "endpoint", name):
                current = self.store.get_endpoint(name)
            if retain_variants:
                retained = _retained(current, self._serverless(current), config, exclude_retained)
            if deployment is None and retain_deployment:
                deployment = current.last_deployment
        kept = deployments.retain(config, retained)
        self._check_budget(
            [(v.instance_type, v.instance_count) for v in kept.variants], replacing=name
        )
        if deployment is not None:
            deployments.check(deployment, kept, self._alarm_exists)
        running = {"config": deployment, "started": time.time()} if deployment else None
        with self._missing_by_arn("endpoint", "endpoint", name):
            endpoint = self.store.change_endpoint(
                name,
                expect=[
                    EndpointStatus.IN_SERVICE,
                    EndpointStatus.FAILED,
                    EndpointStatus.UPDATE_ROLLBACK_FAILED,
                ],
                status=EndpointStatus.UPDATING,
                pending_config_name=config_name,
                failure_reason=None,
                deployment=running,
                last_deployment=deployment,
                retained=retained,
            )
        self._wake()
        return endpoint

    def _serverless(self, endpoint: Endpoint) -> set[str]:
        """The serverless variants of the config ``endpoint`` runs now (none known when
        that config was deleted since)."""
        try:
            config = self.store.get_endpoint_config(endpoint.config_name)
        except ResourceNotFound:
            return set()
        return {v.name for v in config.variants if v.serverless is not None}

    def _alarm_exists(self, name: str) -> bool:
        return MetricStore(self.store.engine).get_alarm(name) is not None

    def _check_components_kept(self, name: str, config: EndpointConfig) -> None:
        """An update must leave the endpoint's inference components a variant to run on:
        SageMaker refuses to strand them too."""
        hosting = {v.name for v in config.variants if v.hosts_components}
        stranded = [
            c
            for c in self.components.list(name)
            if c.variant not in hosting and c.status is not ComponentStatus.DELETING
        ]
        if stranded:
            names = ", ".join(sorted(c.name for c in stranded))
            variants = ", ".join(sorted({c.variant for c in stranded}))
            raise InvalidParameter(
                f"Endpoint {name} hosts inference components ({names}) on production "
                f"variant {variants}, which endpoint configuration {config.name} has no "
                "variant for inference components by that name. Delete the inference "
                "components first, or keep their variant."
            )

    def update_weights_and_capacities(
        self,
        name: str,
        changes: dict[str, tuple[float | None, int | None]],
        *,
        also: Callable[[Connection], None] | None = None,
    ) -> Endpoint:
        """Change weights and/or instance counts of live variants, in place.

        The autoscaler's steps come here too, with ``also`` recording their activity in
        the same transaction as the change.
        """
        with self._missing_by_arn("endpoint", "endpoint", name):
            current = self.store.get_endpoint(name)
        known = {v.name: v for v in current.variants}
        for variant in changes:
            if variant not in known:
                raise InvalidParameter(
                    f'The variant name(s) "{variant}" is/are not present in the endpoint '
                    f'"{current.arn}".'
                )
        config = self._config_for_endpoint(current.config_name, kept=True)
        serverless = {v.name for v in config.variants if v.serverless is not None}
        for variant, (_, count) in changes.items():
            if count is not None and variant in serverless:
                raise InvalidParameter(
                    f"Production variant {variant} is serverless: it has no instance count "
                    "to change."
                )
        variants = []
        for state in current.variants:
            weight, count = changes.get(state.name, (None, None))
            if count is not None:
                self._check_instance_count(state.name, count)
            variants.append(
                VariantState(
                    state.name,
                    state.desired_weight if weight is None else weight,
                    state.desired_instance_count if count is None else count,
                    state.shadow,
                )
            )
        types = {v.name: v.instance_type for v in config.variants}
        asked = [(types.get(v.name, ""), v.desired_instance_count) for v in variants]
        self._check_budget(asked, replacing=name)
        endpoint = self.store.change_endpoint(
            name,
            expect=[EndpointStatus.IN_SERVICE],
            status=EndpointStatus.UPDATING,
            variants=tuple(variants),
            failure_reason=None,
            also=also,
        )
        self._wake()
        return endpoint

    def delete_endpoint(self, name: str) -> None:
        with self._missing_by_arn("endpoint", "endpoint", name):
            self.store.change_endpoint(name, status=EndpointStatus.DELETING)
        self.tagging.forget(self.arn("endpoint", name))
        self._wake()

    # -- checks -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _missing_by_arn(self, what: str, kind: str, name: str) -> Iterator[None]:
        """SageMaker's words for a missing resource in calls that change or delete it:
        named by its ARN (``Could not find endpoint "arn:aws:sagemaker:…:endpoint/x".``).
        Describe calls keep the plain name, which boto3's waiters match."""
        try:
            yield
        except ResourceNotFound as exc:
            if exc.message != ResourceNotFound.of(what, name).message:
                raise  # another resource of the call is missing
            raise ResourceNotFound.of(what, self.arn(kind, name)) from None

    def check_budget(self, asked: Sequence[tuple[str, int]]) -> None:
        """Refuse ``asked`` (InstanceType, count) pairs past the gateway's instance or
        memory budget: what a transform job's instances ask (transform/service.py)."""
        self._check_budget(asked, replacing=None)

    def _check_budget(self, asked: Sequence[tuple[str, int]], *, replacing: str | None) -> None:
        """Refuse what would take the gateway past its instance or memory budget.

        Counts what every endpoint asks for in the store (desired counts, so endpoints
        still being created count), with ``replacing``'s own share swapped for ``asked``,
        and the instances of every transform job not yet ended. Two calls at the same
        instant may both pass: the budget guards against a host being exhausted, not
        against a race of two callers.
        """
        if self.max_instances is None and self.max_instance_memory_bytes is None:
            return
        asked = [*asked, *_transform_instances(TransformStore(self.store.engine))]
        instances = sum(count for _, count in asked)
        memory = sum(memory_bytes(kind) * count for kind, count in asked)
        for endpoint in self.store.list_endpoints():
            if endpoint.name == replacing or endpoint.status == EndpointStatus.DELETING:
                continue
            try:
                config = self.store.get_endpoint_config(endpoint.config_name)
            except ResourceNotFound:
                types: dict[str, str] = {}
            else:
                types = {v.name: v.instance_type for v in config.variants}
            for state in endpoint.variants:
                instances += state.desired_instance_count
                memory += memory_bytes(types.get(state.name, "")) * state.desired_instance_count
        if self.max_instances is not None and instances > self.max_instances:
            raise ResourceLimitExceeded(
                f"This request would bring the gateway to {instances} instances; its limit is "
                f"{self.max_instances} (SHIPYARD_MAX_INSTANCES)."
            )
        if self.max_instance_memory_bytes is not None and memory > self.max_instance_memory_bytes:
            raise ResourceLimitExceeded(
                f"This request would bring the memory of the gateway's instances, by their "
                f"InstanceType, to {memory / GIB:.1f} GiB; its limit is "
                f"{self.max_instance_memory_bytes / GIB:.1f} GiB "
                "(SHIPYARD_MAX_INSTANCE_MEMORY_BYTES)."
            )

    def _config_for_endpoint(self, config_name: str, *, kept: bool = False) -> EndpointConfig:
        """The config a caller names (``kept``: the one an endpoint runs, which may have
        been deleted since)."""
        try:
            return self.store.get_endpoint_config(config_name, kept=kept)
        except ResourceNotFound:
            raise InvalidParameter(
                f'Could not find endpoint configuration "{config_name}".'
            ) from None

    def _check_async(self, config: AsyncConfig) -> None:
        for field, uri in (
            ("S3OutputPath", config.output_path),
            ("S3FailurePath", config.failure_path),
        ):
            if not _is_object_uri(uri):
                raise InvalidParameter(
                    f"AsyncInferenceConfig.OutputConfig.{field}: {uri!r} is not an s3:// or "
                    "file:// URI or an absolute path."
                )
            self.host_access.check_location(uri, f"AsyncInferenceConfig.OutputConfig.{field}")
        for field, topic in (
            ("SuccessTopic", config.success_topic),
            ("ErrorTopic", config.error_topic),
        ):
            if topic is None:
                continue
            self.host_access.check_notify_target(topic, f"NotificationConfig.{field}")
            if self._unknown_topics([topic]):
                raise InvalidParameter(
                    f"NotificationConfig.{field}: topic {topic!r} does not exist; declare it "
                    "under topics: in the stack file, or give an apprise URL."
                )

    def _check_instance_count(self, variant: str, count: int) -> None:
        if count > self.max_instances_per_variant:
            raise ResourceLimitExceeded(
                f"The account-level service limit 'instances per production variant' is "
                f"{self.max_instances_per_variant} Instances; variant {variant} asked for "
                f"{count}."
            )


def _check_component_variants(variants: Sequence[VariantSpec], raw: dict[str, object]) -> None:
    """An endpoint config hosts inference components (no variant names a model) or
    models (every variant does), never both; for components, its ExecutionRoleArn is
    the role their copies run with, and SageMaker requires it."""
    hosting = [v.name for v in variants if v.hosts_components]
    if not hosting:
        return
    if len(hosting) != len(variants):
        raise InvalidParameter(
            "Every production variant of an endpoint configuration for inference "
            f"components must leave out ModelName; {', '.join(hosting)} do, the others not."
        )
    if any(v.shadow for v in variants):
        raise InvalidParameter(
            "An endpoint configuration for inference components cannot have "
            "ShadowProductionVariants."
        )
    if raw.get("AsyncInferenceConfig"):
        # InvokeEndpointAsync names no component in botocore's model: no request to such
        # an endpoint could say which component it is for.
        raise InvalidParameter(
            "An endpoint configuration for inference components cannot have an "
            "AsyncInferenceConfig on this gateway: InvokeEndpointAsync names no "
            "InferenceComponentName."
        )
    if not raw.get("ExecutionRoleArn"):
        raise InvalidParameter(
            "ExecutionRoleArn is required for an endpoint configuration whose production "
            "variants host inference components (they name no ModelName)."
        )


def _check_shadow_counts(variants: Sequence[VariantSpec], async_config: AsyncConfig | None) -> None:
    """SageMaker's rules for ShadowProductionVariants: one production variant and one
    shadow, neither serverless, and no AsyncInferenceConfig (botocore allows 10 in
    the list, so the limit of one is enforced here)."""
    shadows = [v for v in variants if v.shadow]
    if not shadows:
        return
    production = [v for v in variants if not v.shadow]
    if len(production) != 1 or len(shadows) != 1:
        raise InvalidParameter(
            "An endpoint config with ShadowProductionVariants must have exactly one "
            f"production variant and one shadow variant; it has {len(production)} and "
            f"{len(shadows)}."
        )
    if async_config is not None:
        raise InvalidParameter(
            "ShadowProductionVariants are not supported with AsyncInferenceConfig."
        )
    for variant in variants:
        if variant.serverless is not None:
            kind = "Shadow" if variant.shadow else "Production"
            raise InvalidParameter(
                f"{kind} variant {variant.name} has a ServerlessConfig; endpoint configs "
                "with ShadowProductionVariants support only instance-based variants."
            )


def _is_object_uri(uri: str) -> bool:
    """Where shipyard can read and write objects: s3://, file:// or an absolute path."""
    return uri.startswith(("s3://", "file:///")) or uri.startswith("/")


def _transform_instances(store: TransformStore) -> list[tuple[str, int]]:
    """The (InstanceType, count) of every transform job not yet ended."""
    out = []
    for job in store.list(active_only=True):
        resources = job.request.get("TransformResources") or {}
        out.append((str(resources.get("InstanceType", "")), int(resources.get("InstanceCount", 1))))
    return out


_PROPERTIES = {"DesiredInstanceCount": "count", "DesiredWeight": "weight"}
"""The VariantPropertyTypes an update keeps per variant; DataCaptureConfig, the third,
is the endpoint config's and is always the new one's here."""


def _retained(
    endpoint: Endpoint, serverless: set[str], config: EndpointConfig, exclude: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """What an update keeps of each variant of ``config`` that ``endpoint`` has now (of
    which those named in ``serverless`` have no instance count to keep)."""
    dropped = {_PROPERTIES[p] for p in exclude if p in _PROPERTIES}
    now = {v.name: v for v in endpoint.variants}
    kept: dict[str, dict[str, Any]] = {}
    for variant in config.variants:
        state = now.get(variant.name)
        if state is None or state.shadow != variant.shadow:
            continue
        values: dict[str, Any] = {"weight": state.desired_weight}
        if variant.serverless is None and variant.name not in serverless:
            values["count"] = state.desired_instance_count  # serverless ones have none
        kept[variant.name] = {k: v for k, v in values.items() if k not in dropped}
    return kept
