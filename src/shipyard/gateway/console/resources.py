"""The console's reads of the resources besides endpoints and jobs: models, endpoint
configs, inference components, alarms and the scaling policies of an endpoint.

Each is a store read (it blocks: the door runs it in a worker thread), returning the
service's own records. Lists take the filters the List* actions take (a part of the
name, a status) and a page: ``PAGE_SIZE`` rows, newest first, as ListModels returns
them by ``CreationTime`` descending; a key scoped by resource sees only what it
reaches, and is counted among those alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shipyard.autoscaling.scaling import ScalingService
from shipyard.cloudwatch.service import CloudWatchService
from shipyard.control.endpoints import EndpointService
from shipyard.errors import ResourceNotFound, ShipyardError
from shipyard.gateway.console.captured import Capture, last_records
from shipyard.records import (
    AsyncRequest,
    EndpointConfig,
    InferenceComponent,
    Model,
    ScalingPolicy,
)
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.metrics import Alarm, HistoryItem
from shipyard.storage.objects import ObjectStore

PAGE_SIZE = 50
"""Rows a list shows at once, as ``MaxResults`` would; the next page is a link away."""

ALARM_HISTORY = 50
"""State changes an alarm's page shows, newest first."""

REQUESTS_SHOWN = 50
"""An asynchronous endpoint's newest requests shown."""

Reaches = Callable[[str], bool]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Filter:
    """What a list asks for: ``NameContains``, ``StatusEquals`` and a page (from 0)."""

    name: str = ""
    status: str = ""
    page: int = 0

    @classmethod
    def of(cls, query: Any) -> Filter:
        """From a request's query parameters; anything unreadable is left unset."""
        page = str(query.get("page", "0"))
        return cls(
            name=str(query.get("name", ""))[:63],
            status=str(query.get("status", ""))[:63],
            page=min(int(page), 10_000) if page.isdigit() else 0,
        )


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a filtered list, and how many matched in all."""

    items: tuple[T, ...]
    total: int
    filter: Filter

    @property
    def more(self) -> bool:
        return (self.filter.page + 1) * PAGE_SIZE < self.total


def page_of(
    items: Sequence[T],
    wanted: Filter,
    *,
    name: Callable[[T], str],
    status: Callable[[T], str] = lambda _: "",
    created: Callable[[T], Any],
    newest_first: bool = True,
) -> Page[T]:
    """``items`` filtered as ``wanted`` says, newest first (or in ``created``'s order),
    cut to its page."""
    needle = wanted.name.lower()
    kept = [
        item
        for item in items
        if needle in name(item).lower() and (not wanted.status or status(item) == wanted.status)
    ]
    kept.sort(key=created, reverse=newest_first)
    start = wanted.page * PAGE_SIZE
    return Page(tuple(kept[start : start + PAGE_SIZE]), len(kept), wanted)


@dataclass(frozen=True, slots=True)
class ModelDetail:
    model: Model
    used_by: tuple[str, ...]
    """Endpoint configs whose variants serve it."""


@dataclass(frozen=True, slots=True)
class AlarmDetail:
    alarm: Alarm
    history: tuple[HistoryItem, ...]


class ResourceReads:
    """Store reads of models, configs, components, alarms and scaling policies."""

    def __init__(
        self,
        *,
        endpoints: EndpointService,
        components: Callable[[], list[InferenceComponent]],
        cloudwatch: CloudWatchService | None,
        scaling: ScalingService | None,
        queue: AsyncQueue | None = None,
        objects: ObjectStore | None = None,
    ) -> None:
        self.endpoints = endpoints
        self._components = components
        self.cloudwatch = cloudwatch
        self.scaling = scaling
        self.queue = queue
        self.objects = objects

    def __repr__(self) -> str:
        return "ResourceReads()"

    def models(self, wanted: Filter, reaches: Reaches | None) -> Page[Model]:
        found = _reached(self.endpoints.list_models(), reaches)
        return page_of(found, wanted, name=lambda m: m.name, created=lambda m: m.created)

    def model(self, name: str) -> ModelDetail:
        model = self.endpoints.describe_model(name)
        used_by = tuple(
            str(c.raw.get("EndpointConfigName", c.name))
            for c in self.endpoints.list_endpoint_configs()
            if any(v.model_name == model.name for v in c.variants)
        )
        return ModelDetail(model, used_by)

    def configs(self, wanted: Filter, reaches: Reaches | None) -> Page[EndpointConfig]:
        found = _reached(self.endpoints.list_endpoint_configs(), reaches)
        return page_of(found, wanted, name=shown_name, created=lambda c: c.created)

    def config(self, name: str) -> EndpointConfig:
        return self.endpoints.describe_endpoint_config(name)

    def components(self, wanted: Filter, reaches: Reaches | None) -> Page[InferenceComponent]:
        found = _reached(self._components(), reaches)
        return page_of(
            found,
            wanted,
            name=lambda c: c.name,
            status=lambda c: c.status.value,
            created=lambda c: c.created,
        )

    def component(self, name: str) -> InferenceComponent:
        found = [c for c in self._components() if c.name == name]
        if not found:
            raise ResourceNotFound(f'Could not find inference component "{name}".')
        return found[0]

    def all_components(self) -> list[InferenceComponent]:
        return self._components()

    def alarms(self, wanted: Filter, reaches: Reaches | None) -> Page[Alarm]:
        if self.cloudwatch is None:
            return Page((), 0, wanted)
        found = _reached(self.cloudwatch.describe_alarms(), reaches)
        return page_of(
            found,
            wanted,
            name=lambda a: a.name,
            status=lambda a: a.state,
            created=lambda a: a.config_updated,
        )

    def alarm(self, name: str) -> AlarmDetail | None:
        if self.cloudwatch is None:
            return None
        found = self.cloudwatch.describe_alarms(names=[name])
        if not found:
            return None
        history = self.cloudwatch.history(
            alarm=name, item_type=None, start=None, end=None, newest_first=True
        )
        return AlarmDetail(found[0], tuple(history[:ALARM_HISTORY]))

    def alarm_arn(self, name: str) -> str:
        return self.cloudwatch.alarm_arn(name) if self.cloudwatch is not None else name

    def policies_of(self, endpoint: str) -> tuple[ScalingPolicy, ...]:
        """The scaling policies on the endpoint's variants (and components)."""
        if self.scaling is None:
            return ()
        return tuple(
            p
            for p in self.scaling.describe_policies(None, None)
            if p.resource_id.startswith(f"endpoint/{endpoint}/")
        )

    def requests(self, endpoint: str) -> tuple[AsyncRequest, ...] | None:
        """An asynchronous endpoint's newest requests; None for a real-time one."""
        config = self._config_of(endpoint)
        if config is None or config.async_config is None or self.queue is None:
            return None
        return tuple(self.queue.recent(endpoint, REQUESTS_SHOWN))

    def captured(self, endpoint: str) -> Capture | None:
        """The last records the endpoint's capture wrote; None when it captures nothing."""
        config = self._config_of(endpoint)
        capture = (config.raw.get("DataCaptureConfig") or {}) if config is not None else {}
        destination = capture.get("DestinationS3Uri")
        if not destination or capture.get("EnableCapture") is False or self.objects is None:
            return None
        return last_records(self.objects, str(destination), endpoint)

    def _config_of(self, endpoint: str) -> EndpointConfig | None:
        store = self.endpoints.store
        try:
            return store.get_endpoint_config(store.get_endpoint(endpoint).config_name)
        except ShipyardError:
            return None


def shown_name(config: EndpointConfig) -> str:
    """A config's name as its creator gave it (a deleted one's is kept under another)."""
    return str(config.raw.get("EndpointConfigName", config.name))


def _reached(items: list[T], reaches: Reaches | None) -> list[T]:
    if reaches is None:
        return items
    return [item for item in items if reaches(str(getattr(item, "arn", "")))]
