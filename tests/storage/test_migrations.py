"""The store's schema revision: a store at the newest one starts without Alembic, and one
behind it is brought up to it (storage/metadata.py's SCHEMA_REVISION)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from shipyard.storage import metadata
from shipyard.storage.metadata import SCHEMA_REVISION, MetadataStore


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(metadata.__file__).parent / "migrations"))
    return cfg


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        yield request.getfixturevalue("pg_schema").url


def test_the_schema_revision_is_alembics_newest() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert heads == [SCHEMA_REVISION]


def test_a_new_store_is_migrated_to_the_schema_revision(url: str) -> None:
    store = MetadataStore(url)
    try:
        assert store.revision() is None
        store.migrate()
        assert store.revision() == SCHEMA_REVISION
        store.migrate()  # again: nothing to do
        assert store.revision() == SCHEMA_REVISION
    finally:
        store.close()


def test_a_store_behind_is_brought_up_to_the_schema_revision(url: str) -> None:
    store = MetadataStore(url)
    try:
        cfg = alembic_config()
        with store.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0012")
        assert store.revision() == "0012"
        assert "closed_sessions" not in set(inspect(store.engine).get_table_names())
        store.migrate()
        assert store.revision() == SCHEMA_REVISION
        assert "closed_sessions" in set(inspect(store.engine).get_table_names())
    finally:
        store.close()


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
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [SCHEMA_REVISION, "False"]
