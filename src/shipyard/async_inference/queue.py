"""AsyncInvocations: InvokeEndpointAsync lands here, and leaves a request in the queue.

It checks the request against SageMaker's limits, fixes where its output and failure
files go (``<S3OutputPath>/<InferenceId>.out``, ``<S3FailurePath>/<InferenceId>-error.out``)
and which topics hear of it, records it durably unless its endpoint already holds its
most unfinished requests (``SHIPYARD_MAX_ASYNC_QUEUE``), and wakes the consumer. It never
sees HTTP and never touches an instance.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from shipyard.errors import (
    AsyncQueueFull,
    InvalidParameter,
    RuntimeValidationError,
    UnsupportedLocation,
)
from shipyard.host_access import HostAccess
from shipyard.records import AsyncConfig, AsyncRequest
from shipyard.storage.async_queue import AsyncQueue, QueueFull
from shipyard.storage.filesystems import join_location
from shipyard.storage.metadata import now

DEFAULT_TTL_S = 21600
DEFAULT_TIMEOUT_S = 900
MAX_INLINE_BYTES = 128_000
"""The most an input sent inline (InvokeEndpointAsync's Body) may hold, as SageMaker's."""


class AsyncInvocations:
    """Accepts asynchronous invocations into the durable queue."""

    def __init__(
        self,
        *,
        queue: AsyncQueue,
        wake: Callable[[], None],
        host_access: HostAccess | None = None,
        max_waiting: int | None = None,
    ) -> None:
        self.queue = queue
        self._wake = wake
        self.host_access = host_access or HostAccess()
        self.max_waiting = max_waiting
        """Unfinished requests one endpoint may hold (Settings.max_async_queue)."""

    def __repr__(self) -> str:
        return f"AsyncInvocations({self.queue!r})"

    def submit(
        self,
        endpoint: str,
        config: AsyncConfig,
        *,
        input_location: str | None,
        body: bytes | None = None,
        inference_id: str | None = None,
        content_type: str | None = None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        ttl_s: int | None = None,
        timeout_s: int | None = None,
        output_extension: str | None = None,
        filename: str | None = None,
    ) -> AsyncRequest:
        """Queue one request; a known ``inference_id`` returns the earlier request instead.

        The input is at ``input_location`` or is ``body`` (sent inline, kept with the
        request): exactly one of them. Raises RuntimeValidationError for neither or both,
        an unusable InputLocation, a body over MAX_INLINE_BYTES and values outside
        SageMaker's ranges; AsyncQueueFull when the endpoint holds ``max_waiting``
        unfinished requests already.
        """
        location = _input(input_location, body)
        if location is not None:
            try:
                self.host_access.check_location(location, "InputLocation")
            except InvalidParameter as exc:  # the runtime's own error code
                raise RuntimeValidationError(exc.message) from None
        ttl = _in_range("RequestTTLSeconds", ttl_s, DEFAULT_TTL_S, 60, 21600)
        timeout = _in_range("InvocationTimeoutSeconds", timeout_s, DEFAULT_TIMEOUT_S, 1, 3600)
        inference_id = inference_id or str(uuid.uuid4())
        if len(inference_id) > 64 or not inference_id.isprintable() or inference_id[0].isspace():
            raise RuntimeValidationError(
                "Inference-Id must be 1 to 64 printable characters and not start with a space."
            )
        received = now()
        output_dir = config.output_path
        if output_extension is not None:
            output_dir = _join(output_dir, _extension(output_extension))
        request = AsyncRequest(
            endpoint=endpoint,
            inference_id=inference_id,
            input_location=location,
            output_location=_join(output_dir, _filename(filename) or f"{inference_id}.out"),
            failure_location=_join(config.failure_path, f"{inference_id}-error.out"),
            received=received,
            expires=received + timedelta(seconds=ttl),
            invocation_timeout_s=float(timeout),
            content_type=content_type,
            accept=accept,
            custom_attributes=custom_attributes,
            notify=notify_settings(config),
            body=body if location is None else None,
        )
        try:
            queued, created = self.queue.enqueue(request, max_waiting=self.max_waiting)
        except QueueFull as exc:
            raise AsyncQueueFull(
                f"Endpoint {endpoint} holds {exc.waiting} unfinished asynchronous requests, "
                f"its most (SHIPYARD_MAX_ASYNC_QUEUE); nothing was queued: try again later."
            ) from None
        if created:
            self._wake()
        return queued


def _input(value: str | None, body: bytes | None) -> str | None:
    """The InputLocation, or None for an input sent inline (``body``)."""
    if value and body:
        raise RuntimeValidationError(
            "Give the input either at X-Amzn-SageMaker-InputLocation or as the request "
            "body (Body), not both."
        )
    if body:
        if len(body) > MAX_INLINE_BYTES:
            raise RuntimeValidationError(
                f"Body is {len(body)} bytes, over the maximum of {MAX_INLINE_BYTES}: put a "
                "larger input at an InputLocation."
            )
        return None
    if not value:
        raise RuntimeValidationError(
            "The input is required: X-Amzn-SageMaker-InputLocation (the s3:// or file:// URI "
            "of the input) or the request body (Body)."
        )
    if not value.startswith(("s3://", "file:///", "/")) or len(value) > 1024:
        raise RuntimeValidationError(
            f"InputLocation {value!r} is not an s3:// or file:// URI or an absolute path."
        )
    return value


def _in_range(name: str, value: int | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not low <= value <= high:
        raise RuntimeValidationError(f"{name} must be between {low} and {high}, not {value}.")
    return value


_EXTENSION = re.compile(r"[a-zA-Z0-9!_.*'()/-]{1,512}")
_FILENAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,31}")


def _extension(value: str) -> str:
    """S3OutputPathExtension: a relative sub-path of S3OutputPath, as SageMaker allows."""
    parts = value.strip("/").split("/")
    if not _EXTENSION.fullmatch(value) or value.startswith(("s3:", "https:")) or ".." in parts:
        raise RuntimeValidationError(f"S3OutputPathExtension {value!r} is not a relative path.")
    return value.strip("/")


def _filename(value: str | None) -> str | None:
    """Filename: the output's name instead of ``<InferenceId>.out`` (at most one dot)."""
    if value is None:
        return None
    if not _FILENAME.fullmatch(value) or value.count(".") > 1:
        raise RuntimeValidationError(f"Filename {value!r} is not a valid file name.")
    return value


def _join(prefix: str, name: str) -> str:
    """``name`` as a name under ``prefix`` (its ``%``, ``#`` or ``?`` never read as part
    of a URI), one slash between them; RuntimeValidationError for one that would leave it."""
    try:
        return join_location(prefix.rstrip("/"), name)
    except UnsupportedLocation as exc:
        raise RuntimeValidationError(str(exc)) from None


def notify_settings(config: AsyncConfig) -> dict[str, Any]:
    """The part of the config a request keeps, so its notifications don't change later."""
    return {
        "success_topic": config.success_topic,
        "error_topic": config.error_topic,
        "include_response_in": list(config.include_response_in),
    }
