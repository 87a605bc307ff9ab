"""The admission rules a model sets, and what each request asks of them."""

from __future__ import annotations

import pytest

from shipyard.errors import InvalidParameter, RuntimeValidationError
from shipyard.routing.priorities import (
    UNCONFIGURED,
    QueueRules,
    from_custom_attributes,
    from_oip,
    from_service_tier,
    queue_rules,
    resolve,
)

FOUR = QueueRules(levels=4, default_level=2, configured=True)


def test_a_model_that_sets_nothing_is_admitted_as_before() -> None:
    assert queue_rules({"OTHER": "1"}) == UNCONFIGURED
    assert not UNCONFIGURED.configured


def test_the_default_level_is_the_middle_one() -> None:
    rules = queue_rules({"SHIPYARD_PRIORITY_LEVELS": "5"})
    assert (rules.levels, rules.default_level, rules.configured) == (5, 3, True)
    assert queue_rules({"SHIPYARD_PRIORITY_LEVELS": "4"}).default_level == 2


def test_every_variable_is_read() -> None:
    rules = queue_rules(
        {
            "SHIPYARD_PRIORITY_LEVELS": "3",
            "SHIPYARD_DEFAULT_PRIORITY": "1",
            "SHIPYARD_MAX_QUEUE_SIZE": "8",
            "SHIPYARD_DEFAULT_DEADLINE_MS": "250",
            "SHIPYARD_DEADLINE_ACTION": "DELAY",
        }
    )
    assert rules == QueueRules(3, 1, 8, 0.25, True, True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SHIPYARD_PRIORITY_LEVELS", "0"),
        ("SHIPYARD_PRIORITY_LEVELS", "17"),
        ("SHIPYARD_PRIORITY_LEVELS", "two"),
        ("SHIPYARD_DEFAULT_PRIORITY", "9"),
        ("SHIPYARD_MAX_QUEUE_SIZE", "-1"),
        ("SHIPYARD_DEFAULT_DEADLINE_MS", "1.5"),
        ("SHIPYARD_DEADLINE_ACTION", "DROP"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(InvalidParameter, match=name):
        queue_rules({name: value})


def test_custom_attributes_give_a_level_and_a_deadline_and_leave_the_rest() -> None:
    got = from_custom_attributes("trace=abc, Shipyard-Priority = 1; shipyard-deadline-ms=40")
    assert got == (1, 0.04)
    assert from_custom_attributes("trace=abc") == (None, None)


def test_zero_means_the_default() -> None:
    priority, deadline_s = from_custom_attributes("shipyard-priority=0,shipyard-deadline-ms=0")
    assert resolve(FOUR, priority, deadline_s) == (2, None)


def test_the_earlier_of_the_request_and_the_default_deadline_counts() -> None:
    rules = QueueRules(levels=1, deadline_s=0.1, configured=True)
    assert resolve(rules, None, 0.05) == (1, 0.05)
    assert resolve(rules, None, 0.5) == (1, 0.1)
    assert resolve(rules, None, None) == (1, 0.1)


def test_a_level_above_the_variants_is_refused_naming_it() -> None:
    with pytest.raises(RuntimeValidationError, match="shipyard-priority.*5"):
        resolve(FOUR, 5, None)
    assert resolve(UNCONFIGURED, 1, None) == (1, None)  # an unconfigured variant: level 1
    with pytest.raises(RuntimeValidationError):
        resolve(UNCONFIGURED, 2, None)


@pytest.mark.parametrize(
    "value",
    [
        "shipyard-priority=-1",
        "shipyard-priority=1.0",
        "shipyard-priority=1,shipyard-priority=2",
        "shipyard-deadline-ms=soon",
        "shipyard-colour=red",
        "shipyard-priority",
    ],
)
def test_a_bad_key_or_value_is_refused(value: str) -> None:
    with pytest.raises(RuntimeValidationError, match="shipyard-|CustomAttributes"):
        from_custom_attributes(value)


def test_oip_parameters_are_tritons_names_and_units() -> None:
    assert from_oip({"priority": 1, "timeout": 20_000}) == (1, 0.02)
    assert from_oip({"priority": 0}) == (0, None)
    assert from_oip(None) == (None, None)
    with pytest.raises(RuntimeValidationError, match="priority"):
        from_oip({"priority": "high"})
    with pytest.raises(RuntimeValidationError, match="timeout"):
        from_oip({"timeout": -3})


def test_service_tiers_map_to_levels() -> None:
    assert resolve(FOUR, from_service_tier("priority"), None)[0] == 1
    assert resolve(FOUR, from_service_tier("fast"), None)[0] == 1
    assert resolve(FOUR, from_service_tier("flex"), None)[0] == 4
    assert resolve(FOUR, from_service_tier("auto"), None)[0] == 2
    assert resolve(FOUR, from_service_tier(None), None)[0] == 2
    with pytest.raises(RuntimeValidationError, match="service_tier"):
        from_service_tier("turbo")
