"""TransformStore on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from shipyard.errors import InvalidParameter, ResourceInUse, ResourceNotFound
from shipyard.records import Event, JobStatus, TransformJob
from shipyard.storage import tables as t
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.transform_jobs import TransformStore


@pytest.fixture
def stores(meta: MetadataStore) -> tuple[MetadataStore, TransformStore]:
    return meta, TransformStore(meta.engine)


def _job(name: str = "j") -> TransformJob:
    stamp = now()
    return TransformJob(name, f"arn:transform-job/{name}", JobStatus.IN_PROGRESS, {"A": 1},
                        stamp, stamp)  # fmt: skip


def _event(job: TransformJob, previous: TransformJob | None) -> Event:
    return Event(f"{job.arn}#{job.status}", "t", "s", job.arn, {}, (), "s", "m", now())


def _events(meta: MetadataStore) -> int:
    with meta.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t.events)).scalar_one())


def test_jobs_are_created_once_and_move_by_their_transitions(
    stores: tuple[MetadataStore, TransformStore],
) -> None:
    meta, store = stores
    store.create(_job(), event_for=_event)
    with pytest.raises(ResourceInUse, match="already exists"):
        store.create(_job(), event_for=_event)
    assert _events(meta) == 1
    with pytest.raises(ResourceNotFound, match="Could not find requested job with name x"):
        store.get("x")
    store.change("j", objects_total=3)
    stopping = store.change("j", expect=[JobStatus.IN_PROGRESS], status=JobStatus.STOPPING,
                            event_for=_event)  # fmt: skip
    assert stopping.status is JobStatus.STOPPING and stopping.objects_total == 3
    assert _events(meta) == 2
    with pytest.raises(InvalidParameter, match="is in status Stopping"):
        store.change("j", expect=[JobStatus.IN_PROGRESS], status=JobStatus.STOPPING)
    store.change("j", status=JobStatus.STOPPED, ended=now())
    with pytest.raises(InvalidParameter, match="cannot go from Stopped to InProgress"):
        store.change("j", status=JobStatus.IN_PROGRESS)
    assert store.list(active_only=True) == []
    assert [j.name for j in store.list()] == ["j"]


def test_finished_objects_count_once_toward_progress(
    stores: tuple[MetadataStore, TransformStore],
) -> None:
    _, store = stores
    store.create(_job(), event_for=lambda job, previous: None)
    store.finish_object("j", "a.csv", 10)
    store.finish_object("j", "a.csv", 10)  # a resumed run that finished it again
    store.finish_object("j", "sub/b.csv", 5)
    assert store.finished_objects("j") == {"a.csv": 10, "sub/b.csv": 5}
    job = store.get("j")
    assert (job.objects_done, job.records_done) == (2, 15)
    assert store.finished_objects("other") == {}
