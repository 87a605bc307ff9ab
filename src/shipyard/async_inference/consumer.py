"""Consumer: claim → InputLocation → instance → OutputLocation or FailureLocation.

Each pass looks at every asynchronous endpoint in the routing table, counts its free
slots (``MaxConcurrentInvocationsPerInstance`` per healthy instance, minus the requests
it is already running there) and claims that many requests, oldest first. Each claimed
request:

- fails at once, without running, when its RequestTTLSeconds has passed;
- streams its input from object storage through the router (routing/router.py, which
  chooses the instance and counts it busy, as for every other request), and the
  instance's answer to ``<InferenceId>.out``, chunk by chunk: the gateway holds at most a
  few MB of it, whatever its size;
- goes back to the queue, untouched, when no instance can take it after all;
- fails with the reason written to ``<InferenceId>-error.out`` when the input is
  unreadable, the model answers an error, its output cannot be written, or
  InvocationTimeoutSeconds passes; when the failure file cannot be written either, the
  request still fails, the reason saying so.

The outcome and its notification are recorded in one transaction, and only by the worker
that still holds the request's lease, so a request whose first worker died is processed
again but announced once. Output and failure files are written whole or not at all, and
writing one removes the other, so a retried request never leaves two different outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from shipyard.background import Wakeup
from shipyard.contract import ACCEPT, CONTENT_TYPE, CUSTOM_ATTRIBUTES, INFERENCE_ID
from shipyard.errors import (
    InstanceFailed,
    ModelError,
    ModelNotReady,
    NoSuchObject,
    ObjectStoreError,
    ServiceUnavailable,
    UpstreamError,
)
from shipyard.events.kinds import inference_result_event
from shipyard.metrics import Metrics
from shipyard.records import AsyncRequest, AsyncStatus
from shipyard.routing.call import Call
from shipyard.routing.invocation import Invocations
from shipyard.routing.table import EndpointRoute
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.metadata import now
from shipyard.storage.objects import ObjectStore

log = logging.getLogger(__name__)

_ERROR_REASON_CHARS = 64 * 1024
"""How much of a model's error goes into the failure reason."""
_ATTEMPTS = 3
"""Tries of a request whose instance fails under it, counted by the queue's claims: one
that crashes every instance it reaches fails after the third."""


@dataclass(frozen=True, slots=True)
class BacklogReading:
    """One endpoint's queue as the consumer last saw it (CloudWatch's async metrics)."""

    queued: int
    running: int
    oldest_age_s: float
    instances: int
    """Healthy instances serving the endpoint then."""

    @property
    def size(self) -> int:
        """ApproximateBacklogSize: queued and running requests."""
        return self.queued + self.running

    @property
    def without_capacity(self) -> bool:
        """HasBacklogWithoutCapacity: requests wait and no instance is up."""
        return self.queued > 0 and self.instances == 0


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
        invocations: Invocations,
        objects: ObjectStore,
        metrics: Metrics,
        owner: str,
        region: str,
        account_id: str,
        on_event: Callable[[], None],
        poll_period_s: float = 0.5,
        lease_s: float = 30.0,
        on_backlog_without_capacity: Callable[[], None] | None = None,
    ) -> None:
        self.queue = queue
        self.invocations = invocations
        self.router = invocations.router
        self.objects = objects
        self.metrics = metrics
        self.owner = owner
        self.region = region
        self.account_id = account_id
        self._on_event = on_event
        self.poll_period_s = poll_period_s
        self.lease_s = lease_s
        """How long a request this gateway runs stays its own unrenewed (Settings.async_lease_s)."""
        self._renewed = 0.0
        self.on_backlog_without_capacity = on_backlog_without_capacity
        """Called when an endpoint has requests waiting and no instance (it scaled to
        zero): the autoscaler brings one back."""
        self.backlogs: dict[str, BacklogReading] = {}
        """Per asynchronous endpoint, its queue as last seen; the autoscaler reads it."""
        self._wake = Wakeup()
        self._running: dict[str, int] = {}  # endpoint -> requests claimed and not done
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"Consumer(owner={self.owner!r}, running={sum(self._running.values())})"

    def wake(self) -> None:
        """Look at the queue now (a request was queued or an instance freed up); safe from
        any thread."""
        self._wake.set()

    async def run(self) -> None:
        self._wake.bind()
        await asyncio.to_thread(self.queue.release_owned, self.owner)
        try:
            while True:
                try:
                    await self.step()
                except Exception:  # one bad pass must not stop the queue
                    log.exception("asynchronous consumer pass failed")
                await self._wake.wait(self.poll_period_s)
        finally:
            for task in self._tasks:
                task.cancel()
            await self._hand_back()

    async def _hand_back(self) -> None:
        """The gateway stops: the requests it was running go back to the queue for the
        other gateways (or this one, started again) to run at once, rather than waiting
        out their leases (InvocationTimeoutSeconds, 15 minutes by default)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            handed = await asyncio.to_thread(self.queue.release_owned, self.owner)
        except Exception:  # the store may be gone too: the leases then pass in time
            log.exception("could not give back the asynchronous requests this gateway ran")
            return
        if handed:
            log.info("gave back %d asynchronous request(s) to the queue", handed)

    async def step(self) -> None:
        if self._tasks and time.monotonic() - self._renewed >= self.lease_s / 3:
            # What this gateway runs stays its own while it lives; a killed gateway's
            # requests pass to the others a lease after its last renewal.
            self._renewed = time.monotonic()
            until = now() + timedelta(seconds=self.lease_s)
            await asyncio.to_thread(self.queue.renew, self.owner, until)
        for name, route in list(self.router.routes.items()):
            config = route.async_config
            if config is None:
                continue
            healthy = sum(1 for i in route.instances() if i.healthy)
            running = self._running.get(name, 0)
            free = max(0, config.max_concurrent_per_instance * healthy - running)
            if free > 0:
                claimed = await asyncio.to_thread(
                    self.queue.claim,
                    name,
                    owner=self.owner,
                    limit=free,
                    now=now(),
                    lease_s=self.lease_s,
                )
                for request in claimed:
                    self._start(route, request)
            await self._export_backlog(name, healthy, free)

    def _start(self, route: EndpointRoute, request: AsyncRequest) -> None:
        self._running[route.name] = self._running.get(route.name, 0) + 1
        task = asyncio.create_task(
            self._process(route, request), name=f"async-{request.inference_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, route: EndpointRoute, request: AsyncRequest) -> None:
        started = now()
        try:
            try:
                outcome = await self._run(route, request, started)
            except Exception as exc:  # a request that cannot be run fails, never hangs
                log.exception("asynchronous request %s could not be run", request.inference_id)
                outcome = _Outcome(False, f"InternalFailure: the request could not be run: {exc}")
            if outcome is None:
                await asyncio.to_thread(self.queue.release, request)
                return
            self.metrics.async_queue_time.labels(route.name).observe(
                max(0.0, (started - request.received).total_seconds())
            )
            await self._record(request, outcome)
        except Exception:
            log.exception("asynchronous request %s failed unexpectedly", request.inference_id)
        finally:
            self._running[route.name] -= 1
            self.wake()

    async def _run(
        self, route: EndpointRoute, request: AsyncRequest, started: datetime
    ) -> _Outcome | None:
        """The request's outcome; None when no instance could take it (back to the queue)."""
        if started > request.expires:
            waited = (started - request.received).total_seconds()
            return _Outcome(
                False,
                f"Request expired: it waited {waited:.0f} s in the queue, longer than its "
                "RequestTTLSeconds.",
            )
        if request.input_location is None:  # sent inline, kept with the request
            size = len(request.body or b"")
        else:
            try:
                size = await asyncio.to_thread(self.objects.size, request.input_location)
            except (NoSuchObject, ObjectStoreError) as exc:
                return _Outcome(False, f"ClientError: Could not read the input: {exc}")
        try:
            async with asyncio.timeout(request.invocation_timeout_s):
                return await self._invoke(route, request, size)
        except TimeoutError:
            return _Outcome(
                False,
                f"ModelError: The invocation timed out after "
                f"{request.invocation_timeout_s:g} s (InvocationTimeoutSeconds).",
            )
        except (InstanceFailed, UpstreamError) as exc:
            if request.attempts < _ATTEMPTS:
                # Its instance died under it (a crash, or the gateway running the fleet
                # was lost): a client of InvokeEndpoint would retry, so the queue does.
                log.info("request %s goes back to the queue: %s", request.inference_id, exc)
                return None
            return _Outcome(False, f"ServiceUnavailable: the instance failed: {exc}")
        except (ModelNotReady, ServiceUnavailable) as exc:
            log.info("request %s goes back to the queue: %s", request.inference_id, exc)
            return None
        except (NoSuchObject, ObjectStoreError) as exc:
            return _Outcome(False, f"ClientError: {exc}")

    async def _invoke(self, route: EndpointRoute, request: AsyncRequest, size: int) -> _Outcome:
        headers = [(CONTENT_TYPE, (request.content_type or "application/json").encode())]
        if request.accept:
            headers.append((ACCEPT, request.accept.encode()))
        if request.custom_attributes:
            headers.append((CUSTOM_ATTRIBUTES, request.custom_attributes.encode()))
        headers.append((INFERENCE_ID, request.inference_id.encode()))
        if request.input_location is None:
            call = Call(headers, request.body or b"", content_length=size)
        else:
            chunks = self.objects.read_chunks(request.input_location)
            call = Call(headers, chunks, content_length=size)
        status: int | None = None  # counted once the model's answer is known
        try:
            async with self.invocations.stream(route, call) as exchange:
                response = exchange.response
                kind = (response.header(b"content-type") or b"application/octet-stream").decode()
                head = bytearray()
                began = time.perf_counter()
                await self.objects.write(request.output_location, _tee(response.chunks(), head))
                model_s = exchange.head_s + time.perf_counter() - began
            status = 200
        except ModelError as exc:
            status = exc.original_status_code  # as CloudWatch counts a model's error
            return _Outcome(False, f"ModelError: {exc.message[:_ERROR_REASON_CHARS]}")
        except (InstanceFailed, UpstreamError):
            status = 500
            raise
        finally:
            if status is not None:
                Invocations.count(call, status)
        self.invocations.latency(call, model_s)
        return _Outcome(True, response=bytes(head), response_type=kind)

    async def _record(self, request: AsyncRequest, outcome: _Outcome) -> None:
        outcome = await self._write_outcome(request, outcome)
        at = now()
        arn = (
            f"arn:aws:sagemaker:{self.region}:{self.account_id}:endpoint/{request.endpoint.lower()}"
        )
        event = inference_result_event(
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

    async def _write_outcome(self, request: AsyncRequest, outcome: _Outcome) -> _Outcome:
        """Leave the outcome's file alone at its location: a success's output is written
        already, a failure's reason is written now; the other file is removed. A failure
        file that cannot be written (storage refuses, a link or a file where a folder
        must be) is told in the reason the store and the notification carry instead:
        the request fails all the same, and is never left unfinished."""
        if outcome.succeeded:
            await self._remove(request.failure_location)
            return outcome
        reason = outcome.reason or "failed"
        try:
            await self.objects.write_bytes(request.failure_location, reason.encode())
        except Exception as exc:  # whatever it is, the request still ends Failed
            log.warning(
                "request %s: could not write its failure file: %s",
                request.inference_id,
                exc,
                exc_info=not isinstance(exc, ObjectStoreError),
            )
            reason = f"{reason} The failure could not be written to the FailureLocation: {exc}"
            outcome = replace(outcome, reason=reason)
        await self._remove(request.output_location)
        return outcome

    async def _remove(self, uri: str) -> None:
        with contextlib.suppress(NoSuchObject, ObjectStoreError):
            await asyncio.to_thread(self.objects.delete, uri)

    async def _export_backlog(self, name: str, instances: int, free: int) -> None:
        backlog = await asyncio.to_thread(self.queue.backlog, name)
        oldest = backlog.oldest_received
        reading = BacklogReading(
            queued=backlog.queued,
            running=backlog.running,
            oldest_age_s=(now() - oldest).total_seconds() if oldest else 0.0,
            instances=instances,
        )
        self.backlogs[name] = reading
        size = reading.size
        m = self.metrics
        m.async_backlog.labels(name).set(size)
        m.async_backlog_per_instance.labels(name).set(size / instances if instances else size)
        m.async_oldest_age.labels(name).set(reading.oldest_age_s)
        m.async_backlog_without_capacity.labels(name).set(1 if reading.without_capacity else 0)
        if reading.without_capacity and self.on_backlog_without_capacity is not None:
            self.on_backlog_without_capacity()


async def _tee(chunks: AsyncIterator[bytes], head: bytearray) -> AsyncIterator[bytes]:
    """Pass ``chunks`` on, keeping the first 128 KB + 1 byte (enough to tell if it fits)."""
    async for chunk in chunks:
        room = 128 * 1024 + 1 - len(head)
        if room > 0:
            head += chunk[:room]
        yield chunk
