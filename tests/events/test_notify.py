"""Notifier against a real webhook receiver and a real SMTP server (aiosmtpd)."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time

import pytest

from shipyard.errors import DeliveryError
from shipyard.events.notify import DELIVERY_KEY_HEADER, Notifier
from tests.conftest import free_port
from tests.listeners import SmtpListener, WebhookListener


def send(
    url: str, *, title: str = "Job a completed", body: str = "It took 3 s.", key: str = "k1"
) -> None:
    asyncio.run(Notifier().send(url, title=title, body=body, key=key))


def test_a_json_webhook_gets_one_post_with_title_body_and_delivery_key(
    webhook: WebhookListener,
) -> None:
    send(webhook.url.replace("http://", "json://") + "/hook", key="job/a/Completed")
    [request] = webhook.wait_for(1)
    assert (request.method, request.path) == ("POST", "/hook")
    assert request.headers["content-type"] == "application/json"
    assert request.headers[DELIVERY_KEY_HEADER.lower()] == "job/a/Completed"
    assert request.body["title"] == "Job a completed"
    assert request.body["message"] == "It took 3 s."


def test_a_plain_http_url_is_sent_as_a_json_webhook(webhook: WebhookListener) -> None:
    send(webhook.url + "/plain")
    [request] = webhook.wait_for(1)
    assert request.path == "/plain" and request.body["title"] == "Job a completed"


def test_a_key_that_is_not_a_header_value_is_sent_as_its_hash(webhook: WebhookListener) -> None:
    send(webhook.url + "/h", key="job a\r\ncompleted")
    [request] = webhook.wait_for(1)
    assert request.headers[DELIVERY_KEY_HEADER.lower()].startswith("sha256:")


def test_an_error_status_raises_with_apprise_reason(webhook: WebhookListener) -> None:
    webhook.fail_next(1)
    with pytest.raises(DeliveryError, match="500"):
        send(webhook.url + "/hook")


def test_a_refused_connection_raises() -> None:
    with pytest.raises(DeliveryError, match="(?i)connection"):
        send(f"json://127.0.0.1:{free_port()}/hook")


def test_a_url_apprise_cannot_use_raises() -> None:
    with pytest.raises(DeliveryError):
        send("nosuchscheme://host/path")


def test_email_reaches_a_plain_smtp_server_with_subject_body_and_key(smtp: SmtpListener) -> None:
    send(smtp.mailto(sender="jobs@example.com", to="ops@example.com"), key="job/a/Completed")
    [message] = smtp.wait_for(1)
    assert message.mail_from == "jobs@example.com" and message.rcpt_tos == ["ops@example.com"]
    assert message.subject == "Job a completed"
    assert message.body.strip() == "It took 3 s."
    assert message.headers[DELIVERY_KEY_HEADER] == "job/a/Completed"


def test_email_with_an_explicit_smtp_host_as_in_the_stack_file(smtp: SmtpListener) -> None:
    send(f"mailto://127.0.0.1:{smtp.port}?from=a@example.com&to=b@example.com&smtp=127.0.0.1")
    assert smtp.wait_for(1)[0].rcpt_tos == ["b@example.com"]


def test_email_to_addresses_apprise_refuses_goes_out_as_plain_smtp(smtp: SmtpListener) -> None:
    """An address with no dot in its domain (``a@x``, as local relays take) is one apprise
    refuses; smtplib sends it."""
    send(f"mailto://127.0.0.1:{smtp.port}?from=a@x&to=b@x&smtp=127.0.0.1", key="job/b/Failed")
    [message] = smtp.wait_for(1)
    assert message.mail_from == "a@x" and message.rcpt_tos == ["b@x"]
    assert message.subject == "Job a completed"
    assert message.headers[DELIVERY_KEY_HEADER] == "job/b/Failed"


def test_email_to_an_smtp_server_that_is_down_is_a_delivery_error() -> None:
    with pytest.raises(DeliveryError, match="SMTP 127.0.0.1:9"):
        send("mailto://127.0.0.1:9?from=a@x&to=b@x")


def test_redact_masks_passwords() -> None:
    shown = Notifier().redact("json://user:s3cret@127.0.0.1:9000/hook")
    assert "s3cret" not in shown and "127.0.0.1" in shown


class _SlowHook(http.server.BaseHTTPRequestHandler):
    """Answers 200 a second after each POST."""

    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts += 1
        time.sleep(1.0)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_subscriber_slower_than_apprises_own_timeout_is_waited_for() -> None:
    """A send given up on is sent again by the dispatcher: a subscriber that answers
    late would get the event twice. The notifier waits ``read_timeout_s`` (the gateway
    gives it half its event lease), unless the URL sets its own ``rto``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowHook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"json://127.0.0.1:{server.server_address[1]}/hook"
    try:
        with pytest.raises(DeliveryError):
            asyncio.run(Notifier(read_timeout_s=0.3).send(url, title="t", body="b", key="k"))
        asyncio.run(Notifier(read_timeout_s=5).send(url, title="t", body="b", key="k"))
        with pytest.raises(DeliveryError):  # the URL's own read timeout wins
            asyncio.run(
                Notifier(read_timeout_s=5).send(url + "?rto=0.3", title="t", body="b", key="k")
            )
        assert _SlowHook.posts == 3
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
