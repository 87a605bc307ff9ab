"""``shipyard endpoints``: list, describe, invoke, delete and read the logs of endpoints.

Each command builds one :class:`Endpoints` over a :class:`Gateway` and calls it. A gateway
error (a ModelError from ``invoke`` included) becomes one red line on stderr and exit 1.
Instance health comes from the gateway's ``/metrics``; logs from its CloudWatch Logs door
(group ``/aws/sagemaker/Endpoints/<name>``, one stream per instance).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from shipyard.cli.client import DEFAULT_URL, Endpoints, Gateway
from shipyard.cli.jobs import _iso, _out, _print_logs, _reported, _when
from shipyard.errors import GatewayError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Endpoints: list, describe, invoke, delete and logs.",
)

_POLL_PERIOD_S = 0.5
_STATUS_STYLES = {
    "InService": "green",
    "Creating": "yellow",
    "Updating": "yellow",
    "SystemUpdating": "yellow",
    "RollingBack": "magenta",
    "Deleting": "magenta",
    "OutOfService": "red",
    "Failed": "red",
}

Url = Annotated[
    str, typer.Option("--url", envvar="SHIPYARD_URL", help="Gateway URL.", show_envvar=True)
]
Name = Annotated[str, typer.Argument(help="Endpoint name.")]


@app.command("list")
def list_endpoints(
    name_contains: Annotated[str | None, typer.Option(help="Only names containing this.")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """List endpoints, newest first."""
    with _reported():
        endpoints = Endpoints(Gateway(url)).summaries(name_contains=name_contains)
    if not endpoints:
        _out.print("No endpoints.")
        return
    table = Table("Name", "Status", "Created", "Modified")
    table.columns[0].no_wrap = True
    for endpoint in endpoints:
        table.add_row(
            endpoint["EndpointName"],
            _status(endpoint["EndpointStatus"]),
            _when(endpoint.get("CreationTime")),
            _when(endpoint.get("LastModifiedTime")),
        )
    _out.print(table)


@app.command()
def describe(
    name: Name,
    as_json: Annotated[
        bool, typer.Option("--json", help="DescribeEndpoint's output as JSON.")
    ] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Show an endpoint: status, config, variants with their instances, failure reason."""
    with _reported():
        endpoints = Endpoints(Gateway(url))
        endpoint = endpoints.describe(name)
        if as_json:
            typer.echo(json.dumps(endpoint, indent=2, default=_iso))
            return
        try:
            config = endpoints.config(endpoint["EndpointConfigName"])
        except GatewayError:
            config = {}  # deleted since: the endpoint's own answer still says a lot
        health = endpoints.instance_health(name)
    _out.print(_view(endpoint, config, health))


@app.command()
def invoke(
    name: Name,
    body: Annotated[
        str | None, typer.Argument(help="Request body; without it, --file or stdin.")
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Read the body from this file ('-': stdin)."),
    ] = None,
    content_type: Annotated[
        str, typer.Option("--content-type", "-t", help="The body's media type.")
    ] = "application/json",
    accept: Annotated[str | None, typer.Option(help="Media type wanted back.")] = None,
    variant: Annotated[str | None, typer.Option(help="Send to this variant.")] = None,
    target_model: Annotated[
        str | None, typer.Option(help="Multi-model endpoints: the model to run.")
    ] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Send one request to an endpoint and print its answer to stdout."""
    payload = _body(body, file)
    with _reported():
        answer = Endpoints(Gateway(url)).invoke(
            name,
            payload,
            content_type=content_type,
            accept=accept,
            variant=variant,
            target_model=target_model,
        )
    out = sys.stdout.buffer
    out.write(answer.body)
    if sys.stdout.isatty() and not answer.body.endswith(b"\n"):
        out.write(b"\n")
    out.flush()


@app.command()
def delete(
    name: Name,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Delete an endpoint: its instances stop; its config and models are kept."""
    if not yes and sys.stdin.isatty():
        typer.confirm(f"Delete endpoint {name}?", abort=True)
    with _reported():
        Endpoints(Gateway(url)).delete(name)
    _out.print(Text.assemble("Deleted endpoint ", (name, "bold"), "."))


@app.command()
def logs(
    name: Name,
    instance: Annotated[
        str | None, typer.Option(help="Only this instance (a stream name or its id).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C ends).")
    ] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Print the logs of an endpoint's instances, each line prefixed by its instance."""
    with _reported():
        endpoints = Endpoints(Gateway(url))
        tokens: dict[str, str | None] = {}
        try:
            while True:
                for stream in endpoints.log_streams(name):
                    if instance and instance not in (stream, stream.rpartition("/")[2]):
                        continue
                    tokens.setdefault(stream, None)
                    _print_stream(endpoints, name, stream, tokens, prefix=not instance)
                if not follow:
                    return
                time.sleep(_POLL_PERIOD_S)
        except KeyboardInterrupt:
            return


def job_or_endpoint_logs(
    name: Annotated[str, typer.Argument(help="Job or endpoint name.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Print a job's log, or an endpoint's instance logs when NAME is an endpoint."""
    with _reported():
        gateway = Gateway(url)
        try:
            gateway.logs(name, 0)
        except GatewayError as missing:
            try:
                Endpoints(gateway).describe(name)
            except GatewayError:
                raise missing from None
            logs(name, instance=None, follow=follow, url=url)
            return
        _print_logs(gateway, name, follow=follow)


def _print_stream(
    endpoints: Endpoints,
    name: str,
    stream: str,
    tokens: dict[str, str | None],
    *,
    prefix: bool,
) -> None:
    """Every line of ``stream`` after ``tokens[stream]``; the token moves on."""
    label = stream.rpartition("/")[2]
    while True:
        chunk = endpoints.log_lines(name, stream, tokens[stream])
        try:
            for line in chunk.lines:
                sys.stdout.write(f"[{label}] {line}\n" if prefix else line + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader (head, less) has gone: stop quietly, as cat does.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        done = not chunk.lines or chunk.next_token == tokens[stream]
        tokens[stream] = chunk.next_token
        if done:
            return


def _body(body: str | None, file: Path | None) -> bytes:
    """The request body from the argument, a file, or stdin (also ``--file -``)."""
    if body is not None and file is not None:
        typer.secho("error: give the body or --file, not both", fg="red", err=True)
        raise typer.Exit(2)
    if body is not None:
        return body.encode()
    if file is not None and str(file) != "-":
        try:
            return file.read_bytes()
        except OSError as exc:
            typer.secho(f"error: {file}: {exc.strerror or exc}", fg="red", err=True)
            raise typer.Exit(2) from None
    if file is None and sys.stdin.isatty():
        typer.secho("error: no body: give one, --file, or pipe it in", fg="red", err=True)
        raise typer.Exit(2)
    return sys.stdin.buffer.read()


def _view(
    endpoint: dict[str, Any], config: dict[str, Any], health: dict[tuple[str, str], int]
) -> RenderableType:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    facts.add_row("Name", endpoint["EndpointName"])
    facts.add_row("Status", _status(endpoint["EndpointStatus"]))
    facts.add_row("Config", endpoint.get("EndpointConfigName", ""))
    pending = endpoint.get("PendingDeploymentSummary", {}).get("EndpointConfigName")
    if pending:
        facts.add_row("Deploying", pending)
    facts.add_row("Created", _when(endpoint.get("CreationTime")))
    facts.add_row("Modified", _when(endpoint.get("LastModifiedTime")))
    if endpoint.get("FailureReason"):
        facts.add_row("Failure reason", Text(endpoint["FailureReason"], style="red"))
    declared = {
        v["VariantName"]: v
        for v in config.get("ProductionVariants", []) + config.get("ShadowProductionVariants", [])
    }
    variants = Table(
        "Variant",
        "Model",
        "Instance type",
        "Weight",
        "Instances",
        "Healthy",
        "Unhealthy",
        title="Variants",
    )
    for kind, key in (("", "ProductionVariants"), (" (shadow)", "ShadowProductionVariants")):
        for variant in endpoint.get(key, []):
            name = variant["VariantName"]
            spec = declared.get(name, {})
            serverless = variant.get("CurrentServerlessConfig")
            variants.add_row(
                name + kind,
                spec.get("ModelName", ""),
                "serverless" if serverless else spec.get("InstanceType", ""),
                f"{variant.get('CurrentWeight', 0):g}",
                _instances(variant),
                str(health.get((name, "healthy"), 0)),
                str(health.get((name, "unhealthy"), 0)),
            )
    return Group(facts, variants)


def _instances(variant: dict[str, Any]) -> str:
    """``current/desired``, or a serverless variant's concurrency."""
    if "CurrentServerlessConfig" in variant:
        limit = variant["CurrentServerlessConfig"].get("MaxConcurrency", "?")
        return f"max concurrency {limit}"
    current = variant.get("CurrentInstanceCount", 0)
    desired = variant.get("DesiredInstanceCount", current)
    return f"{current}/{desired}"


def _status(status: str) -> Text:
    return Text(status, style=_STATUS_STYLES.get(status, ""))
