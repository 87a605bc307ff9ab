"""``/metrics`` under ``shipyard serve --workers N``: every worker's series, whichever
worker answers.

Workers share one port, so a scrape reaches one of them, and each keeps its own counters
(a request is counted by the worker that took it). Each worker serves its registry on a
Unix socket of its own in a folder the supervisor made for them alone (mode 0700,
``Settings.worker_peers``, hidden from sandboxes); the worker answering ``/metrics``
reads the others' at once and gives every series with a ``worker`` label (``"0"`` …
``"N-1"``). A worker that does not answer within ``_READ_TIMEOUT_S`` (restarting, say),
or whose text comes cut short, is left out of that scrape and named in the log. A gateway
on its own has no such folder, and its ``/metrics`` is as it always was; so is a worker
whose socket path would be too long for the system, which says so once.

The text is prometheus_client's exposition. Each worker labels its own samples as it
renders them, and the answering worker groups the families of all of them by name: a
pass over lines, with no parser, so a scrape costs the event loop little more than
rendering its own registry. A key scoped to some resources gets the same series less
those it cannot reach (gateway/ops/routes.py, which reads the text back with prometheus_client's
parser, off the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

if TYPE_CHECKING:
    from shipyard.settings import Settings

_READ_TIMEOUT_S = 2.0
_MAX_BYTES = 64 * 1024 * 1024
"""More than any registry here renders; a peer sending more is left out."""
_END = b"# EOF\n"
"""What a worker ends its text with: a text without it was cut short, and is left out."""
_MAX_SOCKET_PATH = 100
"""Unix socket paths are limited to 107 bytes (Linux): a folder deeper than this leaves."""
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
        if len(os.fsencode(folder / f"{settings.workers - 1}.sock")) > _MAX_SOCKET_PATH:
            log.warning(
                "/metrics shows this worker's series alone: the folder %s (TMPDIR) is too "
                "deep for the workers' sockets",
                folder,
            )
            return None
        return cls(registry, folder, index, settings.workers)

    def _path(self, index: int) -> str:
        return str(self.folder / f"{index}.sock")

    async def start(self) -> None:
        path = self._path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this worker's previous process
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=path)
        except OSError as exc:  # the others leave this worker out; it still serves
            log.warning("worker %d cannot serve its metrics to the others: %r", self.index, exc)

    async def close(self) -> None:
        """Stop serving; answers under way finish on their own (none is awaited: a peer
        that reads slowly does not hold this worker's stop)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(self.index))

    def render(self) -> bytes:
        """This worker's registry, each sample labelled with its worker, ended by
        ``_END``."""
        return _labelled(generate_latest(self.registry), str(self.index).encode()) + _END

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(self.render())
            await writer.drain()
        except ConnectionError:
            pass  # the asking worker gave up
        finally:
            writer.close()

    async def exposition(self) -> bytes:
        """Every worker's series, labelled, as one exposition (scoped, where the key is,
        by ops.py)."""
        others = [n for n in range(self.count) if n != self.index]
        texts = [self.render(), *await asyncio.gather(*(self._read(n) for n in others))]
        return await asyncio.to_thread(_grouped, [t for t in texts if t is not None])

    async def _read(self, index: int) -> bytes | None:
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
        text = b"".join(chunks)
        if size > _MAX_BYTES or not text.endswith(_END):
            log.warning("/metrics: worker %d's answer was cut short or too long; left out", index)
            return None
        return text[: -len(_END)]


def _labelled(text: bytes, worker: bytes) -> bytes:
    """``text`` with ``worker="<worker>"`` first among each sample's labels. A sample
    line is its metric's name, then ``{labels}`` or a space: a name holds neither."""
    out = []
    label = b'worker="' + worker + b'"'
    for line in text.splitlines(keepends=True):
        if line.startswith(b"#") or not line.strip():
            out.append(line)
            continue
        brace, space = line.find(b"{"), line.find(b" ")
        if brace != -1 and (space == -1 or brace < space):
            out.append(line[: brace + 1] + label + b"," + line[brace + 1 :])
        else:
            out.append(line[:space] + b"{" + label + b"}" + line[space:])
    return b"".join(out)


def _grouped(texts: list[bytes]) -> bytes:
    """The families of several expositions, each once: its ``# HELP`` and ``# TYPE`` from
    the first text that has it, then every text's samples of it, in order."""
    families: dict[bytes, list[bytes]] = {}
    for text in texts:
        name = b""
        for line in text.splitlines(keepends=True):
            if line.startswith(b"# HELP "):
                name = line.split(b" ", 3)[2]
                if name in families:
                    continue
                families[name] = [line]
            elif line.startswith(b"# TYPE "):
                if len(families[name]) == 1:  # the first text's TYPE only
                    families[name].append(line)
            elif name:
                families[name].append(line)
    return b"".join(line for lines in families.values() for line in lines)
