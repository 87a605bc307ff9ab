"""Placement of inference-component copies on a variant's instances (control/placement.py)."""

from __future__ import annotations

from shipyard.control.placement import Demand, fits_one, place


def test_copies_fill_instances_first_fit_in_creation_order() -> None:
    # ml.m5.large: 2 vCPUs, 8 GiB.
    plan = place(
        "ml.m5.large",
        [Demand("a", 2, 1, 2048), Demand("b", 2, 1, 1024), Demand("c", 1, 1, 1024)],
        least=2,
        most=2,
        keep_all=True,
    )
    assert plan.placed["a"] == [0, 0]
    assert plan.placed["b"] == [1, 1]
    assert plan.placed["c"] == [] and plan.short == {"c": 1}
    assert plan.hosts == 2


def test_memory_bounds_copies_as_cores_do() -> None:
    plan = place("ml.m5.large", [Demand("m", 3, 0.25, 3072)], least=1, most=1, keep_all=True)
    assert plan.copies("m") == 2 and plan.short == {"m": 1}  # 3 x 3 GiB > 8 GiB


def test_managed_scaling_adds_instances_up_to_its_maximum_and_keeps_only_those_used() -> None:
    grow = place("ml.m5.large", [Demand("big", 4, 2, 1024)], least=1, most=3, keep_all=False)
    assert grow.placed["big"] == [0, 1, 2] and grow.short == {"big": 1}
    assert grow.hosts == 3
    shrink = place("ml.m5.large", [Demand("big", 1, 2, 1024)], least=1, most=3, keep_all=False)
    assert shrink.hosts == 1
    empty = place("ml.m5.large", [], least=0, most=3, keep_all=False)
    assert empty.hosts == 0


def test_a_copy_larger_than_an_instance_never_adds_one() -> None:
    plan = place("ml.m5.large", [Demand("huge", 1, 4, 1024)], least=0, most=5, keep_all=False)
    assert plan.short == {"huge": 1} and plan.hosts == 0
    assert not fits_one("ml.m5.large", 4, 1024)
    assert fits_one("ml.m5.4xlarge", 4, 1024)


def test_an_unknown_instance_type_places_without_counting() -> None:
    plan = place("ml.unknown.type", [Demand("x", 50, 8, 65536)], least=1, most=1, keep_all=True)
    assert plan.copies("x") == 50 and not plan.short


def test_how_many_one_core_two_gib_copies_fit_an_m5_4xlarge() -> None:
    # 16 vCPUs and 64 GiB: 16 copies, where a plain endpoint would run one model per
    # instance.
    plan = place("ml.m5.4xlarge", [Demand("m", 20, 1, 2048)], least=1, most=1, keep_all=True)
    assert plan.copies("m") == 16 and plan.short == {"m": 4}
