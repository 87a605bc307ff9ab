"""Consumer: claim → InputLocation → instance → OutputLocation or FailureLocation.

Each pass looks at every asynchronous endpoint in the routing table, counts its free
slots (``MaxConcurrentInvocationsPerInstance`` per healthy instance, minus what is in
flight) and claims that many requests, oldest first. Each claimed request:

- fails at once, without running, when its RequestTTLSeconds has passed;
- streams its input from object storage to the least busy instance, and the instance's
  answer to ``<InferenceId>.out``, chunk by chunk: the gateway holds at most a few MB of
  it, whatever its size;
- fails with the reason written to ``<InferenceId>-error.out`` when the input is
  unreadable, the model answers an error, or InvocationTimeoutSeconds passes.

The outcome and its notification are recorded in one transaction, and only by the worker
that still holds the request's lease, so a request whose first worker died is processed
again but announced once. Output and failure files are written whole or not at all, and
writing one removes the other, so a retried request never leaves two different outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime

from shipyard.async_inference.notices import result_event
from shipyard.metrics import Metrics
from shipyard.records import AsyncRequest, AsyncStatus
from shipyard.routing.client import UpstreamError
from shipyard.routing.instance import Instance
from shipyard.routing.router import EndpointRoute, Router
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.metadata import now
from shipyard.storage.objects import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

_ERROR_BODY_BYTES = 64 * 1024
"""How much of a model's error answer goes into the failure reason."""


@dataclass
class _Outcome:
    succeeded: bool
    reason: str | None = None
    response: bytes | None = None
    """The start of the output, kept for notifications that include the response."""
    response_type: str | None = None


class Consumer:
    """Runs queued asynchronous invocations on their endpoints' instances."""

    def __init__(
        self,
        *,
        queue: AsyncQueue,
        router: Router,
        objects: ObjectStore,
        metrics: Metrics,
        owner: str,
        region: str,
        account_id: str,
        on_event: Callable[[], None],
        poll_period_s: float = 0.5,
        lease_margin_s: float = 30.0,
    ) -> None:
        self.queue = queue
        self.router = router
        self.objects = objects
        self.metrics = metrics
        self.owner = owner
        self.region = region
        self.account_id = account_id
        self._on_event = on_event
        self.poll_period_s = poll_period_s
        self.lease_margin_s = lease_margin_s
        self._wake = asyncio.Event()
        self._in_flight: dict[int, int] = {}  # id(instance) -> async requests on it
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"Consumer(owner={self.owner!r}, in_flight={sum(self._in_flight.values())})"

    def wake(self) -> None:
        """Look at the queue now (a request was queued or an instance freed up)."""
        self._wake.set()

    async def run(self) -> None:
        await asyncio.to_thread(self.queue.release_owned, self.owner)
        try:
            while True:
                try:
                    await self.step()
                except Exception:  # one bad pass must not stop the queue
                    log.exception("asynchronous consumer pass failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_period_s)
                self._wake.clear()
        finally:
            for task in self._tasks:
                task.cancel()

    async def step(self) -> None:
        for name, route in list(self.router.routes.items()):
            config = route.async_config
            if config is None:
                continue
            healthy = [i for i in route.instances() if i.healthy]
            cap = config.max_concurrent_per_instance
            free = sum(max(0, cap - self._in_flight.get(id(i), 0)) for i in healthy)
            if free > 0:
                claimed = await asyncio.to_thread(
                    self.queue.claim,
                    name,
                    owner=self.owner,
                    limit=free,
                    now=now(),
                    lease_margin_s=self.lease_margin_s,
                )
                for request in claimed:
                    self._start(route, request)
            await self._export_backlog(name, len(healthy), free)

    def _start(self, route: EndpointRoute, request: AsyncRequest) -> None:
        instance = self._pick(route)
        if instance is not None:
            self._in_flight[id(instance)] = self._in_flight.get(id(instance), 0) + 1
        task = asyncio.create_task(
            self._process(route, request, instance), name=f"async-{request.inference_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _pick(self, route: EndpointRoute) -> Instance | None:
        healthy = [i for i in route.instances() if i.healthy]
        if not healthy:
            return None
        return min(healthy, key=lambda i: self._in_flight.get(id(i), 0))

    async def _process(
        self, route: EndpointRoute, request: AsyncRequest, instance: Instance | None
    ) -> None:
        started = now()
        self.metrics.async_queue_time.labels(route.name).observe(
            max(0.0, (started - request.received).total_seconds())
        )
        try:
            if instance is None:
                await asyncio.to_thread(self.queue.release, request)
                return
            outcome = await self._run(request, instance, started)
            await self._record(request, outcome)
        except Exception:
            log.exception("asynchronous request %s failed unexpectedly", request.inference_id)
        finally:
            if instance is not None:
                self._in_flight[id(instance)] -= 1
            self.wake()

    async def _run(self, request: AsyncRequest, instance: Instance, started: datetime) -> _Outcome:
        if started > request.expires:
            waited = (started - request.received).total_seconds()
            return _Outcome(
                False,
                f"Request expired: it waited {waited:.0f} s in the queue, longer than its "
                "RequestTTLSeconds.",
            )
        try:
            size = await asyncio.to_thread(self.objects.size, request.input_location)
        except (ObjectNotFound, ObjectStoreError) as exc:
            return _Outcome(False, f"ClientError: Could not read the input: {exc}")
        try:
            async with asyncio.timeout(request.invocation_timeout_s):
                return await self._invoke(request, instance, size)
        except TimeoutError:
            return _Outcome(
                False,
                f"ModelError: The invocation timed out after "
                f"{request.invocation_timeout_s:g} s (InvocationTimeoutSeconds).",
            )
        except UpstreamError as exc:
            return _Outcome(False, f"ServiceUnavailable: the instance failed: {exc}")
        except (ObjectNotFound, ObjectStoreError) as exc:
            return _Outcome(False, f"ClientError: {exc}")

    async def _invoke(self, request: AsyncRequest, instance: Instance, size: int) -> _Outcome:
        headers = [(b"Content-Type", (request.content_type or "application/json").encode())]
        if request.accept:
            headers.append((b"Accept", request.accept.encode()))
        if request.custom_attributes:
            headers.append(
                (b"X-Amzn-SageMaker-Custom-Attributes", request.custom_attributes.encode())
            )
        headers.append((b"X-Amzn-SageMaker-Inference-Id", request.inference_id.encode()))
        body = self.objects.read_chunks(request.input_location)
        async with instance.pool.stream(
            b"POST", b"/invocations", headers, body, content_length=size
        ) as response:
            kind = (response.header(b"content-type") or b"application/octet-stream").decode()
            if response.status >= 300:
                text = (await _head(response.chunks(), _ERROR_BODY_BYTES)).decode(errors="replace")
                side = "client" if response.status < 500 else "server"
                return _Outcome(
                    False,
                    f"ModelError: Received {side} error ({response.status}) from the model "
                    f'with message "{text}".',
                )
            head = bytearray()
            await self.objects.write(request.output_location, _tee(response.chunks(), head))
        return _Outcome(True, response=bytes(head), response_type=kind)

    async def _record(self, request: AsyncRequest, outcome: _Outcome) -> None:
        if outcome.succeeded:
            await self._remove(request.failure_location)
        else:
            reason = outcome.reason or "failed"
            await self.objects.write_bytes(request.failure_location, reason.encode())
            await self._remove(request.output_location)
        at = now()
        arn = (
            f"arn:aws:sagemaker:{self.region}:{self.account_id}:endpoint/{request.endpoint.lower()}"
        )
        event = result_event(
            request,
            succeeded=outcome.succeeded,
            at=at,
            region=self.region,
            endpoint_arn=arn,
            failure_reason=outcome.reason,
            response=outcome.response,
            response_type=outcome.response_type,
        )
        status = AsyncStatus.COMPLETED if outcome.succeeded else AsyncStatus.FAILED
        recorded = await asyncio.to_thread(
            self.queue.finish,
            request,
            status=status,
            now=at,
            failure_reason=outcome.reason,
            event=event,
        )
        if not recorded:
            log.warning("request %s was taken over by another worker", request.inference_id)
            return
        self.metrics.async_invocations.labels(request.endpoint, status.value).inc()
        if event is not None:
            self._on_event()

    async def _remove(self, uri: str) -> None:
        with contextlib.suppress(ObjectNotFound, ObjectStoreError):
            await asyncio.to_thread(self.objects.delete, uri)

    async def _export_backlog(self, name: str, instances: int, free: int) -> None:
        backlog = await asyncio.to_thread(self.queue.backlog, name)
        size = backlog.queued + backlog.running
        m = self.metrics
        m.async_backlog.labels(name).set(size)
        m.async_backlog_per_instance.labels(name).set(size / instances if instances else size)
        oldest = backlog.oldest_received
        m.async_oldest_age.labels(name).set((now() - oldest).total_seconds() if oldest else 0)
        m.async_backlog_without_capacity.labels(name).set(
            1 if backlog.queued and not instances else 0
        )


async def _tee(chunks: AsyncIterator[bytes], head: bytearray) -> AsyncIterator[bytes]:
    """Pass ``chunks`` on, keeping the first 128 KB + 1 byte (enough to tell if it fits)."""
    async for chunk in chunks:
        room = 128 * 1024 + 1 - len(head)
        if room > 0:
            head += chunk[:room]
        yield chunk


async def _head(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    out = bytearray()
    async for chunk in chunks:
        out += chunk[: limit - len(out)]
        if len(out) >= limit:
            break
    return bytes(out)
