"""The data path's side of capture (VariantCapture) and the writer behind it.

Per invocation the data path asks the variant's ``VariantCapture`` to ``offer`` what it
saw and answered. That costs one random draw when the invocation is not sampled, and a
small object appended to a list when it is: no encoding, no I/O, no await. Everything
else happens in the gateway's one ``CaptureWriter``, a background loop that every
``flush_interval_s`` (or as soon as ``flush_records`` are waiting) takes what is
buffered, encodes it (capture/jsonl.py) in slices between requests and writes one file per
variant and hour through the object store, whole or not at all.

What it guarantees, and how it fails:

- **An invocation is never slowed or failed by capture.** The buffer is bounded (by
  records and by bytes); what does not fit is dropped and counted, never waited for.
- **Every sampled record is counted once** in ``shipyard_capture_records_total`` by
  outcome: ``written``, ``dropped`` (the buffer was full: the destination is slower
  than the traffic) or ``failed`` (the write failed, or was still pending when the
  gateway stopped after ``close_timeout_s``). Failed files are not retried: a
  destination that fails keeps failing, and retries would only hold memory.
- **Stopping the gateway flushes the buffer** (``close``), after the doors have
  stopped taking requests.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from prometheus_client import Counter

from shipyard.background import Wakeup
from shipyard.capture.config import CaptureConfig
from shipyard.capture.jsonl import Captured, LineEncoder, file_key, hour_of
from shipyard.contract import CONTENT_TYPE, INFERENCE_ID
from shipyard.metrics import Metrics
from shipyard.storage.objects import ObjectStore

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]

_NO_TYPE = "application/octet-stream"
_SLICE = 32
"""Records encoded between two turns of the event loop (about 1 ms of work)."""


class VariantCapture:
    """Samples one variant's invocations and hands them to the writer.

    Built when the variant's route is published (control/publishing.py), so the data
    path finds it on the route it already holds and never looks anything up.
    """

    __slots__ = ("endpoint", "variant", "config", "written", "dropped", "failed", "_writer")

    def __init__(
        self,
        endpoint: str,
        variant: str,
        config: CaptureConfig,
        *,
        writer: CaptureWriter,
        counter: Counter,
    ) -> None:
        self.endpoint = endpoint
        self.variant = variant
        self.config = config
        self.written = counter.labels(endpoint, variant, "written")
        self.dropped = counter.labels(endpoint, variant, "dropped")
        self.failed = counter.labels(endpoint, variant, "failed")
        self._writer = writer

    def __repr__(self) -> str:
        percent = self.config.sampling_percentage
        return f"VariantCapture({self.endpoint!r}, {self.variant!r}, {percent}%)"

    def offer(self, headers: Headers, body: bytes, output: bytes, output_type: bytes) -> None:
        """One answered invocation: captured with the config's probability.

        ``headers`` are the request headers forwarded to the instance, as sent.
        """
        if self._writer.random() * 100.0 >= self.config.sampling_percentage:
            return
        input_type = _NO_TYPE
        inference_id = None
        for key, value in headers:
            if key == CONTENT_TYPE:
                input_type = value.decode("latin-1")
            elif key == INFERENCE_ID:
                inference_id = value.decode("latin-1")
        config = self.config
        item = Captured(
            at=time.time(),
            inference_id=inference_id,
            input=body if config.capture_input else None,
            input_type=input_type,
            output=output if config.capture_output else None,
            output_type=output_type.decode("latin-1"),
        )
        self._writer.put(self, item)


class CaptureWriter:
    """Buffers captured invocations and writes them in files; one per gateway."""

    def __init__(
        self,
        *,
        objects: ObjectStore,
        metrics: Metrics,
        flush_interval_s: float = 5.0,
        flush_records: int = 1000,
        max_buffer_records: int = 100_000,
        max_buffer_bytes: int = 64 << 20,
        close_timeout_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.objects = objects
        self.flush_interval_s = flush_interval_s
        self.flush_records = flush_records
        self.max_buffer_records = max_buffer_records
        self.max_buffer_bytes = max_buffer_bytes
        self.close_timeout_s = close_timeout_s
        self.random: Callable[[], float] = (rng or random.Random()).random
        self._counter = metrics.capture_records
        self._pending: list[tuple[VariantCapture, Captured]] = []
        self._bytes = 0
        self._wake = Wakeup()
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"CaptureWriter(pending={len(self._pending)}, every={self.flush_interval_s:g}s)"

    def for_variant(
        self, endpoint: str, variant: str, config: CaptureConfig | None
    ) -> VariantCapture | None:
        """The sampler of one variant, or None when nothing of it is to be captured."""
        if config is None or not config.enabled or config.sampling_percentage <= 0:
            return None
        if not (config.capture_input or config.capture_output):
            return None
        return VariantCapture(endpoint, variant, config, writer=self, counter=self._counter)

    def put(self, variant: VariantCapture, item: Captured) -> None:
        """Buffer one record, or drop and count it when the buffer is full."""
        size = item.size
        if (
            len(self._pending) >= self.max_buffer_records
            or self._bytes + size > self.max_buffer_bytes
        ):
            variant.dropped.inc()
            return
        self._pending.append((variant, item))
        self._bytes += size
        if len(self._pending) == self.flush_records:
            self._wake.set()

    async def run(self) -> None:
        """Flush every ``flush_interval_s``, or sooner when ``flush_records`` wait."""
        while True:
            await self._wake.wait(self.flush_interval_s)
            # Shielded: stopping the loop must not cut a write short and lose its
            # records; close() waits for it, then flushes the rest.
            await asyncio.shield(self.flush())

    async def close(self) -> None:
        """Flush everything buffered, giving up after ``close_timeout_s``; what could
        not be written by then is counted as failed."""
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await self.flush()
        except TimeoutError:
            log.warning("data capture: gave up writing buffered records at shutdown")
        for variant, _ in self._pending:
            variant.failed.inc()
        self._pending, self._bytes = [], 0

    async def flush(self) -> None:
        """Write what is buffered now: one file per variant and hour."""
        async with self._lock:
            batch, self._pending, self._bytes = self._pending, [], 0
            # One file per variant, config and hour: a republished route brings a new
            # VariantCapture for the same variant, whose records share its files.
            groups: dict[tuple[str, str, CaptureConfig, int], list[Captured]] = {}
            counted: dict[tuple[str, str, CaptureConfig, int], VariantCapture] = {}
            for variant, item in batch:
                key = (variant.endpoint, variant.variant, variant.config, hour_of(item.at))
                groups.setdefault(key, []).append(item)
                counted.setdefault(key, variant)
            todo = list(groups.items())
            try:
                while todo:
                    key, items = todo[0]
                    await self._write(counted[key], items)
                    todo.pop(0)
            except BaseException:
                for key, items in todo:
                    counted[key].failed.inc(len(items))
                raise

    async def _write(self, variant: VariantCapture, items: list[Captured]) -> None:
        key = file_key(variant.endpoint, variant.variant, items[0].at)
        uri = self.objects.join(variant.config.destination, key)
        try:
            data = await _encode(items, variant.config)
            await self.objects.write_bytes(uri, data)
        except Exception as exc:
            # Any failure, ours or the store's: capture must never take the loop down.
            variant.failed.inc(len(items))
            log.warning("data capture: could not write %d records to %s: %s", len(items), uri, exc)
            return
        variant.written.inc(len(items))


async def _encode(items: list[Captured], config: CaptureConfig) -> bytes:
    """The file's bytes, encoded on the event loop in slices of ``_SLICE`` records.

    Not in a worker thread: encoding is pure Python, so a thread would hold the GIL
    for the interpreter's whole switch interval (5 ms) at a time and stall every
    request behind it; slices of about 1 ms let requests in between.
    """
    encoder = LineEncoder(config)
    parts = []
    for start in range(0, len(items), _SLICE):
        parts.append("".join(encoder.line(item) for item in items[start : start + _SLICE]))
        await asyncio.sleep(0)
    return "".join(parts).encode()
