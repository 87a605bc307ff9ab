"""Every store test runs on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shipyard.storage.metadata import MetadataStore


@pytest.fixture(params=["sqlite", "postgresql"])
def meta(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    """A migrated metadata store on a fresh database of each kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    store = MetadataStore(url)
    store.migrate()
    yield store
    store.close()
