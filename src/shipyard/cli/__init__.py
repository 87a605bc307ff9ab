"""The ``shipyard`` command line: each command builds one object and calls one method."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from shipyard import backends, heap
from shipyard.cli import apply, endpoints, jobs, transform, workers

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """shipyard: self-hosted model serving that speaks the SageMaker API."""
    if ctx.invoked_subcommand != "serve":
        heap.resume()  # paused for the imports (__main__); `serve` settles once up


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind.")] = None,
    home: Annotated[
        Path | None, typer.Option(help="State folder (default $SHIPYARD_HOME or ~/.shipyard).")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="Stack file (YAML).")] = None,
    db: Annotated[str | None, typer.Option(help="Metadata store URL (postgresql://…).")] = None,
    backend: Annotated[
        str | None,
        typer.Option(help=f"Where instances run: {', '.join(backends.names())} (default local)."),
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="The Ray cluster of --backend ray (its head's host:port).")
    ] = None,
    demo: Annotated[bool, typer.Option(help="Deploy the demo model as endpoint 'demo'.")] = False,
    insecure: Annotated[
        bool,
        typer.Option(help="Allow a non-loopback --host without an auth: section (unsafe)."),
    ] = False,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help=(
                "Without an auth: section, also answer requests whose Host is NAME (any "
                "port) or NAME:PORT, e.g. behind a proxy; repeatable. By default only "
                "localhost, 127.0.0.1 and [::1] on --port are answered, so that a web page "
                "whose name is pointed at this host cannot drive the gateway."
            ),
        ),
    ] = None,
    grpc_port: Annotated[
        int | None,
        typer.Option(help="Also serve the Open Inference Protocol over gRPC on this port."),
    ] = None,
    http2_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve bidirectional streaming (HTTP/2) on this port: TLS with "
            "--tls-cert, else cleartext with prior knowledge."
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="Serve HTTPS (and gRPC over TLS) with this PEM certificate chain."),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="The unencrypted PEM private key of --tls-cert.")
    ] = None,
    worker_count: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Gateway processes on this port and home (default 1): one is one core.",
        ),
    ] = None,
) -> None:
    """Start the gateway."""
    from pydantic import ValidationError

    from shipyard.app import create_app
    from shipyard.demo import deploy_demo
    from shipyard.http.serving import ServerLimits, server_config
    from shipyard.settings import Settings

    given: dict[str, Any] = {
        "host": host,
        "port": port,
        "home": home.expanduser().resolve() if home else None,
        "config": config,
        "db": db,
        "backend": backend,
        "ray_address": ray_address,
        "insecure": insecure or None,
        "allow_hosts": allow_host or None,
        "grpc_port": grpc_port,
        "http2_port": http2_port,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "workers": worker_count,
    }
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if settings.workers > 1 and settings.worker is None:
        heap.resume()  # a supervisor never settles: it runs no gateway of its own
        try:
            status = workers.supervise(settings, sys.argv[1:])
        except OSError as exc:
            typer.secho(
                f"error: cannot bind {settings.host}:{settings.port}: {exc}", fg="red", err=True
            )
            raise typer.Exit(2) from exc
        raise typer.Exit(status)
    if settings.worker:
        settings.grpc_port, settings.http2_port, demo = None, None, False  # worker 0's alone
    # Taken first, so that nothing this worker starts inherits it.
    ready = workers.ready_pipe() if settings.worker is not None else None
    try:
        held = workers.hold_home(settings.home_lock)
        gateway = create_app(
            settings,
            on_startup=(lambda svc: deploy_demo(svc, settings.home)) if demo else None,
        )
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    limits = ServerLimits(
        max_headers=settings.max_headers,
        max_head_bytes=settings.max_head_bytes,
        head_timeout_s=settings.head_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        max_connections=settings.max_connections,
        drain_timeout_s=settings.drain_timeout_s,
    )
    # The flags, else the stack file's tls: section (create_app checked them).
    uvicorn_config = server_config(
        gateway,
        host=settings.host,
        port=settings.port,
        limits=limits,
        serve_whole=gateway.serve_whole,
        tls=gateway.tls,
    )
    # A worker serves the socket its supervisor bound; a gateway alone binds it itself.
    sockets = [workers.inherited_socket()] if settings.worker is not None else None
    server = workers.server(uvicorn_config, ready)
    server.run(sockets=sockets)
    if not server.started:
        raise typer.Exit(3)  # uvicorn.run's exit status when the server could not start
    held.close()


app.add_typer(jobs.app, name="jobs")
app.add_typer(transform.app, name="transform")
app.add_typer(endpoints.app, name="endpoints")
app.command("apply")(apply.apply)
app.command("destroy")(apply.destroy)
app.command("logs")(endpoints.job_or_endpoint_logs)


def main() -> None:
    app()
