"""The edge of the HTTP/2 door: what ReadOnce and RequireSignature (signatures.py) do for
an HTTP/1.1 request, for a request whose body is a stream of events.

The head is read once (a security-relevant header sent twice is refused), ``host`` being
HTTP/2's ``:authority``. Without ``auth:``, the browser rules hold, the door's own port
being the one a ``Host`` of loopback names. With ``auth:``, the head's SigV4 signature
is checked before anything else (its payload hash ``STREAMING-AWS4-HMAC-SHA256-EVENTS``:
it covers the head alone), the key authorised for the action, and the events' chained
signatures handed to the door (``EventSignatures``), which checks each before its part
goes on.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from shipyard.errors import AccessDenied, InvalidSignature
from shipyard.gateway.edge.auth import (
    STREAMING_EVENTS,
    Admitted,
    EventSignatures,
    Verifier,
    action_of,
    authorize,
    read_head,
)
from shipyard.gateway.edge.browser import BrowserRules

Headers = list[tuple[bytes, bytes]]


class StreamEdge:
    """Admits one HTTP/2 request: ``admit`` returns what the edge read of it (as every
    door takes it) and, under ``auth:``, its events' signatures; raises the refusal."""

    def __init__(
        self,
        *,
        verifier: Verifier | None,
        browser: BrowserRules | None,
        account_id: str,
        secure: bool,
    ) -> None:
        self.verifier = verifier
        self.browser = browser
        self.account_id = account_id
        self.secure = secure

    def __repr__(self) -> str:
        return f"StreamEdge(auth={self.verifier is not None}, secure={self.secure})"

    def admit(
        self, method: str, path: str, authority: str, headers: Headers
    ) -> tuple[Admitted, EventSignatures | None]:
        plain = [(b"host", authority.encode())]
        plain += [(k, v) for k, v in headers if not k.startswith(b":") and k != b"host"]
        head = read_head(plain)
        parts = urlsplit(path)
        if self.verifier is None:
            if self.browser is not None:
                refusal = self.browser.refusal(method, parts.path, head)
                if refusal is not None:
                    raise AccessDenied(refusal)
            return Admitted(head, account_id=self.account_id), None
        pending = self.verifier.start(
            method,
            parts.path.encode(),
            parts.query.encode(),
            plain,
            head,
            secure=self.secure,
        )
        if pending.declared != STREAMING_EVENTS:
            raise InvalidSignature(
                f"A stream's events are signed each on its own: x-amz-content-sha256 must "
                f"be {STREAMING_EVENTS}."
            )
        caller = self.verifier.finish(pending, b"")
        found = action_of(method, parts.path, None)
        action = found[1] if found is not None else "shipyard:Unknown"
        authorize(caller, action, account_id=self.account_id)
        admitted = Admitted(head, action=action, caller=caller, account_id=self.account_id)
        return admitted, EventSignatures(pending)
