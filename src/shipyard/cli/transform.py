"""``shipyard transform``: list, describe, watch and stop batch transform jobs.

Progress (objects and records done, of how many objects) comes from the gateway's
``/metrics``: DescribeTransformJob keeps SageMaker's exact shape, which has none. ``watch``
shows a live progress bar and exits 1 unless the job Completed.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from shipyard.cli.client import DEFAULT_URL, FINAL_STATUSES, Gateway, Transforms
from shipyard.cli.client import Progress as JobProgress
from shipyard.cli.jobs import _iso, _out, _reported, _status, _when
from shipyard.records import JobStatus

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Batch transform jobs: list, describe, watch and stop.",
)

_POLL_PERIOD_S = 0.5

Url = Annotated[
    str, typer.Option("--url", envvar="SHIPYARD_URL", help="Gateway URL.", show_envvar=True)
]
Name = Annotated[str, typer.Argument(help="Transform job name.")]


@app.command("list")
def list_jobs(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")] = None,
    max_jobs: Annotated[int, typer.Option("--max", min=1, help="At most this many jobs.")] = 100,
    url: Url = DEFAULT_URL,
) -> None:
    """List transform jobs, newest first, with their progress."""
    with _reported():
        transforms = Transforms(Gateway(url))
        jobs = transforms.list(status=status.value if status else None, limit=max_jobs)
        rows = [(job, transforms.progress(job["TransformJobName"])) for job in jobs]
    if not rows:
        _out.print("No transform jobs.")
        return
    table = Table("Name", "Status", "Objects", "Records", "Created", "Ended")
    table.columns[0].no_wrap = True
    for job, progress in rows:
        table.add_row(
            job["TransformJobName"],
            _status(job["TransformJobStatus"]),
            _objects(progress),
            str(progress.records_done),
            _when(job.get("CreationTime")),
            _when(job.get("TransformEndTime")),
        )
    _out.print(table)


@app.command()
def describe(
    name: Name,
    as_json: Annotated[
        bool, typer.Option("--json", help="DescribeTransformJob's output as JSON.")
    ] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Show a transform job: status, model, input, output and progress."""
    with _reported():
        transforms = Transforms(Gateway(url))
        job = transforms.describe(name)
        progress = transforms.progress(name)
    if as_json:
        typer.echo(json.dumps(job, indent=2, default=_iso))
    else:
        _out.print(_view(job, progress))


@app.command()
def watch(name: Name, url: Url = DEFAULT_URL) -> None:
    """A live progress bar until the job ends; exit 1 unless it Completed."""
    with _reported():
        transforms = Transforms(Gateway(url))
        job = transforms.describe(name)
        bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("objects · {task.fields[records]} records · {task.fields[status]}"),
            TimeElapsedColumn(),
            console=_out,
        )
        with bar:
            task = bar.add_task(name, total=None, records=0, status=job["TransformJobStatus"])
            while True:
                progress = transforms.progress(name)
                bar.update(
                    task,
                    completed=progress.objects_done,
                    total=progress.objects_total,
                    records=progress.records_done,
                    status=job["TransformJobStatus"],
                )
                if job["TransformJobStatus"] in FINAL_STATUSES:
                    break
                time.sleep(_POLL_PERIOD_S)
                job = transforms.describe(name)
    status = job["TransformJobStatus"]
    if status == "Completed":
        return
    if status == "Failed":
        reason = " ".join(job.get("FailureReason", "no reason given").split())
        typer.secho(f"{name} failed: {reason}", fg="red", err=True)
    else:
        typer.secho(f"{name} was stopped.", fg="red", err=True)
    raise typer.Exit(1)


@app.command()
def stop(name: Name, url: Url = DEFAULT_URL) -> None:
    """Stop a transform job: its instances stop and it ends Stopped."""
    with _reported():
        Transforms(Gateway(url)).stop(name)
    _out.print(Text.assemble("Stopping transform job ", (name, "bold"), "."))


def _objects(progress: JobProgress) -> str:
    total = "?" if progress.objects_total is None else str(progress.objects_total)
    return f"{progress.objects_done}/{total}"


def _view(job: dict[str, Any], progress: JobProgress) -> RenderableType:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    source = job.get("TransformInput", {}).get("DataSource", {}).get("S3DataSource", {})
    facts.add_row("Name", job["TransformJobName"])
    facts.add_row("Status", _status(job["TransformJobStatus"]))
    facts.add_row("Model", job.get("ModelName", ""))
    facts.add_row("Input", source.get("S3Uri", ""))
    facts.add_row("Output", job.get("TransformOutput", {}).get("S3OutputPath", ""))
    facts.add_row("Objects", _objects(progress))
    facts.add_row("Records", str(progress.records_done))
    facts.add_row("Created", _when(job.get("CreationTime")))
    facts.add_row("Started", _when(job.get("TransformStartTime")))
    facts.add_row("Ended", _when(job.get("TransformEndTime")))
    if job.get("FailureReason"):
        facts.add_row("Failure reason", Text(job["FailureReason"], style="red"))
    return Group(facts)
