"""What every request passes before a door: the transport the gateway serves, and the
edge that reads each request's head once and checks its signature.

``serving_tls`` decides, at start, the certificate and key the gateway serves HTTPS (and
gRPC) with; ``edge`` wraps the doors in ReadOnce with the browser rules (no ``auth:``,
gateway/edge/browser.py) or RequireSignature (gateway/edge/signatures.py), and refuses to serve an
open gateway beyond loopback.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from shipyard.gateway.edge.auth import Verifier, is_loopback
from shipyard.gateway.edge.browser import BrowserRules
from shipyard.gateway.edge.signatures import ASGIApp, ReadOnce, RequireSignature
from shipyard.gateway.edge.streams import StreamEdge
from shipyard.settings import Settings
from shipyard.stackfile import StackFile


def edge(doors: ASGIApp, settings: Settings, stack: StackFile) -> ReadOnce:
    """The doors behind the edge: their heads read once (repeated security-relevant
    headers refused), and SigV4 verified when the stack file has ``auth:``; without it,
    what a web page could make a browser send refused."""
    if stack.auth is None:
        if not (is_loopback(settings.host) or settings.insecure):
            raise ValueError(
                f"host: refusing to listen on {settings.host}, which is not a loopback "
                "address, with no auth: section in the stack file: anyone who reaches "
                "the port could run commands on this host. Add an auth: section "
                "(see SECURITY.md) or pass --insecure."
            )
        allowed = [*settings.allow_hosts, *stack.allow_hosts, *_bound(settings.host, settings.port)]
        return ReadOnce(
            doors, account_id=settings.account_id, browser=BrowserRules(settings.port, allowed)
        )
    return RequireSignature(
        doors,
        verifier=Verifier.from_config(stack.auth, os.environ),
        account_id=settings.account_id,
        max_body_bytes=settings.max_payload_bytes,
        body_timeout_s=settings.body_read_timeout_s,
    )


def stream_edge(settings: Settings, stack: StackFile, *, secure: bool) -> StreamEdge:
    """The edge of the HTTP/2 door (``--http2-port``): as ``edge``, its own port the one
    a loopback ``Host`` (``:authority``) names."""
    if stack.auth is None:
        port = settings.http2_port or 0
        allowed = [*settings.allow_hosts, *stack.allow_hosts, *_bound(settings.host, port)]
        return StreamEdge(
            verifier=None,
            browser=BrowserRules(port, allowed),
            account_id=settings.account_id,
            secure=secure,
        )
    return StreamEdge(
        verifier=Verifier.from_config(stack.auth, os.environ),
        browser=None,
        account_id=settings.account_id,
        secure=secure,
    )


def serving_tls(settings: Settings, stack: StackFile) -> tuple[Path, Path] | None:
    """The certificate and key to serve with: the flags, else the stack file's ``tls:``
    (relative to the file); checked here so that a wrong one fails the start, naming it."""
    if settings.tls_cert is not None or settings.tls_key is not None:
        if settings.tls_cert is None or settings.tls_key is None:
            raise ValueError("tls_cert, tls_key: give both (--tls-cert and --tls-key), or neither")
        cert, key = settings.tls_cert, settings.tls_key
    elif stack.tls is not None:
        base = settings.config.parent if settings.config is not None else Path()
        cert, key = base / stack.tls.cert, base / stack.tls.key
    else:
        return None
    try:
        # An encrypted key is refused rather than prompting for its passphrase.
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"tls: cannot serve HTTPS with certificate {cert} and key {key} (PEM files, "
            f"the key unencrypted): {exc}"
        ) from None
    return cert, key


def _bound(host: str, port: int) -> list[str]:
    """The address the gateway listens on, with its port, as a name it answers to: a
    client that reaches it there names it so (a page cannot make a browser send another
    site's address as its Host). A wildcard address names nothing."""
    if host in ("", "0.0.0.0", "::") or is_loopback(host):
        return []
    return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
