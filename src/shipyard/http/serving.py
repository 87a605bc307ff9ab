"""The gateway's HTTP server, assembled: uvicorn on uvloop, with the protocol of
http/server.py and every limit given as a plain value.

Why each option is set as it is lives here, beside it, rather than in the command that
starts the server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from shipyard.http.server import ServeWhole, limited_protocol


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What the server holds every connection to (the gateway's settings give them)."""

    max_headers: int
    max_head_bytes: int
    head_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    drain_timeout_s: float


def server_config(
    app: Any,
    *,
    host: str,
    port: int,
    limits: ServerLimits,
    serve_whole: ServeWhole | None,
    tls: tuple[Path, Path] | None,
) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` on ``host:port``. ``serve_whole`` serves a
    whole-bodied invocation on callbacks (http/server.py); ``tls`` is the certificate
    chain and key files."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=limited_protocol(
            max_headers=limits.max_headers,
            max_head_bytes=limits.max_head_bytes,
            head_timeout_s=limits.head_timeout_s,
            serve_whole=serve_whole,
        ),
        # The edge switches to no other protocol (http/server.py): no WebSocket
        # implementation to load for it.
        ws="none",
        access_log=False,
        log_level="warning",
        # No caller's X-Forwarded-* rewrites who it is, and no header says what we run on.
        proxy_headers=False,
        server_header=False,
        # Closed idle from the moment it opens (http/server.py), and between requests.
        timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
        # uvicorn counts the connection asking among the open ones: one more lets
        # max_connections be open and served, and answers 503 to the next.
        limit_concurrency=limits.max_connections + 1,
        timeout_graceful_shutdown=int(limits.drain_timeout_s),
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
