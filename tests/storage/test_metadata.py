"""MetadataStore on SQLite and, where it runs, PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shipyard.errors import (
    AlreadyExists,
    InvalidParameter,
    ResourceLimitExceeded,
    ResourceNotFound,
)
from shipyard.records import (
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    Model,
    RoutingStrategy,
    VariantSpec,
    VariantState,
)
from shipyard.storage.metadata import MetadataStore, now


@pytest.fixture
def store(meta: MetadataStore) -> MetadataStore:
    return meta


def _model(name: str = "m") -> Model:
    return Model(
        name,
        f"arn:model/{name}",
        "shipyard/python",
        "file:///x",
        {"A": "1"},
        None,
        now(),
        {"ModelName": name},
    )


def _config(name: str = "c") -> EndpointConfig:
    v = VariantSpec("v1", "m", "ml.m5.large", 2, 1.0, RoutingStrategy.LEAST_OUTSTANDING_REQUESTS)
    return EndpointConfig(name, f"arn:endpoint-config/{name}", (v,), now(), {})


def _endpoint(name: str = "e") -> Endpoint:
    t = now()
    return Endpoint(
        name,
        f"arn:endpoint/{name}",
        "c",
        EndpointStatus.CREATING,
        None,
        t,
        t,
        (VariantState("v1", 1.0, 2),),
    )


def test_models_round_trip_and_names_are_unique(store: MetadataStore) -> None:
    store.create_model(_model())
    got = store.get_model("m")
    assert got.environment == {"A": "1"} and got.created.tzinfo is not None
    with pytest.raises(AlreadyExists, match="already existing model"):
        store.create_model(_model())
    store.delete_model("m")
    with pytest.raises(ResourceNotFound, match='Could not find model "m"'):
        store.get_model("m")
    with pytest.raises(ResourceNotFound):
        store.delete_model("m")


def test_endpoint_config_keeps_its_variants(store: MetadataStore) -> None:
    store.create_endpoint_config(_config())
    got = store.get_endpoint_config("c")
    assert got.variants == _config().variants
    assert [c.name for c in store.list_endpoint_configs()] == ["c"]


def test_endpoint_transitions_are_checked(store: MetadataStore) -> None:
    store.create_endpoint(_endpoint(), max_endpoints=10)
    e = store.change_endpoint("e", status=EndpointStatus.IN_SERVICE)
    assert e.status is EndpointStatus.IN_SERVICE and e.generation == 1
    with pytest.raises(InvalidParameter, match="cannot go from InService to Creating"):
        store.change_endpoint("e", status=EndpointStatus.CREATING)
    with pytest.raises(InvalidParameter, match="while it is InService"):
        store.change_endpoint("e", expect=[EndpointStatus.FAILED], status=EndpointStatus.UPDATING)
    e = store.change_endpoint("e", status=EndpointStatus.UPDATING, pending_config_name="c2")
    assert store.get_endpoint("e") == replace(e)
    assert store.get_endpoint("e").pending_config_name == "c2"


def test_endpoint_quota_and_duplicates(store: MetadataStore) -> None:
    store.create_endpoint(_endpoint("a"), max_endpoints=2)
    with pytest.raises(AlreadyExists, match="already existing endpoint"):
        store.create_endpoint(_endpoint("a"), max_endpoints=2)
    store.create_endpoint(_endpoint("b"), max_endpoints=2)
    with pytest.raises(ResourceLimitExceeded, match="Number of endpoints"):
        store.create_endpoint(_endpoint("c"), max_endpoints=2)
    assert sorted(e.name for e in store.list_endpoints()) == ["a", "b"]


def test_a_model_and_config_an_endpoint_runs_are_kept_when_deleted(store: MetadataStore) -> None:
    """SageMaker lets users delete them while the endpoint runs on: the endpoint must still
    start again (a restart), scale and be updated from them, so they are kept, hidden from
    the API, until no endpoint runs them."""
    store.create_model(_model("m"))
    store.create_endpoint_config(_config("c"))
    store.create_endpoint(_endpoint("e"), max_endpoints=10)
    store.delete_endpoint_config("c")
    store.delete_model("m")

    for missing in (
        lambda: store.get_model("m", kept=False),
        lambda: store.get_endpoint_config("c", kept=False),
        lambda: store.delete_model("m"),
        lambda: store.delete_endpoint_config("c"),
    ):
        with pytest.raises(ResourceNotFound):
            missing()
    assert store.list_models() == [] and store.list_endpoint_configs() == []
    assert store.get_endpoint_config("c").variants[0].model_name == "m"  # what starts it
    assert store.get_model("m").image == "shipyard/python"

    # New ones under the names (any case): the endpoint keeps what it ran, described by
    # the name it was given.
    store.create_model(replace(_model("M"), image="other"))
    store.create_endpoint_config(replace(_config("C"), async_config=None))
    ep = store.get_endpoint("e")
    assert ep.config_name != "c" and store.shown_config_name(ep.config_name) == "c"
    ran = store.get_endpoint_config(ep.config_name)
    assert store.get_model(ran.variants[0].model_name).image == "shipyard/python"
    assert {m.name for m in store.list_models()} == {"M"}
    assert {c.name for c in store.list_endpoint_configs()} == {"C"}

    # Kept only as long as an endpoint runs them.
    store.delete_endpoint("e")
    with pytest.raises(ResourceNotFound):
        store.get_endpoint_config(ep.config_name)
    with pytest.raises(ResourceNotFound):
        store.get_model(ran.variants[0].model_name)
    assert store.get_model("M").image == "other"


def test_a_model_or_config_no_endpoint_runs_is_deleted_at_once(store: MetadataStore) -> None:
    store.create_model(_model("m"))
    store.create_endpoint_config(_config("c"))
    store.delete_endpoint_config("c")
    store.delete_model("m")
    with pytest.raises(ResourceNotFound):
        store.get_endpoint_config("c")
    with pytest.raises(ResourceNotFound):
        store.get_model("m")


def test_a_deleted_model_a_component_would_roll_back_to_is_kept(store: MetadataStore) -> None:
    """A component's served specification (what a failed update rolls back to) keeps its
    model as its current one does, and a new model taking the name leaves it alone."""
    from shipyard.records import ComponentSpec, ComponentStatus, InferenceComponent, ServedSpec
    from shipyard.storage.components import ComponentStore

    components = ComponentStore(store.engine)
    store.create_model(_model("ma"))
    store.create_model(_model("mb"))
    spec = ComponentSpec(model_name="ma")
    stamp = now()
    components.create(
        InferenceComponent(
            "ic", "arn:ic", "e", "v1", spec, 1, ComponentStatus.IN_SERVICE, stamp, stamp,
            served=ServedSpec(spec, {"ModelName": "ma"}, 0),
        )
    )  # fmt: skip
    store.delete_model("ma")
    components.respecify("ic", ComponentSpec(model_name="mb"), {"ModelName": "mb"}, None)
    assert store.get_model("ma").name == "ma"  # still what a rollback would start
    store.create_model(replace(_model("ma"), image="new"))
    served = components.get("ic").served
    assert served is not None and served.spec.model_name != "ma"
    assert store.get_model(str(served.spec.model_name)).image == "shipyard/python"


def test_a_pending_config_renamed_mid_update_is_the_one_promoted(store: MetadataStore) -> None:
    """The update read config c2; the user deleted it and made a new c2 meanwhile: the
    endpoint records the config it deployed, not the new one of that name."""
    store.create_model(_model("m"))
    store.create_endpoint_config(_config("c"))
    store.create_endpoint_config(_config("c2"))
    store.create_endpoint(
        replace(_endpoint("e"), status=EndpointStatus.IN_SERVICE), max_endpoints=9
    )
    store.change_endpoint("e", status=EndpointStatus.UPDATING, pending_config_name="c2")
    store.delete_endpoint_config("c2")
    store.create_endpoint_config(replace(_config("c2"), raw={"EndpointConfigName": "c2", "new": 1}))
    done = store.change_endpoint(
        "e", status=EndpointStatus.IN_SERVICE, config_name="c2", pending_config_name=None
    )
    assert done.config_name != "c2" and store.shown_config_name(done.config_name) == "c2"
    assert "new" not in store.get_endpoint_config(done.config_name).raw
    assert "new" in store.get_endpoint_config("c2").raw
