"""bench/README.md indexes bench/: every file and folder directly in `bench/` and in
`bench/peer/` is named in the first column of a table under its "What is here" section, and
every name there is a file or folder that exists. Folders other than `peer/` (`results/`,
`models/`, `peer_apps/`) are indexed as one entry each."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
README = BENCH / "README.md"
SECTION = "## What is here"
_CODE = re.compile(r"`([^`]+)`")
_SEPARATOR = re.compile(r"^\|[\s|:-]+\|$")


def _indexed(text: str) -> set[str]:
    """The names in the first column of the tables of the index section (none without it)."""
    if SECTION not in text:
        return set()
    start = text.index(SECTION) + len(SECTION)
    following = re.search(r"^## ", text[start:], re.MULTILINE)
    section = text[start : start + following.start()] if following else text[start:]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("|") or _SEPARATOR.match(line):
            continue
        first = line.split("|")[1]
        names.update(_CODE.findall(first))
    return names


def _entries(folder: Path, prefix: str = "") -> set[str]:
    """A folder's files and folders (folders ending in "/"), as the index names them."""
    return {
        prefix + path.name + ("/" if path.is_dir() else "")
        for path in folder.iterdir()
        if not path.name.startswith(".") and path.name != "__pycache__"
    }


def _expected() -> set[str]:
    expected = _entries(BENCH) - {"README.md", "peer/"}
    return expected | _entries(BENCH / "peer", prefix="peer/")


def test_every_file_and_folder_of_bench_is_named_in_its_readme() -> None:
    missing = sorted(_expected() - _indexed(README.read_text()))
    assert not missing, f"bench/README.md, {SECTION!r}, does not name: {', '.join(missing)}"


def test_every_name_in_the_bench_index_is_there() -> None:
    stale = sorted(name for name in _indexed(README.read_text()) if not (BENCH / name).exists())
    assert not stale, f"bench/README.md, {SECTION!r}, names what bench/ does not hold: {stale}"


def test_the_index_reads_the_first_column_of_its_tables() -> None:
    text = "\n".join(
        [
            "# bench",
            SECTION,
            "| file | what |",
            "|---|---|",
            "| `a.py`, `peer/b.sh` | runs `c.py` |",
            "## Running",
            "| `d.py` | elsewhere |",
        ]
    )
    assert _indexed(text) == {"a.py", "peer/b.sh"}
