"""The autoscaler's view of requests other gateways routed: read from the CloudWatch rows
they recorded in the shared store (SQLite here, PostgreSQL where it runs), their own
rows and rows not yet finished left out, added to what this gateway counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from shipyard.autoscaling.autoscaler import MetricReader
from shipyard.metrics import Metrics
from shipyard.routing.router import Router
from shipyard.statsets import StatSet
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.metrics import MetricStore, Point

VARIANT = (("EndpointName", "e"), ("VariantName", "v1"))
COMPONENT = (("InferenceComponentName", "c1"),)
AT = 10_013.0
"""Reading at this time, 12 s (a recorder's tick and two seconds) after 10,000: the last
row every gateway has written whole starts at 9,990."""


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetricStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    meta = MetadataStore(url)
    meta.migrate()
    yield MetricStore(meta.engine)
    meta.close()


def reader(store: MetricStore | None) -> MetricReader:
    return MetricReader(
        metrics=Metrics(),
        router=Router(timeout_s=5.0),
        healthy=lambda endpoint: {"v1": 2, "c1": 1},
        backlogs={},
        window_s=20.0,
        period_s=5.0,
        metric_store=store,
        source="me",
    )


def calls(dims: tuple[tuple[str, str], ...], start: int, n: float) -> Point:
    return Point("AWS/SageMaker", "Invocations", dims, 10, start, StatSet.of(n, n, 1.0, 1.0))


def level(name: str, dims: tuple[tuple[str, str], ...], start: int, *values: float) -> Point:
    stats = StatSet()
    for value in values:
        stats.observe(value)
    return Point("AWS/SageMaker", name, dims, 10, start, stats)


def test_the_other_gateways_finished_rows_are_added_to_this_ones_counts(
    store: MetricStore,
) -> None:
    store.write([calls(VARIANT, 9980, 30), calls(VARIANT, 9990, 30)], "gw-b", seen=9995)
    store.write([calls(VARIANT, 9990, 60)], "gw-c", seen=9995)
    store.write([calls(VARIANT, 9990, 1000)], "me", seen=9995)  # counted in memory
    store.write([calls(VARIANT, 10_000, 500)], "gw-b", seen=10_004)  # not finished
    store.write([calls(VARIANT, 9970, 999)], "gw-b", seen=9975)  # before the window
    per_model = "ConcurrentRequestsPerModel"
    store.write([level(per_model, VARIANT, 9990, 1.0, 3.0)], "gw-b", seen=9995)
    store.write([level(per_model, VARIANT, 9990, 0.5)], "gw-c", seen=9995)
    store.write([level(per_model, VARIANT, 9980, 40.0)], "gw-c", seen=9985)  # an older period
    store.write([level(per_model, VARIANT, 9990, 10.0)], "me", seen=9995)
    store.write([calls(COMPONENT, 9990, 12)], "gw-b", seen=9995)

    seen = reader(store)
    seen.elsewhere = seen.read_elsewhere([("e", "v1", False), ("e", "c1", True)], AT)

    # (30 + 30 + 60) over 20 s is 360 a minute, over two healthy instances.
    assert seen.value("Invocations", "e", "v1") == pytest.approx(360.0)
    assert seen.value("InvocationsPerInstance", "e", "v1") == pytest.approx(180.0)
    # Each gateway's mean per instance over the period (2.0 and 0.5), added up.
    assert seen.value("ConcurrentRequestsPerModel", "e", "v1") == pytest.approx(2.5)
    assert seen.value("InvocationsPerCopy", "e", "c1") == pytest.approx(12 / 20 * 60)
    assert seen.value("ConcurrentRequestsPerCopy", "e", "c1") is None


def test_a_single_gateway_or_none_recorded_elsewhere_reads_nothing_extra(
    store: MetricStore,
) -> None:
    store.write([calls(VARIANT, 9990, 1000)], "me", seen=9995)
    seen = reader(store)
    assert seen.read_elsewhere([("e", "v1", False)], AT) == {}
    assert seen.value("InvocationsPerInstance", "e", "v1") is None
    assert reader(None).read_elsewhere([("e", "v1", False)], AT) == {}


def test_a_row_whose_period_ended_less_than_a_tick_and_two_seconds_ago_waits(
    store: MetricStore,
) -> None:
    """A recorder writes a period's row after its tick and its reads of the instances: read
    sooner, a row half written would look like a fall in traffic."""
    store.write([calls(VARIANT, 9980, 30), calls(VARIANT, 9990, 60)], "gw-b", seen=9995)
    seen = reader(store)
    seen.elsewhere = seen.read_elsewhere([("e", "v1", False)], AT - 1.5)
    assert seen.value("Invocations", "e", "v1") == pytest.approx(30 / 20 * 60)
    seen.elsewhere = seen.read_elsewhere([("e", "v1", False)], AT)
    assert seen.value("Invocations", "e", "v1") == pytest.approx(90 / 20 * 60)


def test_a_store_that_cannot_be_read_gives_no_reading_rather_than_none_elsewhere(
    tmp_path: Path,
) -> None:
    """None, not an empty reading: the autoscaler keeps the last one for the pass."""
    unmigrated = MetricStore(create_engine(f"sqlite:///{tmp_path / 'empty.db'}"))
    assert reader(unmigrated).read_elsewhere([("e", "v1", False)], AT) is None
