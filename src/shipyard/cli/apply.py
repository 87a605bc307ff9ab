"""``shipyard apply`` and ``shipyard destroy``: a stack file converged on a running gateway.

Both read the file, print a plan (one row per resource: create, update, delete or
unchanged), ask before changing anything unless ``--yes``, then converge with a live
view of the endpoints they wait for. What a stack owns, and so what "delete" may touch,
is explained in cli/stack.py. Exit codes: 0 done (or nothing to do), 1 declined or the
gateway failed, 2 the file is not a valid stack file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from shipyard.cli.client import DEFAULT_URL, Gateway
from shipyard.cli.jobs import _out, _reported

if TYPE_CHECKING:
    from shipyard.cli.stack import Plan
    from shipyard.stackfile import StackFile

# The stack modules (and pydantic, under settings) are imported by the commands that use
# them: every other command would pay about 0.3 s for them at start.

_ACTION_STYLES = {"create": "green", "update": "yellow", "delete": "red", "unchanged": "dim"}
_STARTUP_SECTIONS = ("autoscaling", "auth", "account_id", "allow_hosts")
"""Sections the gateway reads when it starts (``serve --config``), which apply leaves."""

File = Annotated[Path, typer.Argument(help="Stack file (YAML).", show_default=False)]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before changing anything.")]
StackName = Annotated[
    str | None,
    typer.Option(help="Name the stack's resources are tagged with (default: the file's stem)."),
]
Timeout = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for each endpoint change.")
]
Url = Annotated[
    str, typer.Option("--url", envvar="SHIPYARD_URL", help="Gateway URL.", show_envvar=True)
]


def apply(
    file: File,
    yes: Yes = False,
    stack_name: StackName = None,
    timeout: Timeout = 600.0,
    url: Url = DEFAULT_URL,
) -> None:
    """Converge a running gateway to a stack file: plan, confirm, apply."""
    from shipyard.cli.stack import plan_apply

    name = stack_name or file.stem
    stack = _load(file, shapes_of=name)
    with _reported():
        gateway = Gateway(url)
        plan = plan_apply(gateway, name, stack)
    _show(plan, f"Plan for stack {name} ({file})")
    left = [s for s in _STARTUP_SECTIONS if s in stack.model_fields_set]
    if left:
        _out.print(
            Text(
                f"{', '.join(left)}: read by the gateway when it starts "
                "(shipyard serve --config FILE); apply leaves them as they are.",
                style="yellow",
            )
        )
    _carry_out(gateway, plan, yes=yes, verb="Apply", timeout_s=timeout)


def destroy(
    file: File,
    yes: Yes = False,
    stack_name: StackName = None,
    timeout: Timeout = 600.0,
    url: Url = DEFAULT_URL,
) -> None:
    """Delete what a stack file declares and its stack created; nothing else."""
    from shipyard.cli.stack import plan_destroy

    stack = _load(file)
    name = stack_name or file.stem
    with _reported():
        gateway = Gateway(url)
        plan = plan_destroy(gateway, name, stack)
    if not plan.changes:
        _out.print(f"Nothing of stack {name} to destroy.")
        return
    _show(plan, f"Destroy stack {name} ({file})")
    _carry_out(gateway, plan, yes=yes, verb="Destroy", timeout_s=timeout)


def _load(file: Path, *, shapes_of: str | None = None) -> StackFile:
    """The stack file, or its errors (file:line: field: message) and exit 2.

    With ``shapes_of`` (the stack's name), its bodies are also checked against the calls
    that create them and what the gateway refuses in them (cli/shapes.py), so a file that
    one of them would refuse changes nothing.
    """
    from shipyard.stackfile import StackFile

    try:
        stack = StackFile.load(file)
    except ValueError as exc:
        _refuse(str(exc).splitlines())
    if shapes_of is not None:
        from shipyard.cli.shapes import check

        if errors := check(file, stack, shapes_of):
            _refuse(errors)
    return stack


def _refuse(errors: list[str]) -> NoReturn:
    """Report a bad stack file, one error a line, and exit 2."""
    for line in errors:
        typer.secho(f"error: {line}", fg="red", err=True)
    raise typer.Exit(2)


def _show(plan: Plan, title: str) -> None:
    from shipyard.cli.stack import Action

    table = Table("Resource", "Name", "Action", "Detail", title=title, title_justify="left")
    table.columns[1].no_wrap = True
    for change in plan.changes:
        table.add_row(
            str(change.kind),
            change.name,
            Text(change.action, style=_ACTION_STYLES[change.action]),
            change.detail,
        )
    _out.print(table)
    counts = [
        f"{plan.count(a)} {'unchanged' if a is Action.UNCHANGED else f'to {a}'}"
        for a in Action
        if plan.count(a)
    ]
    _out.print(", ".join(counts).capitalize() + "." if counts else "The file declares nothing.")


def _carry_out(gateway: Gateway, plan: Plan, *, yes: bool, verb: str, timeout_s: float) -> None:
    from shipyard.cli.converge import converge

    if not plan.pending:
        _out.print("Nothing to change.")
        return
    if not yes and not typer.confirm(f"{verb} these changes?", default=False):
        typer.secho(f"{verb} declined: nothing changed.", fg="red", err=True)
        raise typer.Exit(1)
    if not (plan.endpoints or plan.endpoints_removed):
        with _reported():
            converge(gateway, plan, on_progress=lambda *_: None, timeout_s=timeout_s)
        _out.print(f"{verb} complete: {len(plan.pending)} change(s).")
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("endpoint [bold]{task.description}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=_out,
    )
    tasks: dict[str, TaskID] = {}

    def on_progress(endpoint: str, status: str) -> None:
        if endpoint not in tasks:
            tasks[endpoint] = progress.add_task(endpoint, total=None, status=status)
        progress.update(tasks[endpoint], status=status)

    with _reported(), progress:
        converge(gateway, plan, on_progress=on_progress, timeout_s=timeout_s)
    _out.print(f"{verb} complete: {len(plan.pending)} change(s).")
