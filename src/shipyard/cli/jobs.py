"""``shipyard jobs``: submit, list, describe, watch, stop and read the logs of long-running jobs.

Each command builds one :class:`Gateway` and calls it. A gateway error becomes one red
line on stderr and exit code 1; ``watch`` (and ``submit --follow``) exits 1 as well when
the job ends Failed or Stopped, so scripts can wait on a job with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shipyard.cli.client import DEFAULT_URL, FINAL_STATUSES, Gateway
from shipyard.errors import GatewayError
from shipyard.records import JobStatus

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Long-running jobs: submit, list, describe, watch, stop and logs.",
)

_POLL_PERIOD_S = 0.5
_PIPE_WIDTH = 400
_STATUS_STYLES = {
    "InProgress": "yellow",
    "Completed": "green",
    "Failed": "red",
    "Stopping": "magenta",
    "Stopped": "magenta",
}

_out = Console(highlight=False)
if not _out.is_terminal:
    # Piped output keeps one line per row, for grep and friends, instead of wrapping at 80.
    _out.width = _PIPE_WIDTH

Url = Annotated[
    str, typer.Option("--url", envvar="SHIPYARD_URL", help="Gateway URL.", show_envvar=True)
]
Follow = Annotated[bool, typer.Option("--follow", "-f", help="Keep going until the job ends.")]


@app.command()
def submit(
    job_type: Annotated[str, typer.Argument(metavar="TYPE", help="A white-listed job type.")],
    follow: Follow = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Schedule a job of TYPE through POST /inference."""
    with _reported():
        gateway = Gateway(url)
        done = gateway.submit(job_type)
        _out.print(
            Text.assemble(
                "Scheduled job ",
                (done.job_name, "bold"),
                f" ({done.slots_remaining} slot{'' if done.slots_remaining == 1 else 's'}"
                " remaining).",
            )
        )
        if follow:
            _watch(gateway, done.job_name)


@app.command("list")
def list_jobs(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")] = None,
    name_contains: Annotated[str | None, typer.Option(help="Only names containing this.")] = None,
    max_jobs: Annotated[int, typer.Option("--max", min=1, help="At most this many jobs.")] = 100,
    url: Url = DEFAULT_URL,
) -> None:
    """List jobs, newest first."""
    with _reported():
        jobs = Gateway(url).list_jobs(
            status=status.value if status else None, name_contains=name_contains, limit=max_jobs
        )
    _out.print(_jobs_table(jobs) if jobs else "No jobs.")


@app.command()
def describe(
    name: Annotated[str, typer.Argument(help="Job name.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="DescribeTrainingJob's output as JSON.")
    ] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Show a job's status, times and status transitions."""
    with _reported():
        job = Gateway(url).describe(name)
    if as_json:
        typer.echo(json.dumps(job, indent=2, default=_iso))
    else:
        _out.print(_job_view(job))


@app.command()
def watch(name: Annotated[str, typer.Argument(help="Job name.")], url: Url = DEFAULT_URL) -> None:
    """Show a job's status live until it ends; exit 1 unless it Completed."""
    with _reported():
        _watch(Gateway(url), name)


@app.command()
def stop(name: Annotated[str, typer.Argument(help="Job name.")], url: Url = DEFAULT_URL) -> None:
    """Stop a job: SIGTERM, then SIGKILL after the grace period."""
    with _reported():
        Gateway(url).stop(name)
    _out.print(Text.assemble("Stopping job ", (name, "bold"), "."))


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="Job name.")],
    follow: Follow = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Print a job's log; with --follow, keep printing until the job ends."""
    with _reported():
        _print_logs(Gateway(url), name, follow=follow)


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """A gateway error becomes one red line on stderr and exit code 1."""
    try:
        yield
    except GatewayError as exc:
        typer.secho(f"error: {' '.join(str(exc).split())}", fg="red", err=True)
        raise typer.Exit(1) from None


def _print_logs(gateway: Gateway, name: str, *, follow: bool) -> None:
    """Copy the log to stdout; the gateway's status says whether more can come."""
    out = sys.stdout.buffer
    offset = 0
    while True:
        chunk = gateway.logs(name, offset)
        try:
            out.write(chunk.data)
            out.flush()
        except BrokenPipeError:
            # The reader (head, less) has gone: stop quietly, as cat does, and keep the
            # interpreter's last flush at exit from failing again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return
        offset = chunk.next_offset
        if chunk.data:
            continue
        if not follow or chunk.final:
            return
        time.sleep(_POLL_PERIOD_S)


class _JobPanel:
    """The latest description of a job; rendered afresh so elapsed time counts between polls."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job

    def __rich__(self) -> RenderableType:
        return _job_view(self.job)


def _watch(gateway: Gateway, name: str) -> None:
    """A live view of the job until it ends; exit 1 when it ends Failed or Stopped."""
    panel = _JobPanel(gateway.describe(name))
    with Live(panel, console=_out, refresh_per_second=4):
        while panel.job["TrainingJobStatus"] not in FINAL_STATUSES:
            time.sleep(_POLL_PERIOD_S)
            panel.job = gateway.describe(name)
    status = panel.job["TrainingJobStatus"]
    if status == "Completed":
        return
    if status == "Failed":
        reason = " ".join(panel.job.get("FailureReason", "no reason given").split())
        typer.secho(f"{name} failed: {reason}", fg="red", err=True)
    else:
        typer.secho(f"{name} was stopped.", fg="red", err=True)
    raise typer.Exit(1)


def _jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("Name", "Status", "Secondary status", "Created", "Ended")
    table.columns[0].no_wrap = True
    for job in jobs:
        table.add_row(
            job["TrainingJobName"],
            _status(job["TrainingJobStatus"]),
            job.get("SecondaryStatus", ""),
            _when(job.get("CreationTime")),
            _when(job.get("TrainingEndTime")),
        )
    return table


def _job_view(job: dict[str, Any]) -> Group:
    """Key facts of a DescribeTrainingJob answer, then its SecondaryStatusTransitions."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    facts.add_row("Name", job["TrainingJobName"])
    facts.add_row("Status", _status(job["TrainingJobStatus"]))
    facts.add_row("Secondary status", job.get("SecondaryStatus", ""))
    facts.add_row("Created", _when(job.get("CreationTime")))
    facts.add_row("Started", _when(job.get("TrainingStartTime")))
    facts.add_row("Ended", _when(job.get("TrainingEndTime")))
    facts.add_row("Elapsed", _elapsed(job))
    if job.get("FailureReason"):
        facts.add_row("Failure reason", Text(job["FailureReason"], style="red"))
    artifacts = job.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if artifacts:
        facts.add_row("Model artifacts", artifacts)
    transitions = Table("Status", "Start", "End", "Message", title="Status transitions")
    for step in job.get("SecondaryStatusTransitions", []):
        transitions.add_row(
            step["Status"],
            _when(step.get("StartTime")),
            _when(step.get("EndTime")),
            step.get("StatusMessage", ""),
        )
    return Group(facts, transitions)


def _status(status: str) -> Text:
    return Text(status, style=_STATUS_STYLES.get(status, ""))


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _elapsed(job: dict[str, Any]) -> str:
    """From the start (or creation) to the end, or to now while the job runs."""
    start = job.get("TrainingStartTime") or job.get("CreationTime")
    if start is None:
        return ""
    end = job.get("TrainingEndTime") or datetime.now(UTC)
    seconds = max(0, int((end - start).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
