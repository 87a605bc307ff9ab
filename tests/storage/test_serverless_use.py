"""ServerlessUseStore on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

from shipyard.storage.metadata import MetadataStore
from shipyard.storage.serverless_use import ServerlessUseStore, Use


def test_each_write_moves_a_gateways_row_on_and_others_read_it(meta: MetadataStore) -> None:
    a = ServerlessUseStore(meta.engine, gateway="a")
    b = ServerlessUseStore(meta.engine, gateway="b")
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    a.note({("e", "v1"): 2, ("other", "v1"): 1})
    b.note({("e", "v1"): 0})
    a.note({("e", "v1"): 0})
    assert sorted(holder.read(["e"]), key=lambda u: u.gateway) == [
        Use("e", "v1", "a", 0, 2),
        Use("e", "v1", "b", 0, 1),
    ]
    assert a.read(["e", "other"]) == [Use("e", "v1", "b", 0, 1)], "its own rows are not read"
    a.note({})  # nothing to write
    assert holder.read(["nothing"]) == []
