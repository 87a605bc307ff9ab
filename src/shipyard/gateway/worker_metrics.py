"""``/metrics`` under ``shipyard serve --workers N``: every worker's series, whichever
worker answers.

Workers share one port, so a scrape reaches one of them, and each keeps its own counters
(a request is counted by the worker that took it). Each worker serves its registry on a
Unix socket of its own in a folder the supervisor made for them alone (mode 0700,
``Settings.worker_peers``); the worker answering ``/metrics`` reads the others' at once and
gives every series with a ``worker`` label (``"0"`` … ``"N-1"``), so ``sum without
(worker)`` is the gateway's total. A worker that does not answer within
``_READ_TIMEOUT_S`` (restarting, say) is left out of that scrape and named in the log.
A gateway on its own has no such folder, and its ``/metrics`` is as it always was.

The exposition format is prometheus_client's, read back by its own parser: no format of
ours in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from shipyard.settings import Settings

_READ_TIMEOUT_S = 2.0
_MAX_BYTES = 64 * 1024 * 1024
"""More than any registry here renders; a peer sending more is left out."""
log = logging.getLogger(__name__)


class WorkerMetrics:
    """Worker ``index`` of ``count``: serves its ``registry`` to the others, and reads
    theirs for its ``/metrics``."""

    def __init__(self, registry: CollectorRegistry, folder: Path, index: int, count: int):
        self.registry = registry
        self.folder = folder
        self.index = index
        self.count = count
        self._server: asyncio.AbstractServer | None = None

    def __repr__(self) -> str:
        return f"WorkerMetrics(worker={self.index} of {self.count}, folder={self.folder})"

    @classmethod
    def of(cls, registry: CollectorRegistry, settings: Settings) -> WorkerMetrics | None:
        """A worker's, under ``shipyard serve --workers``; None for a gateway alone."""
        folder, index = settings.worker_peers, settings.worker
        if folder is None or index is None or settings.workers < 2:
            return None
        return cls(registry, folder, index, settings.workers)

    def _path(self, index: int) -> str:
        return str(self.folder / f"{index}.sock")

    async def start(self) -> None:
        path = self._path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this worker's previous process
        self._server = await asyncio.start_unix_server(self._serve, path=path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(self.index))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(generate_latest(self.registry))
            await writer.drain()
        except ConnectionError:
            pass  # the asking worker gave up
        finally:
            writer.close()

    async def gathered(self) -> CollectorRegistry:
        """Every worker's series, each labelled with its worker: a registry to render."""
        others = [n for n in range(self.count) if n != self.index]
        texts = await asyncio.gather(*(self._read(n) for n in others))
        # Its own read back from text too, so that every worker's families come alike.
        own = generate_latest(self.registry).decode()
        families: list[tuple[str, Iterable[Metric]]] = []
        for n, text in sorted([(self.index, own), *zip(others, texts, strict=True)]):
            if text is not None:
                families.append((str(n), text_string_to_metric_families(text)))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Labelled(families))
        return registry

    async def _read(self, index: int) -> str | None:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(self._path(index))
                try:
                    while size <= _MAX_BYTES and (chunk := await reader.read(1 << 16)):
                        chunks.append(chunk)
                        size += len(chunk)
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            log.warning("/metrics: worker %d did not answer (%r); left out", index, exc)
            return None
        if size > _MAX_BYTES:
            log.warning("/metrics: worker %d answered over %d bytes; left out", index, _MAX_BYTES)
            return None
        return b"".join(chunks).decode()


class _Labelled(Collector):
    """Families from several workers, merged by name, each sample with its ``worker``."""

    def __init__(self, sources: list[tuple[str, Iterable[Metric]]]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for worker, families in self.sources:
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                elif into.type != family.type:
                    continue  # one name, two kinds: only during an upgrade; keep the first
                into.samples.extend(
                    s._replace(labels={**s.labels, "worker": worker}) for s in family.samples
                )
        yield from merged.values()
