"""Events put together: the topics of the stack file, and the dispatcher that sends each
event the store records to them."""

from __future__ import annotations

from dataclasses import dataclass

from shipyard.events.dispatcher import Dispatcher
from shipyard.events.notify import Notifier
from shipyard.events.topics import Topics
from shipyard.settings import Settings
from shipyard.stackfile import StackFile
from shipyard.storage.events import EventLog
from shipyard.storage.metadata import MetadataStore


@dataclass(frozen=True)
class Events:
    topics: Topics
    dispatcher: Dispatcher


def build(settings: Settings, stack: StackFile, store: MetadataStore) -> Events:
    topics = Topics(stack.topics)
    dispatcher = Dispatcher(
        log=EventLog(store.engine),
        topics=topics,
        # A subscriber may take half the dispatcher's lease to answer: one that answers
        # late is not sent the event again.
        notifier=Notifier(read_timeout_s=settings.event_lease_s / 2),
        lease_s=settings.event_lease_s,
    )
    return Events(topics=topics, dispatcher=dispatcher)
