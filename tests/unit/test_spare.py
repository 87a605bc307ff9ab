"""Which instances a warm spare can become: variables read at import must match."""

from __future__ import annotations

from shipyard.runtime.spare import can_become

SPARE = {"PATH": "/usr/bin", "HOME": "/run/home/_spare", "OMP_NUM_THREADS": "2"}


def test_variables_read_later_are_taken_on() -> None:
    instance = {**SPARE, "HOME": "/run/home/i-1", "GREETING": "hi", "SAGEMAKER_BATCH": "true"}
    assert can_become(SPARE, instance)


def test_a_variable_read_at_import_must_keep_the_spares_value() -> None:
    assert not can_become(SPARE, {**SPARE, "OMP_NUM_THREADS": "1"})
    assert not can_become(SPARE, {k: v for k, v in SPARE.items() if k != "OMP_NUM_THREADS"})
    assert not can_become(SPARE, {**SPARE, "PYTHONHASHSEED": "0"})
    assert not can_become(SPARE, {**SPARE, "TORCH_HOME": "/models"})


def test_pythonpath_is_taken_on() -> None:
    assert can_become(SPARE, {**SPARE, "PYTHONPATH": "/opt/ml/model/code"})
