"""GetMetricData over 24 h of one-minute datapoints for 100 endpoints: milliseconds per call.

    .venv/bin/python bench/cloudwatch_reads.py
    # ENDPOINTS=100 HOURS=24 CALLS=10 PG=postgresql://postgres@127.0.0.1:5432/test

The store is filled first, straight through MetricStore (as the recorder writes it): for
each of ENDPOINTS endpoints, HOURS hours of one-minute Invocations rows (one gateway, so
one row per minute and series). Then a real gateway on that store answers boto3's
``cloudwatch`` client: one GetMetricData naming every endpoint's Invocations (Sum), at
Period 60 (100 x 1,440 = 144,000 points: AWS's MaxDatapoints of 100,800 cuts it, as it
would on AWS, so MaxDatapoints is raised past it here), 300 and 3600; CALLS calls each,
the median and the best reported, after one warm-up call; and the same queries through
CloudWatchService in this process (the gateway's read, without HTTP and boto3's parsing
of every timestamp). With PG set, the same on
PostgreSQL (a schema of its own, dropped afterwards).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import entry
from tests.conftest import start_gateway

from shipyard.cloudwatch.service import CloudWatchService, MetricStat, Query
from shipyard.statsets import StatSet
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.metrics import MetricStore, Point

ENDPOINTS = int(os.environ.get("ENDPOINTS", "100"))
HOURS = int(os.environ.get("HOURS", "24"))
CALLS = int(os.environ.get("CALLS", "10"))


def fill(url: str, now: int) -> None:
    store = MetadataStore(url)
    store.migrate()
    metrics = MetricStore(store.engine)
    start = now - HOURS * 3600
    for n in range(ENDPOINTS):
        dims = (("EndpointName", f"ep-{n:03d}"), ("VariantName", "v1"))
        points = [
            Point("AWS/SageMaker", "Invocations", dims, 60, t, StatSet.of(c, c, 1.0, 1.0))
            for t, c in ((start + m * 60, float(10 + m % 7)) for m in range(HOURS * 60))
        ]
        metrics.write(points, "bench", seen=now)
    store.close()


def in_process(url: str, now: int, period: int) -> float:
    """The gateway's share: CloudWatchService.metric_data on the same store, no HTTP."""
    store = MetadataStore(url)
    service = CloudWatchService(
        store=MetricStore(store.engine), region="us-east-1", account_id="0" * 12,
        check_action=lambda arn: None, transition=lambda *a: True, retention_days=15,
    )  # fmt: skip
    queries = [
        Query(f"m{n}", stat=MetricStat("AWS/SageMaker", "Invocations",
              (("EndpointName", f"ep-{n:03d}"), ("VariantName", "v1")), period, "Sum"))
        for n in range(ENDPOINTS)
    ]  # fmt: skip
    service.metric_data(queries, now - HOURS * 3600, now)
    times = []
    for _ in range(CALLS):
        began = time.perf_counter()
        service.metric_data(queries, now - HOURS * 3600, now)
        times.append((time.perf_counter() - began) * 1000)
    store.close()
    return statistics.median(times)


def measure(gw: Any, now: int, period: int) -> tuple[float, float, int]:
    client = gw.client("cloudwatch", read_timeout=300)
    queries = [
        {
            "Id": f"m{n}",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/SageMaker",
                    "MetricName": "Invocations",
                    "Dimensions": [
                        {"Name": "EndpointName", "Value": f"ep-{n:03d}"},
                        {"Name": "VariantName", "Value": "v1"},
                    ],
                },
                "Period": period,
                "Stat": "Sum",
            },
        }
        for n in range(ENDPOINTS)
    ]

    def call() -> int:
        answer = client.get_metric_data(
            MetricDataQueries=queries,
            StartTime=now - HOURS * 3600,
            EndTime=now,
            MaxDatapoints=10_000_000,
        )
        return sum(len(r["Values"]) for r in answer["MetricDataResults"])

    points = call()
    times = []
    for _ in range(CALLS):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), min(times), points


def run(label: str, url: str | None, home: Path) -> None:
    now = int(time.time()) // 60 * 60
    home.mkdir(parents=True, exist_ok=True)
    db = url or f"sqlite:///{home / 'shipyard.db'}"
    began = time.perf_counter()
    fill(db, now)
    print(f"{label}: filled {ENDPOINTS} x {HOURS * 60} rows in {time.perf_counter() - began:.1f} s")
    gw = start_gateway(home, args=["--db", db] if url else [])
    try:
        for period in (60, 300, 3600):
            median, best, points = measure(gw, now, period)
            inside = in_process(db, now, period)
            print(
                f"{label}: Period {period:>4}: {points:>7} points, boto3 median {median:7.1f} ms "
                f"(best {best:7.1f}), the gateway's read alone {inside:6.1f} ms"
            )
    finally:
        gw.stop()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        run("sqlite", None, Path(tmp) / "sqlite")
    pg = os.environ.get("PG")
    if pg:
        import sqlalchemy

        schema = f"bench_{uuid.uuid4().hex[:8]}"
        admin = sqlalchemy.create_engine(pg.replace("postgresql://", "postgresql+psycopg://"))
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                run("postgresql", f"{pg}?options=-csearch_path%3D{schema}", Path(tmp) / "pg")
        finally:
            with admin.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
            admin.dispose()
    return 0


if __name__ == "__main__":
    entry(main)
