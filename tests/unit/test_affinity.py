"""ModelAffinity's choice, over plain Instance objects whose ``models`` the tests set."""

from __future__ import annotations

import random
from collections import Counter, OrderedDict

import pytest

from shipyard.http.client import Response
from shipyard.metrics import Metrics
from shipyard.routing.instance import Instance
from shipyard.routing.multimodel import CACHE, EVICTED, MultiModelDispatch
from shipyard.routing.policies import (
    IgnoreModel,
    ModelAffinity,
    ModelPolicy,
    Random,
    model_policy_for,
)


def _instances(*models: tuple[str, ...], concurrency: int | None = 1) -> list[Instance]:
    out = []
    for i, held in enumerate(models):
        inst = Instance(f"i-{i}", "v", f"http://127.0.0.1:{9000 + i}", concurrency=concurrency)
        inst.models = dict.fromkeys(held)
        out.append(inst)
    return out


def test_a_request_goes_to_the_instance_holding_its_model() -> None:
    a, b, c = _instances((), ("x",), ("y",))
    policy = ModelAffinity(max_in_flight=8)
    assert all(policy.choose([a, b, c], "x") is b for _ in range(20))
    assert all(policy.choose([a, b, c], "y") is c for _ in range(20))


def test_a_busy_holder_keeps_its_requests_until_spill_at_then_they_spill() -> None:
    """A miss costs far more than waiting behind a few hits, so the holder keeps taking
    requests for its model; once it has spill_at in flight, the next goes to the least
    loaded other instance, which will load the model too."""
    holder, idle, busy = _instances(("x",), (), ())
    busy.in_flight = 3
    policy = ModelAffinity(max_in_flight=8, spill_at=5)
    for n in range(5):
        holder.in_flight = n
        assert policy.choose([holder, idle, busy], "x") is holder
    holder.in_flight = 5
    assert policy.choose([holder, idle, busy], "x") is idle


def test_spill_at_defaults_to_half_of_max_in_flight() -> None:
    assert ModelAffinity(max_in_flight=64).spill_at == 32
    assert ModelAffinity(max_in_flight=1).spill_at == 1
    assert ModelAffinity(max_in_flight=8, spill_at=100).spill_at == 8


def test_among_holders_the_least_loaded_wins() -> None:
    a, b = _instances(("x",), ("x",))
    a.in_flight = 2
    assert ModelAffinity(max_in_flight=8).choose([a, b], "x") is b


def test_without_a_holder_the_fewest_requests_then_the_fewest_models_win() -> None:
    crowded, roomy, busy = _instances(("a", "b", "c"), ("d",), ())
    busy.in_flight = 1
    policy = ModelAffinity(max_in_flight=8)
    assert all(policy.choose([crowded, roomy, busy], "x") is roomy for _ in range(20))


def test_exact_ties_are_broken_at_random() -> None:
    instances = _instances((), (), ())
    policy = ModelAffinity(max_in_flight=8, rng=random.Random(3))
    picks = Counter(policy.choose(instances, "x").instance_id for _ in range(600))  # type: ignore[union-attr]
    assert set(picks) == {"i-0", "i-1", "i-2"} and min(picks.values()) > 150


def test_unhealthy_and_full_instances_are_skipped_and_all_full_is_none() -> None:
    sick, full, ok = _instances(("x",), ("x",), ())
    sick.healthy = False
    full.in_flight = 2
    policy = ModelAffinity(max_in_flight=2)
    assert policy.choose([sick, full, ok], "x") is ok
    ok.in_flight = 2
    assert policy.choose([sick, full, ok], "x") is None
    assert policy.choose([], "x") is None


def test_model_policy_for_knows_affinity_and_random() -> None:
    assert isinstance(model_policy_for("affinity", max_in_flight=4), ModelAffinity)
    random_policy = model_policy_for("random", max_in_flight=4)
    assert isinstance(random_policy, IgnoreModel) and isinstance(random_policy.policy, Random)
    with pytest.raises(ValueError, match="unknown multi-model routing 'sticky'"):
        model_policy_for("sticky", max_in_flight=4)


# -- the hit rate it buys ---------------------------------------------------------------


class _LruCache:
    """Stands in for one instance's ModelCache: ``capacity`` models, least recent out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.models: OrderedDict[str, None] = OrderedDict()

    def serve(self, model: str) -> Response:
        """The headers the built-in runtime answers with (runtime/model_contract.py)."""
        if model in self.models:
            self.models.move_to_end(model)
            return Response(200, [(CACHE, b"hit")], b"")
        self.models[model] = None
        evicted = []
        while len(self.models) > self.capacity:
            evicted.append(self.models.popitem(last=False)[0])
        headers = [(CACHE, b"miss")]
        if evicted:
            headers.append((EVICTED, ",".join(evicted).encode()))
        return Response(200, headers, b"")


def _hit_rate(policy: ModelPolicy, *, seed: int) -> float:
    """4 instances each holding 100 of 1,000 models; a Zipf (s=1) stream of requests in
    waves of 8 at once, each wave sent before any of it is answered, as under load."""
    rng = random.Random(seed)
    names = [f"model-{i}.tar.gz" for i in range(1000)]
    weights = [1 / (rank + 1) for rank in range(len(names))]
    instances = _instances(*([()] * 4))
    caches = {i.instance_id: _LruCache(100) for i in instances}
    route = MultiModelDispatch(prefix="file:///p", policy=policy, metrics={})
    hits = total = 0
    for _ in range(1500):
        wave = []
        for model in rng.choices(names, weights, k=8):
            instance = policy.choose(instances, model)
            assert instance is not None
            instance.in_flight += 1
            instance.models.setdefault(model, None)  # as MultiModelDispatch.send does
            wave.append((instance, model))
        for instance, model in wave:
            instance.in_flight -= 1
            response = caches[instance.instance_id].serve(model)
            route.observe(instance, model, response)
            hits += response.header(CACHE) == b"hit"
            total += 1
    return hits / total


def test_affinity_hits_the_cache_far_more_often_than_random_routing() -> None:
    """Random routing makes every instance hold the same hot models; affinity splits the
    models among the instances, so their memory adds up."""
    affinity = _hit_rate(ModelAffinity(max_in_flight=64, rng=random.Random(1)), seed=7)
    blind = _hit_rate(IgnoreModel(Random(max_in_flight=64, rng=random.Random(1))), seed=7)
    assert blind < 0.75
    assert affinity > blind + 0.15, (affinity, blind)


def test_observe_learns_loads_and_evictions_from_the_answers() -> None:
    metrics = Metrics()
    (instance,) = _instances(("old", "kept"))
    route = MultiModelDispatch(
        prefix="file:///p",
        policy=ModelAffinity(max_in_flight=4),
        metrics={"i-0": metrics.for_instance_models("e", "v", "i-0")},
    )
    answer = Response(
        200,
        [
            (CACHE, b"miss"),
            (EVICTED, b"old"),
            (b"x-shipyard-model-timings", b"wait=0.5;download=0.1;load=0.3;unload=0.05"),
            (b"x-shipyard-loaded-models", b"2"),
        ],
        b"",
    )
    route.observe(instance, "new", answer)
    assert list(instance.models) == ["kept", "new"]
    route.observe(instance, "kept", Response(200, [(CACHE, b"hit")], b""))
    assert list(instance.models) == ["new", "kept"]
    missing = Response(404, [(b"x-shipyard-error", b"ModelNotFound")], b"")
    route.observe(instance, "gone", missing)
    assert "gone" not in instance.models
    labels = {"endpoint": "e", "variant": "v", "instance": "i-0"}
    sample = metrics.registry.get_sample_value
    assert sample("shipyard_model_cache_hits_total", labels) == 1
    assert sample("shipyard_model_cache_misses_total", labels) == 1
    assert sample("shipyard_model_evictions_total", labels) == 1
    assert sample("shipyard_loaded_models", labels) == 2
    assert sample("shipyard_model_loading_seconds_sum", labels) == pytest.approx(0.3)
    assert sample("shipyard_model_unloading_seconds_count", labels) == 1
