"""The disk cache and the handlers source of multi-model mode, in process.

Real files and the real ArtifactStore: artifacts are folders and archives under tmp_path.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from mme_models import write_model

from shipyard.errors import ArtifactError, ModelLoadFailed, ModelNotFound
from shipyard.runtime.disk_cache import DiskCache
from shipyard.runtime.model_source import HandlersSource, release_memory, rss_bytes
from shipyard.runtime.multimodel import ModelCache
from shipyard.storage.artifacts import ArtifactStore

KIB = 1024


def artifact(root: Path, name: str, size_bytes: int) -> str:
    """A folder artifact holding one file of ``size_bytes``; its URI."""
    folder = root / "artifacts" / name
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"w" * size_bytes)
    return str(folder)


def disk_cache(root: Path, max_bytes: int) -> DiskCache:
    return DiskCache(root=root / "cache", max_bytes=max_bytes, artifacts=ArtifactStore())


def cached_keys(cache: DiskCache) -> set[str]:
    return {path.name for path in cache.root.iterdir() if not path.name.startswith(".")}


def test_a_second_fetch_comes_from_disk(tmp_path: Path) -> None:
    cache = disk_cache(tmp_path, 100 * KIB)
    url = artifact(tmp_path, "a", KIB)
    path, download_s = cache.fetch(url)
    assert download_s is not None and (path / "weights.bin").exists()
    assert cache.fetch(url) == (path, None)


def test_unpinned_folders_are_evicted_least_recently_used_first(tmp_path: Path) -> None:
    cache = disk_cache(tmp_path, 25 * KIB)
    a, b, c = (artifact(tmp_path, name, 10 * KIB) for name in "abc")
    path_a, _ = cache.fetch(a)
    path_b, _ = cache.fetch(b)
    cache.fetch(a)  # a used again: b is now the coldest
    for url in (a, b, a):
        cache.unpin(url)
    cache.fetch(c)
    assert cached_keys(cache) == {path_a.name, cache.fetch(c)[0].name}
    assert not path_b.exists()


def test_pinned_folders_are_kept_beyond_the_bound(tmp_path: Path) -> None:
    """A loaded model may read its folder at any time, so the bound gives way."""
    cache = disk_cache(tmp_path, 15 * KIB)
    first, _ = cache.fetch(artifact(tmp_path, "a", 10 * KIB))
    second, _ = cache.fetch(artifact(tmp_path, "b", 10 * KIB))
    assert first.exists() and second.exists()
    assert cache.size_bytes > cache.max_bytes
    cache.unpin(str(tmp_path / "artifacts" / "a"))
    assert not first.exists() and second.exists()


def test_folders_of_an_earlier_run_are_adopted(tmp_path: Path) -> None:
    url = artifact(tmp_path, "a", KIB)
    path, _ = disk_cache(tmp_path, 100 * KIB).fetch(url)
    assert disk_cache(tmp_path, 100 * KIB).fetch(url) == (path, None)


def test_a_failed_fetch_leaves_nothing_pinned_or_cached(tmp_path: Path) -> None:
    cache = disk_cache(tmp_path, 100 * KIB)
    with pytest.raises(ArtifactError, match="Could not find"):
        cache.fetch(str(tmp_path / "missing"))
    assert cached_keys(cache) == set()
    assert cache.size_bytes == 0


PROGRAM = """
import helpers


def model_fn(model_dir):
    return helpers.VALUE
"""


def model_with_helper(root: Path, name: str, value: str) -> str:
    code = root / name / "code"
    code.mkdir(parents=True)
    (code / "inference.py").write_text(PROGRAM)
    (code / "helpers.py").write_text(f"VALUE = {value!r}\n")
    return str(root / name)


def test_each_model_imports_its_own_same_named_modules(tmp_path: Path) -> None:
    source = HandlersSource(disk=disk_cache(tmp_path, 10 * 2**20))
    first = model_with_helper(tmp_path, "first", "one")
    second = model_with_helper(tmp_path, "second", "two")

    async def scenario() -> list[object]:
        return [
            (await source.load(name, url)).model.model
            for name, url in [("1", first), ("2", second)]
        ]

    assert asyncio.run(scenario()) == ["one", "two"]
    assert "helpers" not in sys.modules and "inference" not in sys.modules
    assert not [entry for entry in sys.path if str(tmp_path) in entry]


def test_the_source_names_the_model_in_its_failures(tmp_path: Path) -> None:
    source = HandlersSource(disk=disk_cache(tmp_path, 10 * 2**20))
    broken = tmp_path / "prefix"
    write_model(broken, "broken.tar.gz", fail=True)

    async def scenario() -> None:
        with pytest.raises(ModelNotFound, match="Could not find model 'gone'"):
            await source.load("gone", str(tmp_path / "gone"))
        with pytest.raises(ModelLoadFailed, match="RuntimeError: weights of broken.tar.gz"):
            await source.load("broken.tar.gz", str(broken / "broken.tar.gz"))

    asyncio.run(scenario())


LIBRARY_USER = """
import sys

sys.path.insert(0, {library_dir!r})
import shipyard_test_big_library  # stays imported when the model goes, as numpy would


def model_fn(model_dir):
    return bytes(range(256)) * ({own_mib} << 12)  # resident: every byte written
"""


def model_using_library(root: Path, name: str, library_dir: Path, own_mib: int) -> str:
    code = root / name / "code"
    code.mkdir(parents=True)
    (code / "inference.py").write_text(
        LIBRARY_USER.format(library_dir=str(library_dir), own_mib=own_mib)
    )
    return str(root / name)


def test_the_budget_bounds_what_the_process_holds_once_the_importer_is_gone(
    tmp_path: Path,
) -> None:
    """The first model to import a library is charged for it, and the library stays when
    that model is unloaded. Counting only the loaded models' charges, six models of 8 MiB
    behind a 12 MiB library would hold 52 MiB under a budget of 40; counting what the
    unloads left, the cache unloads one more and the process stays within the budget."""
    mib = 2**20
    library_dir = tmp_path / "site"
    library_dir.mkdir()
    (library_dir / "shipyard_test_big_library.py").write_text(
        "HELD = bytes(range(256)) * (12 << 12)  # 12 MiB, resident\n"
    )
    urls = {
        f"m{i}": model_using_library(tmp_path / "models", f"m{i}", library_dir, own_mib=8)
        for i in range(1, 7)
    }
    source = HandlersSource(disk=disk_cache(tmp_path / "disk", 10 * 2**20))
    budget = 40 * mib

    async def scenario() -> list[tuple[int, int]]:
        cache = ModelCache(source=source, prefix=str(tmp_path), memory_budget_bytes=budget)
        release_memory()
        start = rss_bytes()
        held = []
        for name, url in urls.items():
            await cache.load(name, url)
            release_memory()
            held.append((rss_bytes() - start, cache.memory_bytes + cache.left_bytes))
        return held

    try:
        held = asyncio.run(scenario())
    finally:
        sys.modules.pop("shipyard_test_big_library", None)
        if str(library_dir) in sys.path:
            sys.path.remove(str(library_dir))
    for grown, counted in held:
        assert abs(grown - counted) <= 3 * mib, held  # what is counted is what is held
        assert grown <= budget + 3 * mib, held
    assert held[-1][0] >= 30 * mib  # the models did load: the library and 2-3 of them
