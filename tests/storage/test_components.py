"""ComponentStore on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

import pytest

from shipyard.events.kinds import component_events
from shipyard.records import ComponentSpec, ComponentStatus, InferenceComponent
from shipyard.storage.components import ComponentStore
from shipyard.storage.events import EventLog
from shipyard.storage.metadata import MetadataStore, now


@pytest.fixture
def components(meta: MetadataStore) -> ComponentStore:
    return ComponentStore(meta.engine)


def _component(
    name: str, copies: int, status: ComponentStatus, failure_reason: str | None = None
) -> InferenceComponent:
    t = now()
    spec = ComponentSpec(image="shipyard/python", artifact_url="file:///x")
    return InferenceComponent(
        name, f"arn:ic/{name}", "e", "v1", spec, copies, status, t, t, failure_reason
    )


@pytest.mark.parametrize("status", [ComponentStatus.IN_SERVICE, ComponentStatus.UPDATING])
def test_a_request_brings_a_component_at_zero_back(
    components: ComponentStore, status: ComponentStatus
) -> None:
    """At zero copies, in service or still scaling down to zero (its copies can be gone
    before that step is recorded): one copy is asked for, and the step's late record of
    "in service at zero" no longer applies."""
    failed_update = "Updating inference component ic failed, it keeps its previous copies"
    components.create(_component("ic", 0, status, failed_update))
    step_saw = components.get("ic")
    assert step_saw.failure_reason == failed_update
    assert components.start_from_zero("ic")
    after = components.get("ic")
    assert (after.copies, after.status, after.failure_reason) == (1, ComponentStatus.UPDATING, None)
    assert not components.change(
        "ic", unchanged_since=step_saw.modified, status=ComponentStatus.IN_SERVICE
    )
    assert not components.start_from_zero("ic"), "asked once: it has a copy coming"


@pytest.mark.parametrize(
    ("copies", "status"),
    [
        (1, ComponentStatus.IN_SERVICE),
        (0, ComponentStatus.CREATING),
        (0, ComponentStatus.DELETING),
        (0, ComponentStatus.FAILED),
    ],
)
def test_a_request_starts_no_copy_of_a_component_not_at_zero(
    components: ComponentStore, copies: int, status: ComponentStatus
) -> None:
    components.create(_component("ic", copies, status))
    assert not components.start_from_zero("ic")
    after = components.get("ic")
    assert (after.copies, after.status) == (copies, status)


def test_every_status_change_is_an_event_written_with_it(meta: MetadataStore) -> None:
    """Each write that moves a component's status records one event in its transaction,
    whichever method makes it; a write that changes no status, or that does not apply,
    records none; a status reached again is an event again."""
    store = ComponentStore(meta.engine, announce=component_events)
    log = EventLog(meta.engine)

    def statuses() -> list[str]:
        return [s.event.detail["InferenceComponentStatus"] for s in log.recent_events(50)][::-1]

    store.create(_component("ic", 1, ComponentStatus.CREATING))
    assert statuses() == ["Creating"]
    seen = store.get("ic")
    assert store.change("ic", status=ComponentStatus.IN_SERVICE)
    assert store.change("ic", copies=0)  # no status change: no event
    assert not store.change("ic", unchanged_since=seen.modified, status=ComponentStatus.FAILED)
    assert store.start_from_zero("ic")
    assert store.change("ic", status=ComponentStatus.IN_SERVICE)
    store.respecify("ic", seen.spec, {}, None)
    assert store.change("ic", status=ComponentStatus.DELETING)
    assert statuses() == ["Creating", "InService", "Updating", "InService", "Updating", "Deleting"]
    store.delete("ic")
    assert len(statuses()) == 6, "events outlive their component"
    assert all(s.event.topics == () for s in log.recent_events(50))
