"""Shared secrets (storage/secrets.py): made once per store, the same for every gateway,
also when several ask for the first time at once; on SQLite and on PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shipyard.storage.metadata import MetadataStore
from shipyard.storage.secrets import shared_secret


def _stores(url: str, n: int) -> list[MetadataStore]:
    stores = [MetadataStore(url) for _ in range(n)]
    stores[0].migrate()
    return stores


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_every_gateway_of_a_store_reads_one_key_made_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
    else:
        url = request.getfixturevalue("pg_schema").url
    stores = _stores(url, 4)
    try:
        with ThreadPoolExecutor(4) as pool:  # four gateways asking first, at once
            keys = list(pool.map(lambda s: shared_secret(s.engine, "sessions"), stores))
        assert len(set(keys)) == 1 and len(keys[0]) == 32
        assert shared_secret(stores[0].engine, "sessions") == keys[0]  # and later
        assert shared_secret(stores[1].engine, "other") not in (keys[0], b"")
        fresh = MetadataStore(f"sqlite:///{tmp_path / 'other.db'}")
        fresh.migrate()
        assert shared_secret(fresh.engine, "sessions") != keys[0]  # another store's own
        fresh.close()
    finally:
        for store in stores:
            store.close()
