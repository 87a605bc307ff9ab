"""Topics: how an event's targets resolve to subscribers."""

from __future__ import annotations

import pytest

from shipyard.events.topics import Subscriber, Topics

HOOK = "json://127.0.0.1:9000/hook"
MAIL = "mailto://127.0.0.1:2525?from=a@example.com&to=b@example.com"


def test_a_topic_name_resolves_to_its_urls_in_order() -> None:
    topics = Topics({"done": [HOOK, MAIL]})
    assert topics.subscribers(["done"]) == [("done", HOOK), ("done", MAIL)]


def test_an_sns_arn_resolves_to_the_topic_of_its_name() -> None:
    topics = Topics({"done": [HOOK]})
    arn = "arn:aws:sns:us-east-1:123456789012:done"
    assert topics.subscribers([arn]) == [Subscriber("done", HOOK)]


def test_a_url_is_a_one_off_subscriber_outside_any_topic() -> None:
    assert Topics().subscribers(["https://example.com/hook"]) == [("", "https://example.com/hook")]


def test_unknown_names_and_arns_are_reported_not_raised() -> None:
    topics = Topics({"done": [HOOK]})
    arn = "arn:aws:sns:eu-west-1:123456789012:missing"
    resolution = topics.resolve(["nope", "done", arn])
    assert resolution.subscribers == [("done", HOOK)]
    assert resolution.unknown == ["nope", arn]


def test_a_url_reached_through_two_topics_is_one_subscriber() -> None:
    topics = Topics({"a": [HOOK], "b": [MAIL, HOOK]})
    assert topics.subscribers(["a", "b", HOOK]) == [("a", HOOK), ("b", MAIL)]


def test_a_subscriber_that_is_not_a_url_is_refused_with_its_field() -> None:
    with pytest.raises(ValueError, match=r"topics\.done\[1\]: 'ops@example.com'"):
        Topics({"done": [HOOK, "ops@example.com"]})


def test_repr_names_the_topics() -> None:
    assert repr(Topics({"b": [], "a": [HOOK]})) == "Topics(['a', 'b'])"
