"""The console in a real browser: Debian's chromium, driven by Playwright for Python.

``make install-dev`` installs chromium with apt-get where it can; where it is still
missing these tests skip, saying so. Every page a test opens is watched for console
errors and uncaught exceptions, and a test fails on any it did not expect.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The screenshots of docs/guides/console.md are taken by these tests:
# SHIPYARD_CONSOLE_SCREENSHOTS=docs/console refreshes them; otherwise they go to a scratch
# folder, so a test run leaves the tree as is.
SCREENSHOTS = Path(
    os.environ.get("SHIPYARD_CONSOLE_SCREENSHOTS")
    or Path(tempfile.gettempdir()) / "shipyard-console-screenshots"
).resolve()
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


@dataclass
class Tab:
    """One page in its own browser context, with what went wrong in it so far."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str, *, full_page: bool = True) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / name), full_page=full_page)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip(
            "Debian's chromium is not installed and could not be (make install-dev runs "
            "apt-get install -y chromium where apt-get works)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def open_tab(browser: Any) -> Iterator[Callable[..., Tab]]:
    """``open_tab(url, viewport=DESKTOP)``: a fresh context (own sessionStorage) per tab."""
    contexts: list[Any] = []

    def create(url: str, *, viewport: dict[str, int] | None = None) -> Tab:
        context = browser.new_context(viewport=viewport or DESKTOP)
        context.set_default_timeout(20_000)
        contexts.append(context)
        page = context.new_page()
        tab = Tab(page)

        def on_console(message: Any) -> None:
            if message.type == "error":
                tab.errors.append(f"console.{message.type}: {message.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda e: tab.errors.append(f"pageerror: {e}"))
        page.goto(url)
        return tab

    yield create
    for context in contexts:
        context.close()
