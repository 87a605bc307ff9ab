"""ScalingStore on SQLite and, where it runs, PostgreSQL: targets, policies, and
activities written in the same transaction as the endpoint change they describe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import func, select

from shipyard.errors import InvalidParameter
from shipyard.records import (
    ActivityStatus,
    Endpoint,
    EndpointStatus,
    Event,
    ScalableTarget,
    ScalingActivity,
    ScalingPolicy,
    VariantState,
)
from shipyard.storage import tables as t
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.scaling import ScalingStore, parse_resource_id, resource_id

RID = resource_id("e", "v1")


@pytest.fixture
def stores(meta: MetadataStore) -> tuple[MetadataStore, ScalingStore]:
    return meta, ScalingStore(meta.engine)


def _target(**changes: object) -> ScalableTarget:
    base = ScalableTarget(RID, "e", "v1", "arn:t", 1, 3, "arn:role", now(), {})
    return replace(base, **changes)  # type: ignore[arg-type]


def _activity(activity_id: str = "a1", to: int = 2) -> ScalingActivity:
    return ScalingActivity(
        activity_id=activity_id,
        resource_id=RID,
        description=f"Setting desired instance count to {to}.",
        cause="test",
        started=now(),
        status=ActivityStatus.IN_PROGRESS,
        from_count=1,
        to_count=to,
    )


def _event(key: str) -> Event:
    return Event(key, "Scaling", "test", "arn:t", {}, (), "s", "m", now())


def _endpoint() -> Endpoint:
    stamp = now()
    return Endpoint(
        "e", "arn:e", "c", EndpointStatus.IN_SERVICE, None, stamp, stamp,
        (VariantState("v1", 1.0, 1),),
    )  # fmt: skip


def _events(meta: MetadataStore) -> int:
    with meta.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t.events)).scalar_one())


def test_resource_ids_round_trip() -> None:
    assert parse_resource_id(RID) == ("e", "v1")
    for bad in ("endpoint/e", "endpoint//variant/v", "service/e/variant/v", "endpoint/e/x/v"):
        assert parse_resource_id(bad) is None


def test_targets_and_policies_are_replaced_in_place(
    stores: tuple[MetadataStore, ScalingStore],
) -> None:
    _, store = stores
    store.put_target(_target())
    store.put_target(_target(max_capacity=5, suspended={"DynamicScalingInSuspended": True}))
    (target,) = store.list_targets()
    assert target.max_capacity == 5 and target.suspended == {"DynamicScalingInSuspended": True}
    assert store.get_target(RID) == target and store.get_target("endpoint/x/variant/y") is None

    first = ScalingPolicy("p", RID, "arn:p1", "TargetTrackingScaling", {"TargetValue": 1.0}, now())
    store.put_policy(first)
    again = store.put_policy(replace(first, arn="arn:p2", config={"TargetValue": 2.0}))
    assert again.arn == "arn:p1" and again.config == {"TargetValue": 2.0}
    assert [p.config for p in store.list_policies(RID)] == [{"TargetValue": 2.0}]

    assert store.delete_target(RID) is True
    assert store.list_policies() == [] and store.delete_target(RID) is False


def test_a_step_and_its_activity_commit_or_roll_back_together(
    stores: tuple[MetadataStore, ScalingStore],
) -> None:
    meta, store = stores
    meta.create_endpoint(_endpoint(), max_endpoints=5)
    activity = _activity()

    def record_then_fail(conn: object) -> None:
        store.start_activity(conn, activity)  # type: ignore[arg-type]
        raise InvalidParameter("refused after the activity was written")

    with pytest.raises(InvalidParameter):
        meta.change_endpoint("e", variants=(VariantState("v1", 1.0, 2),), also=record_then_fail)
    assert meta.get_endpoint("e").variants[0].desired_instance_count == 1
    assert store.list_activities() == []

    meta.change_endpoint(
        "e",
        variants=(VariantState("v1", 1.0, 2),),
        also=lambda conn: store.start_activity(conn, activity),
    )
    assert meta.get_endpoint("e").variants[0].desired_instance_count == 2
    assert [a.activity_id for a in store.open_activities()] == ["a1"]


def test_an_activity_ends_once_with_one_event(stores: tuple[MetadataStore, ScalingStore]) -> None:
    meta, store = stores
    store.record_activity(_activity("a1"))
    store.record_activity(_activity("a2", to=3))
    before = _events(meta)
    for _ in range(2):  # a second finisher changes nothing and announces nothing
        store.finish_activity(
            "a1", status=ActivityStatus.SUCCESSFUL, message="done", ended=now(),
            event=_event("scaling-activity:a1"),
        )  # fmt: skip
    assert _events(meta) == before + 1
    newest_first = store.list_activities(RID)
    assert [a.activity_id for a in newest_first] == ["a2", "a1"]
    assert newest_first[1].status is ActivityStatus.SUCCESSFUL and newest_first[1].ended
    assert [a.activity_id for a in store.open_activities()] == ["a2"]
    assert set(store.last_activity_times()) == {RID}
