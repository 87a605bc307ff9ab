"""DiskCache: fetched model artifacts on local disk, least recently used out first.

A multi-model instance unloads models from memory to make room and often wants them back
soon after; reloading from this cache skips the download and the extraction.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from threading import Lock

from shipyard.storage.artifacts import COMPLETE_MARKER, ArtifactStore

log = logging.getLogger(__name__)

_TRASH_PREFIX = ".trash-"


@dataclass(slots=True)
class _Slot:
    size_bytes: int
    last_use: int  # a counter, not a clock: adopted folders have only their mtime order


class DiskCache:
    """One folder per artifact URI under ``root``, within ``max_bytes`` when it can.

    Guarantees: a folder is whole or absent (ArtifactStore.fetch_model builds it aside and
    renames it into place). A folder is *pinned* from its fetch until ``unpin``, which the
    source calls once the model is unloaded from memory, and a pinned folder is never
    removed, because user code may read its model directory at any time. So the bound is
    soft: pinned folders alone may exceed it. Folders left by an earlier run of the process
    are adopted, oldest first. Safe to call from several threads.

    Failure modes: a URI's folder is never compared with its source again, so an artifact
    replaced at the same URI is served from the old copy until evicted (SageMaker gives the
    same advice: upload a changed model under a new name). The cache belongs to one
    process: another process's evictions would remove folders this one is using.
    """

    def __init__(self, *, root: Path, max_bytes: int, artifacts: ArtifactStore) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._artifacts = artifacts
        self._lock = Lock()
        self._slots: dict[str, _Slot] = {}
        self._pins: Counter[str] = Counter()
        self._uses = itertools.count()
        root.mkdir(parents=True, exist_ok=True)
        self._adopt()

    def __repr__(self) -> str:
        return f"DiskCache(root={str(self.root)!r}, max_bytes={self.max_bytes})"

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(slot.size_bytes for slot in self._slots.values())

    def fetch(self, url: str) -> tuple[Path, float | None]:
        """The local folder of ``url``, pinned, and the seconds spent fetching it (None: cached).

        Raises:
            ArtifactError: as ArtifactStore.fetch_model; nothing stays pinned.
        """
        key = _key(url)
        dest = self.root / key
        with self._lock:
            self._pins[key] += 1  # before looking, so no eviction can remove it under us
            slot = self._slots.get(key)
            if slot is not None and (dest / COMPLETE_MARKER).exists():
                slot.last_use = next(self._uses)
                return dest, None
        try:
            started_s = time.perf_counter()
            self._artifacts.fetch_model(url, dest)
            download_s = time.perf_counter() - started_s
            size_bytes = _tree_bytes(dest)
        except BaseException:
            self.unpin(url)
            raise
        with self._lock:
            self._slots[key] = _Slot(size_bytes, next(self._uses))
            doomed = self._take_over_bound()
        _remove(doomed)
        return dest, download_s

    def unpin(self, url: str) -> None:
        """One fetch of ``url`` no longer needs its folder; it may be evicted once unpinned."""
        key = _key(url)
        with self._lock:
            self._pins[key] -= 1
            if self._pins[key] <= 0:
                del self._pins[key]
            doomed = self._take_over_bound()
        _remove(doomed)

    def _take_over_bound(self) -> list[Path]:
        """Move least recently used unpinned folders aside until the rest fit; hold the lock.

        Renamed under the lock, removed outside it: a fetch that pins the key afterwards
        finds no folder and fetches again, instead of using one being deleted.
        """
        total = sum(slot.size_bytes for slot in self._slots.values())
        doomed: list[Path] = []
        for key, slot in sorted(self._slots.items(), key=lambda item: item[1].last_use):
            if total <= self.max_bytes:
                break
            if self._pins[key] > 0:
                continue
            del self._slots[key]
            total -= slot.size_bytes
            trash = self.root / f"{_TRASH_PREFIX}{key}-{uuid.uuid4().hex[:8]}"
            try:
                (self.root / key).rename(trash)
            except FileNotFoundError:
                continue
            (self.root / f".{key}.lock").unlink(missing_ok=True)  # ArtifactStore's lock file
            log.info("evicted %s (%d bytes) from the model disk cache", key, slot.size_bytes)
            doomed.append(trash)
        return doomed

    def _adopt(self) -> None:
        found: list[tuple[float, str, int]] = []
        for child in self.root.iterdir():
            if child.name.startswith(_TRASH_PREFIX):
                shutil.rmtree(child, ignore_errors=True)
            elif not child.name.startswith(".") and (child / COMPLETE_MARKER).exists():
                mtime = (child / COMPLETE_MARKER).stat().st_mtime
                found.append((mtime, child.name, _tree_bytes(child)))
        with self._lock:
            for _, key, size_bytes in sorted(found):
                self._slots[key] = _Slot(size_bytes, next(self._uses))
            doomed = self._take_over_bound()
        _remove(doomed)


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:32]


def _tree_bytes(folder: Path) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
