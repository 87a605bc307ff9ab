"""The store's schema revision: a store at the newest one starts without Alembic, and one
behind it is brought up to it (storage/metadata.py's schema_revision)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, select
from sqlalchemy.exc import DatabaseError, IntegrityError

from shipyard.storage import metadata
from shipyard.storage import tables as t
from shipyard.storage.metadata import MetadataStore, schema_revision
from tests.conftest import python_output


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(metadata.__file__).parent / "migrations"))
    return cfg


@contextlib.contextmanager
def _at(store: MetadataStore, revision: str) -> Iterator[Connection]:
    """The store migrated up to ``revision`` only, and a transaction on it."""
    cfg = alembic_config()
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        yield conn


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        yield request.getfixturevalue("pg_schema").url


def test_the_schema_revision_is_alembics_newest_and_each_file_names_its_revision() -> None:
    scripts = ScriptDirectory.from_config(alembic_config())
    assert scripts.get_heads() == [schema_revision()]
    for script in scripts.walk_revisions():
        assert script.path is not None
        assert Path(script.path).name[:4] == script.revision, script.path


def test_a_new_store_is_migrated_to_the_schema_revision(url: str) -> None:
    store = MetadataStore(url)
    try:
        assert store.revision() is None
        store.migrate()
        assert store.revision() == schema_revision()
        store.migrate()  # again: nothing to do
        assert store.revision() == schema_revision()
    finally:
        store.close()


def test_a_store_behind_is_brought_up_to_the_schema_revision(url: str) -> None:
    store = MetadataStore(url)
    try:
        with _at(store, "0012"):
            pass
        assert store.revision() == "0012"
        assert "closed_sessions" not in set(inspect(store.engine).get_table_names())
        store.migrate()
        assert store.revision() == schema_revision()
        assert "closed_sessions" in set(inspect(store.engine).get_table_names())
    finally:
        store.close()


@pytest.mark.processes  # a fresh interpreter, as a start is
def test_a_store_at_the_schema_revision_starts_without_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    first = MetadataStore(url)
    first.migrate()
    first.close()
    code = f"""
import sys
from shipyard.storage.metadata import MetadataStore
store = MetadataStore({url!r})
store.migrate()
print(store.revision(), "alembic" in sys.modules)
"""
    assert python_output(code).split() == [schema_revision(), "False"]


def test_a_store_that_cannot_be_read_is_an_error_not_a_new_store(tmp_path: Path) -> None:
    (tmp_path / "meta.db").write_bytes(b"not a database at all" * 100)
    store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        with pytest.raises(DatabaseError):
            store.migrate()
    finally:
        store.close()


def test_names_made_before_case_counted_are_kept_and_later_ones_compared_in_any_case(
    url: str,
) -> None:
    """Migration 0016: a table whose rows already hold two names differing only in case
    keeps both (and compares as spelt); every other table refuses a second spelling."""
    store = MetadataStore(url)
    try:
        with _at(store, "0015") as conn:
            conn.execute(t.models.insert(), [_model(name) for name in ("Twin", "twin")])
            conn.execute(t.endpoint_configs.insert(), [_config("Solo")])
        store.migrate()
        assert store.revision() == schema_revision()
        with store.engine.begin() as conn:  # unindexed: a third spelling goes in
            conn.execute(t.models.insert(), [_model("TWIN")])
        with pytest.raises(IntegrityError), store.engine.begin() as conn:
            conn.execute(t.endpoint_configs.insert(), [_config("SOLO")])
    finally:
        store.close()


def _model(name: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"name": name, "arn": f"arn:{name}", "image": "i", "environment": {}, "created": now,
            "raw": {}}  # fmt: skip


def _config(name: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"name": name, "arn": f"arn:{name}", "variants": [], "created": now, "raw": {}}


def test_series_put_before_owners_were_kept_count_as_callers(url: str) -> None:
    """Migration 0022: a series in a namespace of the gateway's own (any case) stays
    the gateway's; any other was put by a caller, and counts toward the quota."""
    store = MetadataStore(url)
    spaces = ["AWS/SageMaker", "/aws/sagemaker/Endpoints", "aWs/x", "Shop", "AWSome"]
    try:
        with _at(store, "0021") as conn:
            conn.execute(
                t.metric_series.insert(),
                [{"key": f"k{n}", "namespace": ns, "name": "m", "dimensions": [],
                  "last_seen": 0} for n, ns in enumerate(spaces)],
            )  # fmt: skip
        store.migrate()
        with store.engine.connect() as conn:
            rows = conn.execute(select(t.metric_series.c.namespace, t.metric_series.c.owner))
            owners = dict(rows.all())
        assert owners == {
            "AWS/SageMaker": None,
            "/aws/sagemaker/Endpoints": None,
            "aWs/x": None,
            "Shop": "",
            "AWSome": "",
        }
    finally:
        store.close()
