"""The reference pages of the documentation, generated from the code so that they cannot
drift from it: ``make docs-reference`` writes them under docs/reference/, and a unit test
fails when a committed page differs from what the code generates now.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path

PAGES: dict[str, str] = {
    "settings.md": "settings_page",
    "stack-file.md": "stackfile_page",
    "api-coverage.md": "coverage_page",
    "errors.md": "errors_page",
    "metrics.md": "metrics_page",
    "cli.md": "cli_page",
}
"""Each page's file under docs/reference/ and the module (here) that renders it."""


def renderer(page: str) -> Callable[[], str]:
    """The function that renders ``page`` (a key of PAGES)."""
    module = import_module(f"{__name__}.{PAGES[page]}")
    render: Callable[[], str] = module.render
    return render


def write(folder: Path) -> list[Path]:
    """Write every page into ``folder``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for page in PAGES:
        path = folder / page
        path.write_text(renderer(page)())
        written.append(path)
    return written
