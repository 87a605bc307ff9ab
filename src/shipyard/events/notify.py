"""Notifier: one notification to one subscriber, through apprise.

Every apprise URL works (``mailto://``, ``json://``, ``slack://``, ...). Two additions:

- ``http://`` and ``https://`` webhooks, which apprise has no scheme for, are sent as
  ``json://`` and ``jsons://``: a POST whose JSON body is apprise's
  ``{"version": "1.0", "title": ..., "message": ..., "attachments": [], "type": "info"}``.
  Their query string is read as apprise's options, as for ``json://``; a query
  parameter for the receiver is written ``-name=value``.
- Where the service takes custom headers (the json/form/xml webhooks and email), the
  delivery key travels as ``X-Shipyard-Delivery-Key``. It is the same on every attempt
  for an event, so a receiver can drop the rare duplicate that a crash between its
  answer and our commit can cause.

Email to a plain SMTP server (no TLS, no login), e.g. a local relay::

    mailto://127.0.0.1:2525?from=alerts@example.com&to=ops@example.com

``mailto://`` (not ``mailtos://``) means no TLS (apprise's ``mode=insecure``), and with
no ``user:password@`` there is no login. The port goes after the host; ``smtp=<host>``
is only needed when the SMTP host differs from the URL's host. Both addresses must look
real: apprise refuses ``a@x`` (no dot in the domain) and the whole URL with it.

apprise reports only success or failure, and says why in its log ("apprise" logger).
``send`` collects the warnings logged while it runs (matched through a context
variable, so concurrent sends never see each other's) and raises them as the
``DeliveryError`` message. apprise's own network timeouts bound a send (seconds for
webhooks, 15 s to connect for email); a send is never retried here, the dispatcher
decides that.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import smtplib
import threading
import warnings
from contextvars import ContextVar
from email.message import EmailMessage
from types import ModuleType
from urllib.parse import parse_qs, urlsplit

from shipyard.errors import DeliveryError

log = logging.getLogger(__name__)

DELIVERY_KEY_HEADER = "X-Shipyard-Delivery-Key"

_captured: ContextVar[list[str] | None] = ContextVar("shipyard_apprise_log", default=None)
_setup_lock = threading.Lock()
_loaded = threading.Event()
_HEADER_SAFE = re.compile(r"[!-~]{1,256}")


class _Capture(logging.Handler):
    """Hands apprise's warnings to the send that is running in this context."""

    def emit(self, record: logging.LogRecord) -> None:
        lines = _captured.get()
        if lines is not None:
            lines.append(record.getMessage())


_capture = _Capture(logging.WARNING)


class Notifier:
    """Sends one notification to one apprise URL; raises DeliveryError when it fails.

    ``read_timeout_s``: how long a subscriber may take to answer, where its URL sets no
    ``rto`` of its own. apprise gives up after 4 s, and the dispatcher sends an event
    again when a send fails: a webhook that answered in 6 s got the same event up to ten
    times. Keep it below the dispatcher's lease (events/dispatcher.py).
    """

    def __init__(self, *, read_timeout_s: float = 4.0) -> None:
        self.read_timeout_s = read_timeout_s

    def __repr__(self) -> str:
        return f"Notifier(read_timeout_s={self.read_timeout_s:g})"

    async def load(self) -> None:
        """Import apprise in a worker thread, once per process, so that neither
        ``redact`` nor ``send`` ever imports it on the event loop (a fifth of a second)."""
        if not _loaded.is_set():
            await asyncio.to_thread(_apprise)

    async def send(self, url: str, *, title: str, body: str, key: str) -> None:
        """Deliver ``title`` and ``body`` to ``url``, with ``key`` as the delivery key.

        Runs apprise in a worker thread. Cancelling the caller does not stop a send
        already under way.
        """
        await asyncio.to_thread(_send, url, title, body, key, self.read_timeout_s)

    def redact(self, url: str) -> str:
        """``url`` with passwords and tokens masked, as apprise prints it; for display."""
        plugin = _apprise().Apprise.instantiate(_apprise_url(url))
        if plugin is None:
            return url.split("://", 1)[0] + "://(unusable URL)"
        return str(plugin.url(privacy=True))


def _send(url: str, title: str, body: str, key: str, read_timeout_s: float = 4.0) -> None:
    apprise = _apprise()
    lines: list[str] = []
    token = _captured.set(lines)
    try:
        plugin = apprise.Apprise.instantiate(_apprise_url(url))
        if plugin is None and url.lower().startswith("mailto://"):
            _send_plain_mail(url, title, body, key)
            return
        if plugin is None:
            raise DeliveryError(_reason(lines, "apprise cannot use this URL"))
        if "rto=" not in url.partition("?")[2]:  # the URL's own read timeout wins
            plugin.socket_read_timeout = read_timeout_s
        headers = getattr(plugin, "headers", None)
        if isinstance(headers, dict):
            headers[DELIVERY_KEY_HEADER] = _header_value(key)
        sender = apprise.Apprise()
        sender.add(plugin)
        delivered = bool(sender.notify(body=body, title=title))
    finally:
        _captured.reset(token)
    if not delivered:
        raise DeliveryError(_reason(lines, "apprise reported a failure without a reason"))


def _send_plain_mail(url: str, title: str, body: str, key: str) -> None:
    """Plain SMTP (no TLS, no login) for ``mailto://`` URLs apprise refuses.

    apprise refuses addresses whose domain has no dot (``ops@localhost``, ``b@x``), which
    local relays and tests use; the standard library sends those.
    """
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    sender = (query.get("from") or [f"shipyard@{parts.hostname or 'localhost'}"])[0]
    recipients = [a for value in query.get("to", []) for a in value.split(",") if a]
    host = (query.get("smtp") or [parts.hostname or "localhost"])[0]
    if not recipients:
        raise DeliveryError("mailto:// URL has no to= address")
    message = EmailMessage()
    message["Subject"], message["From"], message["To"] = title, sender, ", ".join(recipients)
    message[DELIVERY_KEY_HEADER] = _header_value(key)
    message.set_content(body)
    try:
        with smtplib.SMTP(host, parts.port or 25, timeout=15) as smtp:
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"SMTP {host}:{parts.port or 25}: {exc}") from exc


def _apprise_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    webhook = {"http": "json", "https": "jsons"}.get(scheme.lower())
    return f"{webhook}{sep}{rest}" if webhook else url


def _header_value(key: str) -> str:
    # A key is only sent as is when it is a valid header value; otherwise its hash is.
    if _HEADER_SAFE.fullmatch(key):
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _reason(lines: list[str], fallback: str) -> str:
    return "; ".join(dict.fromkeys(line.strip() for line in lines if line.strip())) or fallback


def _apprise() -> ModuleType:
    """apprise, imported on the first notification (a gateway that sends none never
    pays its import, a fifth of a second), its log captured and its plugins loaded once
    per process.

    apprise imports all its plugins on first use, and one of them imports the deprecated
    ``imghdr``; loading them here, with that one warning silenced, keeps the warning out
    of the first send (and out of test runs that turn warnings into errors).
    """
    import apprise

    if _loaded.is_set():
        return apprise
    with _setup_lock:
        if not _loaded.is_set():
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=".*imghdr.* is deprecated", category=DeprecationWarning
                )
                apprise.Apprise.instantiate("json://localhost")
            logging.getLogger("apprise").addHandler(_capture)
            _loaded.set()
    return apprise
