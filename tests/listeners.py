"""Real receivers for notifications: a webhook server and an SMTP server, on loopback.

Both run in background threads of the test process, record what they receive, and are
stopped with ``close()``. ``wait_for(count, timeout_s)`` blocks until ``count`` items
arrived and returns them, or fails the test with what did arrive.
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
import time
from dataclasses import dataclass
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

from aiosmtpd.controller import Controller

T = TypeVar("T")


class _Inbox(Generic[T]):
    """Items received by a server thread, and a wait for them."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._changed = threading.Condition()

    def add(self, item: T) -> None:
        with self._changed:
            self._items.append(item)
            self._changed.notify_all()

    def items(self) -> list[T]:
        with self._changed:
            return list(self._items)

    def wait_for(self, count: int, timeout_s: float, what: str) -> list[T]:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self._items) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"expected {count} {what} within {timeout_s}s, got "
                        f"{len(self._items)}: {self._items!r}"
                    )
                self._changed.wait(left)
            return list(self._items)


@dataclass(frozen=True)
class WebhookRequest:
    method: str
    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any
    """The JSON body, or the raw text when it is not JSON."""
    status: int
    """What the listener answered."""


class WebhookListener:
    """An HTTP server on 127.0.0.1 that records every request; any path is accepted.

    ``fail_next(n)`` makes it answer 500 to the next ``n`` requests (they are recorded
    too, with ``status`` 500).
    """

    def __init__(self) -> None:
        self._inbox: _Inbox[WebhookRequest] = _Inbox()
        self._failures = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="webhook-listener",
            daemon=True,
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"WebhookListener({self.url!r}, received={len(self.requests)})"

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[WebhookRequest]:
        return self._inbox.items()

    def fail_next(self, count: int) -> None:
        with self._lock:
            self._failures = count

    def wait_for(self, count: int, timeout_s: float = 10) -> list[WebhookRequest]:
        return self._inbox.wait_for(count, timeout_s, "webhook requests")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _answer(self) -> int:
        with self._lock:
            if self._failures > 0:
                self._failures -= 1
                return 500
            return 200

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                status = listener._answer()
                headers = {k.lower(): v for k, v in self.headers.items()}
                listener._inbox.add(WebhookRequest(self.command, self.path, headers, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_PUT = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@dataclass(frozen=True)
class SmtpMessage:
    mail_from: str
    rcpt_tos: list[str]
    subject: str
    body: str
    """The text/plain part."""
    headers: dict[str, str]


class _SmtpHandler:
    def __init__(self, inbox: _Inbox[SmtpMessage]) -> None:
        self._inbox = inbox

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        part = message.get_body(preferencelist=("plain",))
        body = part.get_content() if part is not None else ""
        self._inbox.add(
            SmtpMessage(
                mail_from=envelope.mail_from,
                rcpt_tos=list(envelope.rcpt_tos),
                subject=str(message["Subject"]),
                body=str(body),
                headers={k: str(v) for k, v in message.items()},
            )
        )
        return "250 Message accepted for delivery"


class SmtpListener:
    """A plain SMTP server (no TLS, no login) on 127.0.0.1, collecting every message."""

    def __init__(self) -> None:
        self._inbox: _Inbox[SmtpMessage] = _Inbox()
        self.port = _free_port()
        self._controller = Controller(
            _SmtpHandler(self._inbox), hostname="127.0.0.1", port=self.port
        )
        self._controller.start()

    def __repr__(self) -> str:
        return f"SmtpListener(port={self.port}, received={len(self.messages)})"

    def mailto(self, *, sender: str = "shipyard@example.com", to: str = "ops@example.com") -> str:
        """The apprise URL that delivers to this server."""
        return f"mailto://127.0.0.1:{self.port}?from={sender}&to={to}"

    @property
    def messages(self) -> list[SmtpMessage]:
        return self._inbox.items()

    def wait_for(self, count: int, timeout_s: float = 10) -> list[SmtpMessage]:
        return self._inbox.wait_for(count, timeout_s, "emails")

    def close(self) -> None:
        self._controller.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
