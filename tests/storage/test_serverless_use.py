"""ServerlessUseStore on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

from shipyard.storage.metadata import MetadataStore
from shipyard.storage.serverless_use import ServerlessUseStore, Use


def test_each_write_moves_a_gateways_row_on_and_others_read_it(meta: MetadataStore) -> None:
    a = ServerlessUseStore(meta.engine, gateway="a")
    b = ServerlessUseStore(meta.engine, gateway="b")
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    a.note({("e", "v1"): 2, ("other", "v1"): 1})
    b.note({("e", "v1"): 0}, {("e", "v1"): {"i-2", "i-1"}, ("e", "v2"): {"i-3"}})
    a.note({("e", "v1"): 0}, {("e", "v1"): ["i-1"]})
    assert sorted(holder.read(["e"]), key=lambda u: u.gateway) == [
        Use("e", "v1", "a", 0, 2, used=["i-1"]),
        Use("e", "v1", "b", 0, 1, used=["i-1", "i-2"]),
    ]
    assert a.read(["e", "other"]) == [Use("e", "v1", "b", 0, 1, used=["i-1", "i-2"])], (
        "its own rows are not read"
    )
    a.note({("e", "v1"): 1})  # a request waits: it was on no instance
    assert [u.used for u in holder.read(["e"]) if u.gateway == "a"] == [[]]
    a.note({})  # nothing to write
    assert holder.read(["nothing"]) == []


def test_what_gateways_said_goes_with_its_endpoint(meta: MetadataStore) -> None:
    from tests.storage.test_metadata import _endpoint

    meta.create_endpoint(_endpoint("e"), max_endpoints=10)
    meta.create_endpoint(_endpoint("kept"), max_endpoints=10)
    a = ServerlessUseStore(meta.engine, gateway="a")
    a.note({("e", "v1"): 1, ("kept", "v1"): 1})
    meta.delete_endpoint("e")
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    assert holder.read(["e", "kept"]) == [Use("kept", "v1", "a", 1, 1, used=[])]


def test_uses_wrap_well_within_the_column(meta: MetadataStore) -> None:
    from sqlalchemy import update

    from shipyard.storage import tables as t

    a = ServerlessUseStore(meta.engine, gateway="a")
    a.note({("e", "v1"): 0})
    with meta.engine.begin() as conn:
        conn.execute(update(t.serverless_use).values(uses=999_999_999))
    seen = []
    for _ in range(3):
        a.note({("e", "v1"): 0})
        seen.append(ServerlessUseStore(meta.engine, gateway="b").read(["e"])[0].uses)
    assert seen == [1_000_000_000, 1, 2]


def test_a_failed_cold_start_is_written_on_the_rows_it_was_for_and_read_back(
    meta: MetadataStore,
) -> None:
    a = ServerlessUseStore(meta.engine, gateway="a")
    b = ServerlessUseStore(meta.engine, gateway="b")
    holder = ServerlessUseStore(meta.engine, gateway="holder")
    assert a.note({("e", "v1"): 1}) == {("e", "v1"): Use("e", "v1", "a", 1, 1, used=[])}
    b.note({("e", "v1"): 1, ("e", "v2"): 1})
    seen = {(u.endpoint, u.variant, u.gateway): u.uses for u in holder.read(["e"])}
    a.note({("e", "v1"): 2})  # asked again after the holder read
    holder.fail({k: u for k, u in seen.items() if k[1] == "v1"}, "the weights are gone")
    holder.fail({}, "nothing")  # nothing to write
    assert a.note({("e", "v1"): 0}) == {
        ("e", "v1"): Use(
            "e", "v1", "a", 0, 3, failed_uses=1, failure="the weights are gone", used=[]
        )
    }
    written = b.note({("e", "v1"): 0, ("e", "v2"): 0})
    assert written[("e", "v1")].failed_uses == 1
    assert written[("e", "v2")] == Use("e", "v2", "b", 0, 2, used=[]), "another variant's row"
    holder.fail({("e", "v1", "a"): 3}, "x" * 5000)
    (row,) = [u for u in holder.read(["e"]) if u.gateway == "a"]
    assert (row.failed_uses, len(row.failure or "")) == (3, 2048)
