"""Fixtures for the event system: real stores (SQLite and PostgreSQL) and a clock."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy

from shipyard.records import Event
from shipyard.storage.events import Delivery, DeliveryStatus, subscriber_key
from shipyard.storage.metadata import MetadataStore
from tests.conftest import PG_URL


def _pg_available() -> bool:
    try:
        engine = sqlalchemy.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(params=["sqlite", "postgresql"])
def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], MetadataStore]]:
    """Opens stores on one fresh, migrated database; each call is one more "gateway"."""
    admin = None
    schema = ""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        if not _pg_available():
            pytest.skip(f"PostgreSQL is not reachable at {PG_URL}")
        schema = f"t_{uuid.uuid4().hex[:10]}"
        admin = sqlalchemy.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"))
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
        url = f"{PG_URL}?options=-csearch_path%3D{schema}"
    opened: list[MetadataStore] = []

    def open_store() -> MetadataStore:
        store = MetadataStore(url)
        if not opened:
            store.migrate()
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()
    if admin is not None:
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture
def store(store_factory: Callable[[], MetadataStore]) -> MetadataStore:
    return store_factory()


class FakeClock:
    """A clock that moves only when told to; starts at the real time."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_event(
    key: str = "job/a/Completed", *, topics: tuple[str, ...] = (), time: datetime | None = None
) -> Event:
    return Event(
        key=key,
        detail_type="SageMaker Training Job State Change",
        source="shipyard.jobs",
        resource="arn:aws:sagemaker:us-east-1:123456789012:training-job/a",
        detail={"TrainingJobName": "a", "TrainingJobStatus": "Completed"},
        topics=topics,
        subject=f"Job {key} completed",
        message=f"Job {key} completed in 3 s; output at file:///out/a.",
        time=time or datetime.now(UTC),
    )


def sending_row(event_key: str, url: str, *, at: datetime) -> Delivery:
    """The row a dispatcher commits right before it sends to ``url``."""
    return Delivery(
        event_key=event_key,
        subscriber=subscriber_key(url),
        target=url,
        topic="",
        status=DeliveryStatus.SENDING,
        attempts=1,
        last_error=None,
        updated=at,
    )
