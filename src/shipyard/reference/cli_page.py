"""docs/reference/cli.md: every ``shipyard`` command's ``--help``, from the parser itself
(typer's commands, rendered in click's plain format at a fixed width)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
import typer.main

from shipyard.cli import app
from shipyard.reference.markdown import page

WIDTH = 88


def helps() -> Iterator[tuple[str, str]]:
    """(command path, its help text) for the root command and every command below it."""
    yield from _walk(typer.main.get_command(app), None, "shipyard")


def _walk(command: Any, parent: typer.Context | None, name: str) -> Iterator[tuple[str, str]]:
    command.rich_markup_mode = None  # plain text, not the terminal's boxes and colours
    ctx = typer.Context(
        command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
    )
    yield ctx.command_path, command.get_help(ctx)
    if hasattr(command, "list_commands"):
        for sub in command.list_commands(ctx):
            yield from _walk(command.get_command(ctx, sub), ctx, sub)


def render() -> str:
    sections = [f"## `{path}`\n\n```text\n{text.rstrip()}\n```\n" for path, text in helps()]
    return page(
        "Command line",
        "Every `shipyard` command and what its `--help` prints. A URL option's default "
        "is read from `SHIPYARD_URL` where the help says so.",
        *sections,
    )
