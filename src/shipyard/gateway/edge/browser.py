"""What a web page could make a local browser send, refused by a gateway without ``auth:``.

Such a gateway checks no signature: loopback is its only guard, and the user's own
browser is a loopback client. Any page it shows can send a ``<form>`` or a "simple"
``fetch`` (no preflight) to ``127.0.0.1``, and a page whose name is re-pointed at
``127.0.0.1`` (DNS rebinding) can read the answers too. So the edge (gateway/edge/signatures.py,
``ReadOnce``) asks ``BrowserRules.refusal`` of every request, before any door sees it:

- ``Host`` must be one of this gateway's names: ``localhost``, ``127.0.0.1`` or
  ``[::1]`` with its port (or none), or a name the operator allowed (``--allow-host``,
  ``allow_hosts:``; a name alone matches any port, ``NAME:PORT`` that port only). A
  rebound page sends its own name. ``/healthz`` is exempt.
- ``Origin`` and ``Sec-Fetch-Site`` must not show another origin's page (a page of
  another site, or of another port of this host), but for ``GET`` of the console's pages,
  which hold no data: a link from elsewhere opens them.
- A form (``application/x-www-form-urlencoded``, ``multipart/form-data``) or
  ``text/plain`` body, the bodies a page sends without a preflight, is refused on any
  method but ``GET`` and ``HEAD`` unless the request carries ``Authorization`` (which a
  page cannot send to another origin without a preflight the gateway never grants; SDKs
  sign their form bodies).

The cost on the data path is a set lookup of ``Host`` and two ``None`` tests; the
content type is looked at only when one is sent with no ``Authorization``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from shipyard.gateway.edge.auth import Head, is_console_page

_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
_FORMS = frozenset(("application/x-www-form-urlencoded", "multipart/form-data", "text/plain"))
_SAFE_METHODS = frozenset(("GET", "HEAD"))
_OWN_FETCHES = frozenset(("same-origin", "none"))
_HOST = re.compile(r"(?:[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?")


class BrowserRules:
    """The browser rules of one gateway without ``auth:`` (see the module)."""

    __slots__ = ("port", "hosts", "origins", "names")

    def __init__(self, port: int, allow_hosts: Iterable[str] = ()) -> None:
        self.port = port
        origins = {f"{name}:{port}" for name in _LOOPBACK}
        if port in (80, 443):  # the scheme's own port, which an origin leaves out
            origins.update(_LOOPBACK)
        # A Host of a loopback name with no port too: a browser names every port but
        # its scheme's own, so no page sends one to a gateway on another port.
        hosts = {*_LOOPBACK, *origins}
        names: set[str] = set()
        if port == 0:  # bound to a port chosen at start: any port of loopback
            names.update(_LOOPBACK)
        for entry in allow_hosts:
            host = entry.strip().lower()
            if not _HOST.fullmatch(host):
                raise ValueError(
                    f"allow_hosts: {entry!r} is not a host name or address, with or "
                    "without :PORT (an IPv6 address in brackets)"
                )
            if _name(host) != host:
                hosts.add(host)
                origins.add(host)
            else:
                names.add(host)
        self.hosts = frozenset(hosts)
        """``Host`` values taken as they are."""
        self.origins = frozenset(origins)
        """Hosts (and ports) of the pages that are this gateway's own."""
        self.names = frozenset(names)
        """Names taken with any port, or none."""

    def __repr__(self) -> str:
        return f"BrowserRules(hosts={sorted(self.hosts)}, names={sorted(self.names)})"

    def refusal(self, method: str, path: str, head: Head) -> str | None:
        """Why the request read once as ``head`` is refused, or None when it is not."""
        if (
            head.host not in self.hosts
            and path != "/healthz"
            and not self._named(head.host, self.hosts)
        ):
            return (
                f"Host {_shown(head.host)} does not name this gateway. Without an auth: "
                f"section it answers only localhost, 127.0.0.1 and [::1] on its port "
                f"({self.port}), so that a web page whose name is pointed at this host cannot "
                "reach it; add a name you reach it by with --allow-host NAME (or "
                "allow_hosts: in the stack file)."
            )
        if (head.origin is not None or head.fetch_site is not None) and not self._own_page(head):
            if method not in _SAFE_METHODS or not is_console_page(path):
                return (
                    f"The request was sent by another site's page (Origin: "
                    f"{_shown(head.origin)}, Sec-Fetch-Site: {_shown(head.fetch_site)}). "
                    "Without an auth: section the gateway answers only its own pages and "
                    "clients that are not browsers, so that a page you visit cannot drive it."
                )
        content_type = head.content_type
        if (
            content_type is not None
            and head.authorization is None
            and _is_form(content_type)
            and method not in _SAFE_METHODS
        ):
            return (
                f"A form or text/plain body (Content-Type: {_shown(head.content_type)}) is "
                "taken only with an Authorization header on a gateway without an auth: "
                "section: any web page can make a browser send one. Send it as another "
                "Content-Type (application/json, for one), or signed (boto3, the AWS CLI "
                "and curl --aws-sigv4 sign)."
            )
        return None

    def _named(self, host: str | None, exact: frozenset[str]) -> bool:
        """Whether ``host`` (a ``Host`` value, or an origin's host and port) is one of
        ``exact`` or an allowed name, with any port."""
        if host is None:
            return False
        host = host.strip().lower()
        return host in exact or _name(host) in self.names

    def _own_page(self, head: Head) -> bool:
        if head.fetch_site is not None and any(
            site.strip().lower() not in _OWN_FETCHES for site in head.fetch_site.split(",")
        ):
            return False
        if head.origin is not None:
            # Joined by commas when sent more than once: each one must be ours.
            for origin in head.origin.split(","):
                scheme, sep, host = origin.strip().partition("://")
                if (
                    not sep
                    or scheme.lower() not in ("http", "https")
                    or not self._named(host, self.origins)
                ):
                    return False  # "null" (a sandboxed or file: page) included
        return True


def _name(host: str) -> str:
    """``host`` without its port."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.partition(":")[0]


@functools.lru_cache(maxsize=64)  # bounded: content types are the caller's to choose
def _is_form(content_type: str) -> bool:
    """Whether ``content_type`` (every value, when sent more than once) is a body a page
    may send without a preflight. Cached: a client sends the same few again and again,
    and a lookup costs the data path less than parsing."""
    lowered = content_type.lower()
    return any(part.partition(";")[0].strip() in _FORMS for part in lowered.split(","))


def _shown(value: str | None) -> str:
    return "(none)" if value is None else repr(value[:100])
