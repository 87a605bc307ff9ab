"""A shadow's copy of a call (Call.copy_to): every field carried over but the ones a copy
must not share (the instance chosen or pinned for the production call, the session it
opens there, and its client's watch: a copy answers nobody) and the variant."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.table import VariantRoute

_RESET = {"variant", "instance", "pinned", "opening", "watch_gone"}


def _variant(name: str) -> VariantRoute:
    return VariantRoute(
        name,
        weight=1.0,
        policy=LeastOutstandingRequests(max_in_flight=1),
        instances=[],
        metrics=Metrics().for_variant("e", name),
    )


def test_copy_to_carries_every_field_but_the_instance_and_variant() -> None:
    call = Call([(b"content-type", b"application/json")], b"{}")
    # A distinct value in every field, so a field left out or swapped shows.
    for n, f in enumerate(dataclasses.fields(Call)):
        setattr(call, f.name, ("value", n))
    shadow = _variant("shadow")

    copy = call.copy_to(shadow)

    assert copy is not call
    assert copy.variant is shadow
    assert copy.instance is None and copy.pinned is None and copy.opening is False
    assert copy.watch_gone is None
    for f in dataclasses.fields(Call):
        if f.name not in _RESET:
            assert getattr(copy, f.name) == getattr(call, f.name), f.name


def test_copy_to_is_what_replace_gives() -> None:
    call = Call([(b"x-amzn-sagemaker-session-id", b"s1")], b"body", content_length=4)
    call.session, call.opened, call.target = "s1", b"s1; Expires=1", "v1"
    shadow = _variant("shadow")
    call.watch_gone = _never
    expected = dataclasses.replace(
        call, variant=shadow, instance=None, pinned=None, opening=False, watch_gone=None
    )
    assert call.copy_to(shadow) == expected


def _never(callback: Callable[[], None]) -> Callable[[], None]:
    return _nothing


def _nothing() -> None:
    pass
