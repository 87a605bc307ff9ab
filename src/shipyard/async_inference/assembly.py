"""Asynchronous inference put together: the queue in the store, the requests recorded on
it (the door's side) and the consumer that invokes them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shipyard.async_inference.consumer import Consumer
from shipyard.async_inference.queue import AsyncInvocations
from shipyard.core import Core
from shipyard.routing.invocation import Invocations
from shipyard.storage.async_queue import AsyncQueue


@dataclass(frozen=True)
class AsyncInference:
    requests: AsyncInvocations
    consumer: Consumer


def build(
    core: Core, *, invocations: Invocations, on_backlog_without_capacity: Callable[[], None]
) -> AsyncInference:
    settings = core.settings
    queue = AsyncQueue(core.store.engine)
    consumer = Consumer(
        queue=queue,
        invocations=invocations,
        objects=core.objects,
        metrics=core.metrics,
        owner=settings.identity,
        region=settings.region,
        account_id=settings.account_id,
        on_event=core.on_event,
        on_backlog_without_capacity=on_backlog_without_capacity,
        lease_s=settings.async_lease_s,
    )
    requests = AsyncInvocations(
        queue=queue,
        wake=consumer.wake,
        host_access=core.host_access,
        max_waiting=settings.max_async_queue,
    )
    return AsyncInference(requests=requests, consumer=consumer)
