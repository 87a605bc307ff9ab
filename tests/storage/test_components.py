"""ComponentStore on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

import pytest

from shipyard.records import ComponentSpec, ComponentStatus, InferenceComponent
from shipyard.storage.components import ComponentStore
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
