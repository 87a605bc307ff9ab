"""Topics: named lists of subscribers, and how an event's targets resolve to them.

An event names where it goes (``Event.topics``) with any mix of:

- a topic name from the stack file's ``topics:`` section, e.g. ``done``;
- an SNS topic ARN ``arn:aws:sns:<region>:<account>:<name>``, which means topic ``<name>``
  (so a SageMaker ``NotificationConfig`` works unchanged);
- an apprise URL (anything with ``://``), a one-off subscriber outside any topic.

A name or ARN that matches no topic is returned as unknown rather than raised: the
dispatcher records it as a failed delivery and logs it once, and the event's other
subscribers still get it. Retrying would not help, since topics change only with the
stack file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

_SNS_ARN = re.compile(r"arn:[\w-]+:sns:[\w-]*:\d*:(?P<name>[\w-]+)")


class Subscriber(NamedTuple):
    """One place to deliver to: the topic it came through ("" for a one-off URL) and URL."""

    topic: str
    url: str


class Resolution(NamedTuple):
    """An event's targets, resolved: who gets it, and which targets match no topic."""

    subscribers: list[Subscriber]
    unknown: list[str]


class Topics:
    """Topic name -> apprise URLs, as the stack file's ``topics:`` section gives them.

    Raises ValueError at construction for a subscriber that is not a URL, naming the
    field (``topics.<name>[<i>]``), so a bad stack file fails at startup.
    """

    def __init__(self, topics: Mapping[str, Sequence[str]] | None = None) -> None:
        self._topics: dict[str, tuple[str, ...]] = {}
        for name, urls in (topics or {}).items():
            for i, url in enumerate(urls):
                if "://" not in url:
                    raise ValueError(f"topics.{name}[{i}]: {url!r} is not an apprise URL")
            self._topics[name] = tuple(urls)

    def __repr__(self) -> str:
        return f"Topics({sorted(self._topics)!r})"

    def replace(self, topics: Mapping[str, Sequence[str]]) -> None:
        """Take ``topics`` instead (``shipyard apply``), checked as at construction."""
        self._topics = Topics(topics)._topics

    @property
    def names(self) -> list[str]:
        return sorted(self._topics)

    def subscribers(self, targets: Sequence[str]) -> list[Subscriber]:
        """Every subscriber of ``targets``, each URL once; unknown topics are left out."""
        return self.resolve(targets).subscribers

    def resolve(self, targets: Sequence[str]) -> Resolution:
        """Resolve ``targets`` in order. A URL reached through two topics is listed once,
        under the first, so its owner gets one notification per event."""
        resolution = Resolution([], [])
        seen: set[str] = set()
        for target in targets:
            found = self._lookup(target)
            if found is None:
                resolution.unknown.append(target)
                continue
            for subscriber in found:
                if subscriber.url not in seen:
                    seen.add(subscriber.url)
                    resolution.subscribers.append(subscriber)
        return resolution

    def _lookup(self, target: str) -> list[Subscriber] | None:
        arn = _SNS_ARN.fullmatch(target)
        name = arn.group("name") if arn else target
        if name in self._topics:
            return [Subscriber(name, url) for url in self._topics[name]]
        if arn is None and "://" in target:
            return [Subscriber("", target)]
        return None
