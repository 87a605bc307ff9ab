"""MetricStore on SQLite and, where it runs, PostgreSQL: datapoints merged per source and
added up across sources, series listed by when they were seen, old rows purged, and an
alarm's state, history and event written together."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from shipyard.cloudwatch.alarms import AlarmActions
from shipyard.errors import LimitExceeded
from shipyard.records import Event
from shipyard.statsets import StatSet
from shipyard.storage import tables as t
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.metrics import Alarm, HistoryItem, MetricStore, Point, Quota, stats_of

DIMS = (("EndpointName", "e"), ("VariantName", "v1"))


@pytest.fixture
def store(meta: MetadataStore) -> MetricStore:
    return MetricStore(meta.engine)


def latency(*values: float) -> StatSet:
    stats = StatSet()
    for value in values:
        stats.observe(value)
    return stats


def test_a_period_written_in_parts_and_by_two_sources_reads_as_one(store: MetricStore) -> None:
    point = Point("AWS/SageMaker", "ModelLatency", DIMS, 60, 600, latency(10, 20))
    store.write([point], "gw-a", seen=600)
    store.write(
        [Point("AWS/SageMaker", "ModelLatency", DIMS, 60, 600, latency(30))], "gw-a", seen=610
    )
    store.write(
        [Point("AWS/SageMaker", "ModelLatency", DIMS, 60, 600, latency(5, 40))], "gw-b", seen=620
    )
    store.write(
        [Point("AWS/SageMaker", "ModelLatency", DIMS, 60, 660, latency(7))], "gw-a", seen=660
    )
    series = store.find("AWS/SageMaker", "ModelLatency", DIMS)
    assert series is not None
    rows = store.read([series.id], 60, 0, 10_000, distributions=True)[series.id]
    first = StatSet.of(0, 0.0, float("inf"), float("-inf"))
    first.hist = {}
    for row in rows:
        if row[0] == 600:
            first.add(stats_of(row))  # the two gateways' rows
    assert (first.count, first.sum, first.min, first.max) == (5, 105, 5, 40)
    assert first.value("p50") == pytest.approx(20, rel=0.05)
    assert sorted(r[0] for r in rows) == [600, 600, 660]
    assert [r[0] for r in store.read([series.id], 60, 0, 660)[series.id]] == [600, 600]
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(t.metric_points)).scalar() == 3


def test_concurrent_writers_of_one_row_lose_nothing(store: MetricStore) -> None:
    point = Point("Mine", "m", (), 60, 600, StatSet.of(1, 1.0, 1.0, 1.0))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: store.write([point], "put", seen=600), range(40)))
    series = store.find("Mine", "m", ())
    assert series is not None
    assert store.aggregate([series.id], 60, 0, 10_000, 60)[series.id][600][0] == 40


def test_series_are_listed_by_namespace_name_and_when_seen(store: MetricStore) -> None:
    store.write([Point("Mine", "a", (), 60, 0, latency(1))], "put", seen=100)
    store.write([Point("Mine", "b", (("K", "v"),), 60, 0, latency(1))], "put", seen=5000)
    assert [s.name for s in store.list_series(namespace="Mine")] == ["a", "b"]
    assert [s.dimensions for s in store.list_series(namespace="Mine", since=1000)] == [
        (("K", "v"),)
    ]
    assert store.list_series(namespace="Other") == []
    assert store.purge(period=60, before=1) == 2
    assert store.find("Mine", "a", ()) is not None  # the series stays; its rows are gone


def test_an_alarms_state_history_and_event_are_written_together(store: MetricStore) -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    alarm = Alarm("a", "arn:a", {"Threshold": 1.0}, "INSUFFICIENT_DATA", "new", None, when, when)
    store.put_alarm(alarm, HistoryItem("a", when, "ConfigurationUpdate", "created", "{}"))
    event = Event(
        key="alarm:a:1", detail_type="CloudWatch Alarm State Change", source="aws.cloudwatch",
        resource="arn:a", detail={}, topics=("ops",), subject="ALARM", message="{}", time=when,
    )  # fmt: skip
    history = HistoryItem("a", when, "StateUpdate", "to ALARM", json.dumps({}))
    kwargs = {
        "state": "ALARM",
        "reason": "r",
        "reason_data": "{}",
        "when": when,
        "history": history,
    }
    assert store.change_state("a", event=event, expected="INSUFFICIENT_DATA", **kwargs)  # type: ignore[arg-type]
    # A second evaluator that read the old state changes nothing.
    assert not store.change_state("a", event=None, expected="INSUFFICIENT_DATA", **kwargs)  # type: ignore[arg-type]
    found = store.get_alarm("a")
    assert found is not None and found.state == "ALARM"
    types = [h.item_type for h in store.history(alarm="a", item_type=None, start=None, end=None,
                                                newest_first=False)]  # fmt: skip
    assert types == ["ConfigurationUpdate", "StateUpdate"]
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(t.events)).scalar() == 1
    store.delete_alarms(["a"])
    assert store.get_alarm("a") is None
    # CloudWatch keeps a deleted alarm's history, until it is two weeks old.
    kept = store.history(alarm="a", item_type=None, start=None, end=None, newest_first=True)
    assert len(kept) == 2
    assert store.purge_history(before=datetime(2026, 1, 2, tzinfo=UTC)) == 2


def test_rows_are_added_up_into_buckets_in_the_database(store: MetricStore) -> None:
    points = [
        Point("Mine", "m", (), 60, at, StatSet.of(2, 2.0 * at, float(at), float(at) + 1))
        for at in range(0, 600, 60)
    ]
    store.write(points, "gw-a", seen=0)
    store.write(points[:2], "gw-b", seen=0)
    series = store.find("Mine", "m", ())
    assert series is not None
    hours = store.aggregate([series.id], 60, 0, 600, 300)[series.id]
    # 0-240 (5 rows, two of them twice) and 300-540 (5 rows)
    assert hours == {0: (14, 2 * (0 + 60 + 120 + 180 + 240 + 0 + 60), 0, 241),
                     300: (10, 2 * (300 + 360 + 420 + 480 + 540), 300, 541)}  # fmt: skip
    minutes = store.aggregate([series.id], 60, 0, 120, 60)[series.id]
    assert minutes == {0: (4, 0, 0, 1), 60: (4, 240, 60, 61)}


def test_a_series_written_with_no_unit_takes_the_first_one_given(store: MetricStore) -> None:
    """A series an older gateway recorded without units (or a metric put without one)
    takes the unit given later, here and in another writer's store alike; a unit once
    given stays."""

    def point(unit: str | None) -> Point:
        return Point("AWS/SageMaker", "ModelLatency", DIMS, 60, 600, latency(10), unit)

    store.write([point(None)], "old", seen=600)
    assert store.find("AWS/SageMaker", "ModelLatency", DIMS).unit is None  # type: ignore[union-attr]
    other = MetricStore(store.engine)  # a gateway that upgraded: knows the series' id
    other.write([point(None)], "new", seen=610)
    other.write([point("Microseconds")], "new", seen=620)
    assert store.find("AWS/SageMaker", "ModelLatency", DIMS).unit == "Microseconds"  # type: ignore[union-attr]
    store.write([point("Milliseconds")], "old", seen=630)
    assert store.find("AWS/SageMaker", "ModelLatency", DIMS).unit == "Microseconds"  # type: ignore[union-attr]


def test_series_not_written_within_the_retention_are_purged_and_their_ids_forgotten(
    store: MetricStore,
) -> None:
    day = 86_400
    old = Point("Shop", "Orders", (), 60, 0, latency(1))
    store.write([old], "put", seen=0, owner="k")
    store.write([Point("Shop", "Fresh", (), 60, 2 * day, latency(1))], "put", seen=2 * day)
    gone = store.find("Shop", "Orders", ())
    assert gone is not None
    # Written an hour before the cutoff at the latest ("last_seen" is written hourly).
    assert store.purge_series(before=day) == 1
    assert store.find("Shop", "Orders", ()) is None
    assert store.find("Shop", "Fresh", ()) is not None
    assert store.read([gone.id], 60, 0, 10 * day)[gone.id] == []
    # Put again, it is a new series: not rows under the id this store had cached.
    store.write([Point("Shop", "Orders", (), 60, 2 * day, latency(5))], "put", seen=2 * day)
    again = store.find("Shop", "Orders", ())
    assert again is not None and again.id != gone.id
    assert [r[1:3] for r in store.read([again.id], 60, 0, 10 * day)[again.id]] == [(1, 5)]


def test_an_id_another_gateway_purged_is_read_anew(store: MetricStore) -> None:
    point = Point("AWS/SageMaker", "Invocations", DIMS, 60, 0, latency(1))
    store.write([point], "gw-a", seen=0)
    other = MetricStore(store.engine)  # another gateway, its hourly sweep
    day = 86_400
    assert other.purge_series(before=day) == 1
    later = Point("AWS/SageMaker", "Invocations", DIMS, 60, day, latency(2))
    store.write([later], "gw-a", seen=day)
    series = store.find("AWS/SageMaker", "Invocations", DIMS)
    assert series is not None
    assert [r[0] for r in store.read([series.id], 60, 0, 2 * day)[series.id]] == [day]


def test_callers_series_are_bounded_in_all_and_per_key(store: MetricStore) -> None:
    quota = Quota(total=3, per_owner=2)

    def put(owner: str, *names: str) -> None:
        points = [Point("Shop", n, (), 60, 600, latency(1)) for n in names]
        store.write(points, "put", seen=600, owner=owner, quota=quota)

    put("a", "a1", "a2")
    with pytest.raises(LimitExceeded):
        put("a", "a1", "a3")  # one new series too many: nothing of the write is kept
    a1 = store.find("Shop", "a1", ())
    assert a1 is not None
    assert store.aggregate([a1.id], 60, 0, 10_000, 60)[a1.id][600][0] == 1
    assert store.find("Shop", "a3", ()) is None
    put("b", "b1")
    with pytest.raises(LimitExceeded):
        put("b", "b2")  # three in all
    # The gateway's own series are not callers': not counted, never refused.
    store.write([Point("AWS/SageMaker", "Invocations", DIMS, 60, 600, latency(1))], "gw", seen=600)
    assert store.find("AWS/SageMaker", "Invocations", DIMS) is not None


@pytest.mark.parametrize("quota", [Quota(total=4, per_owner=None), Quota(total=100, per_owner=4)])
def test_alarms_put_at_once_never_pass_their_quota(store: MetricStore, quota: Quota) -> None:
    """Each put counts, then inserts: on PostgreSQL without a lock between them, puts
    running at once all counted the same alarms and all went in."""
    when = datetime(2026, 1, 1, tzinfo=UTC)
    threads = 12
    ready = threading.Barrier(threads)

    def put(n: int) -> bool:
        alarm = Alarm(f"a{n}", f"arn:a{n}", {}, "INSUFFICIENT_DATA", "new", None, when, when)
        ready.wait()
        try:
            store.put_alarm(
                alarm,
                HistoryItem(f"a{n}", when, "ConfigurationUpdate", "created", "{}"),
                owner="key",
                quota=quota,
            )
        except LimitExceeded:
            return False
        return True

    for _ in range(3):  # a few rounds, each from an emptied table
        store.delete_alarms([a.name for a in store.list_alarms()])
        with ThreadPoolExecutor(threads) as pool:
            created = sum(pool.map(put, range(threads)))
        assert created == len(store.list_alarms()) == 4


def _events(store: MetricStore) -> list[tuple[str, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r.topics) for r in conn.execute(select(t.events).order_by(t.events.c.id))]


def test_a_transition_decided_on_an_alarm_since_configured_again_is_not_written(
    store: MetricStore,
) -> None:
    """An evaluation pass read the alarm with the old topic; PutMetricAlarm then gave it
    a new one. The pass's transition must not be written with an event for the old
    topic (the new one would never hear of the change): it is refused, and the next
    pass, on the alarm as it is, tells the new topic."""
    first = datetime(2026, 1, 1, tzinfo=UTC)
    old = Alarm("a", "arn:a", {"Threshold": 1.0, "AlarmActions": [OLD]}, "INSUFFICIENT_DATA",
                "new", None, first, first)  # fmt: skip
    store.put_alarm(old, HistoryItem("a", first, "ConfigurationUpdate", "created", "{}"))
    stale = store.get_alarm("a")
    assert stale is not None
    later = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    new = Alarm("a", "arn:a", {"Threshold": 1.0, "AlarmActions": [NEW]}, "INSUFFICIENT_DATA",
                "new", None, first, later)  # fmt: skip
    store.put_alarm(new, HistoryItem("a", later, "ConfigurationUpdate", "updated", "{}"))
    actions = AlarmActions(store=store, region="us-east-1", account_id="123456789012",
                           run_policy=_no_policy, on_event=lambda: None)  # fmt: skip
    assert not actions.transition(stale, "ALARM", "breached", None, when=later)
    assert _events(store) == []
    fresh = store.get_alarm("a")
    assert fresh is not None and fresh.state == "INSUFFICIENT_DATA"
    assert actions.transition(fresh, "ALARM", "breached", None, when=later)
    assert _events(store) == [(NEW,)]


def test_configuring_an_alarm_again_keeps_the_state_it_has_now(store: MetricStore) -> None:
    """PutMetricAlarm on an existing alarm read its state, then wrote it back: a
    transition made in between was undone (its notification sent, for a state the
    alarm no longer had, and sent again at the next breach)."""
    first = datetime(2026, 1, 1, tzinfo=UTC)
    alarm = Alarm("a", "arn:a", {"Threshold": 1.0, "AlarmActions": [OLD]}, "INSUFFICIENT_DATA",
                  "new", None, first, first)  # fmt: skip
    store.put_alarm(alarm, HistoryItem("a", first, "ConfigurationUpdate", "created", "{}"))
    read_by_put = store.get_alarm("a")
    assert read_by_put is not None
    actions = AlarmActions(store=store, region="us-east-1", account_id="123456789012",
                           run_policy=_no_policy, on_event=lambda: None)  # fmt: skip
    assert actions.transition(read_by_put, "ALARM", "breached", None, when=first)
    later = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    store.put_alarm(
        Alarm("a", "arn:a", {"Threshold": 2.0, "AlarmActions": [OLD]}, read_by_put.state,
              read_by_put.reason, None, read_by_put.state_updated, later),
        HistoryItem("a", later, "ConfigurationUpdate", "updated", "{}"),
    )  # fmt: skip
    found = store.get_alarm("a")
    assert found is not None
    assert (found.state, found.config["Threshold"]) == ("ALARM", 2.0)


OLD = "arn:aws:sns:us-east-1:123456789012:old"
NEW = "arn:aws:sns:us-east-1:123456789012:new"


def _no_policy(arn: str, alarm: str, state: str, value: float | None, threshold: float) -> str:
    raise AssertionError(f"no policy action expected, got {arn}")
