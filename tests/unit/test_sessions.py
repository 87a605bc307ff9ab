"""Session bookkeeping (routing/sessions.py): expiry, closing, and the endpoint a
session belongs to."""

from __future__ import annotations

import pytest

from shipyard.errors import RuntimeValidationError
from shipyard.routing.sessions import Sessions


def test_a_session_expires_after_its_ttl_and_is_then_refused() -> None:
    now = [1_000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    opened = sessions.open("s1", "e", "i-1")
    assert opened.header("s1") == b"s1; Expires=1970-01-01T00:17:40Z"
    now[0] += 59
    assert sessions.instance_for("e", "s1") == "i-1"
    now[0] += 1
    with pytest.raises(RuntimeValidationError, match="Session s1 is not valid"):
        sessions.instance_for("e", "s1")


def test_a_closed_session_or_another_endpoints_is_refused() -> None:
    sessions = Sessions()
    sessions.open("s1", "e", "i-1")
    with pytest.raises(RuntimeValidationError):
        sessions.instance_for("other", "s1")
    sessions.close("s1", "other")  # another endpoint's model cannot close it
    assert sessions.instance_for("e", "s1") == "i-1"
    sessions.close("s1", "e")
    with pytest.raises(RuntimeValidationError):
        sessions.instance_for("e", "s1")


def test_expired_sessions_are_forgotten_as_new_ones_open() -> None:
    now = [0.0]
    sessions = Sessions(ttl_s=10, clock=lambda: now[0])
    for n in range(100):
        sessions.open(f"s{n}", "e", "i")
    now[0] = 20
    sessions.open("fresh", "e", "i")
    assert repr(sessions) == "Sessions(live=1, ttl_s=10)"
