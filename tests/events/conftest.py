"""Fixtures for the event system: real stores (SQLite and PostgreSQL) and a clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shipyard.records import Event
from shipyard.storage.events import Delivery, DeliveryStatus, subscriber_key
from shipyard.storage.metadata import MetadataStore


@pytest.fixture(params=["sqlite", "postgresql"])
def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], MetadataStore]]:
    """Opens stores on one fresh, migrated database; each call is one more "gateway"."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
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
