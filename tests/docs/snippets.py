"""The code blocks of the README and the pages under docs/, read from their Markdown.

A fenced block is ```` ```python ````, ```` ```bash ```` or ```` ```sh ````; other fences
(yaml, text) are prose unless they are files (below). What the runner does with a block
is said in the Markdown, in HTML comments a reader of the rendered page does not see:

- ``<!-- snippet: skip (why) -->`` before a fence (blank lines between): the block is not run, and
  the test reports it skipped with that reason. Every skip says why.
- ``<!-- snippet: gateway -->`` before a fence holding ``shipyard serve ARGS``: the
  page's gateway is started with those arguments (each port they name replaced by a free
  one, and that port replaced in the page's later blocks) rather than the block run.
- ``<!-- snippet: setup NAME, ... -->`` anywhere on a page: what the page's text says the
  reader already has (the quickstart's clients, its model folder, the endpoint
  ``scores``); the runner makes it before the page's first block (tests/docs/setups.py).

A block whose first line is a comment naming a file (``# stack.yaml``,
``# code/inference.py``), in any language, is that file's content: the runner writes it
into the page's folder rather than running it. Any other ``<!-- snippet: ... -->`` is an
error, so that a misspelt marker cannot quietly skip a block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = {"python": "python", "py": "python", "bash": "bash", "sh": "bash"}

_FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(.*?)-->\s*$")
_SKIP = re.compile(r"^\s*skip\s*\((.+)\)\s*$")
_GATEWAY = re.compile(r"^\s*gateway\s*$")
_SETUP = re.compile(r"^\s*setup\s+([\w, -]+?)\s*$")
_FILE = re.compile(r"^#\s*([\w.-]+(?:/[\w.-]+)*\.(?:py|ya?ml|json|csv|txt))\b")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, what it is, and what the runner does with it."""

    page: str
    """The page's path from the repository's root."""
    line: int
    """The line of its first line of code (1-based), so that tracebacks point into the page."""
    language: str
    """``python`` or ``bash``; for a file, the fence's own word."""
    code: str
    skip: str | None = None
    """Why it is not run, from its marker; None when it runs."""
    file: str | None = None
    """The path it is the content of, relative to the page's folder; None for code to run."""
    serves: bool = False
    """Whether it is the command starting the page's gateway (a ``gateway`` marker)."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Page:
    path: str
    setups: tuple[str, ...]
    blocks: tuple[Block, ...]


class MarkerError(ValueError):
    """A ``<!-- snippet: ... -->`` the runner does not understand, or one out of place."""


def pages() -> list[Path]:
    """The README and every page of the site, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def read_page(path: Path, name: str | None = None) -> Page:
    """The page's runnable blocks and files, and its setups; ``name`` is the page's path
    from the repository's root, worked out when not given."""
    name = name or path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    setups: list[str] = []
    blocks: list[Block] = []
    pending_skip: str | None = None
    pending_serves = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if (marker := _MARKER.match(line)) is not None:
            if (setup := _SETUP.match(marker.group(1))) is not None:
                setups += [s.strip() for s in setup.group(1).split(",") if s.strip()]
            else:
                pending_skip, pending_serves = _block_marker(marker.group(1), lines, i, name)
            i += 1
            continue
        if (fence := _FENCE.match(line)) is not None and fence.group(2):
            ticks, language = fence.group(1), fence.group(2).lower()
            end = i + 1
            while end < len(lines) and lines[end].strip() != ticks:
                end += 1
            code = "\n".join(lines[i + 1 : end]) + "\n"
            first = lines[i + 1] if i + 1 < end else ""
            if (named := _FILE.match(first)) is not None:
                blocks.append(Block(name, i + 2, language, code, pending_skip, named.group(1)))
            elif language in RUNNABLE:
                blocks.append(
                    Block(name, i + 2, RUNNABLE[language], code, pending_skip, None, pending_serves)
                )
            elif pending_skip is not None or pending_serves:
                raise MarkerError(f"{name}:{i}: a marker before a block that never runs")
            pending_skip, pending_serves = None, False
            i = end + 1
            continue
        i += 1
    return Page(name, tuple(setups), tuple(blocks))


def _block_marker(body: str, lines: list[str], i: int, name: str) -> tuple[str | None, bool]:
    """A marker of the next block: why it is skipped (or None), whether it serves."""
    if not _opens_fence(lines, i + 1):
        raise MarkerError(f"{name}:{i + 1}: not a snippet marker before a fence: {lines[i]!r}")
    if (skip := _SKIP.match(body)) is not None:
        return skip.group(1).strip(), False
    if _GATEWAY.match(body) is not None:
        return None, True
    raise MarkerError(
        f"{name}:{i + 1}: not a snippet marker: {lines[i].strip()!r} "
        "(skip (why), gateway, or setup NAME, ...)"
    )


def _opens_fence(lines: list[str], i: int) -> bool:
    """Whether the next line that is not blank opens a fence."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i < len(lines) and (fence := _FENCE.match(lines[i])) is not None and bool(fence[2])
