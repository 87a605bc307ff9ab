"""The edge: the ASGI layer every request passes first (SECURITY.md, "Every request is
signed, and read once").

``ReadOnce`` reads the headers a request's security rests on, once (``auth.read_head``):
one of them sent twice is refused (400, in the door's error shape) before anything else
sees the request, and what was read travels to the doors as a value under
``scope[auth.ADMITTED]``. It is the whole edge of a gateway without ``auth:``, with
that gateway's browser rules (gateway/edge/browser.py): a request a web page could have made
the user's browser send is refused (403, in the door's error shape) before any door runs.

``RequireSignature`` is the edge of a gateway with ``auth:``: it also lets only signed,
allowed requests through. Everything the head says is checked before the body is read
(no signature, an unknown key, a stale date, a signature that covers too little: refused
at once, the body never buffered). A signed body is then read (up to the largest body
any door takes, within a time limit), checked against the signature and handed on to the
door as one message: the door reads it as if from the socket. An unsigned body (TLS
only) is not read here at all.

A refusal is answered at once, before the rest of the body: the HTTP protocol
(http/server.py) drops what the client still sends for a few seconds, so that it
reads the refusal rather than a reset, then closes the connection.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import Response

from shipyard.errors import (
    AccessDenied,
    AuthFailure,
    BodyTimedOut,
    BodyTooLarge,
    ClientLeft,
    InvalidSignature,
    RepeatedHeader,
    RuntimeValidationError,
    ShipyardError,
    SignedBodyTimeout,
    SignedBodyTooLarge,
    ValidationException,
)
from shipyard.gateway.edge.auth import (
    ADMITTED,
    BEARER,
    Admitted,
    Caller,
    Door,
    Head,
    Pending,
    Verifier,
    action_of,
    authorize,
    door_of,
    is_loopback,
    read_head,
)
from shipyard.gateway.edge.browser import BrowserRules
from shipyard.gateway.wire import query
from shipyard.gateway.wire.errors import (
    control_error_response,
    facade_error_response,
    openai_error_response,
    rpc_v2_error_response,
    runtime_error_response,
)
from shipyard.gateway.wire.registry import iam_action, query_target
from shipyard.http import bodies
from shipyard.http.server import Respond

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Taker = Callable[[Scope, bytes, Respond], bool]
"""An app's ``take``: serve a request whose body is whole on callbacks, or say False."""


class ReadOnce:
    """Wraps the gateway's app: read the head once, refuse repeats, hand the doors the value;
    with ``browser`` rules, refuse what they refuse."""

    def __init__(
        self, app: ASGIApp, *, account_id: str = "", browser: BrowserRules | None = None
    ) -> None:
        self.app = app
        self.account_id = account_id
        self.browser = browser
        self._take: Taker | None = getattr(app, "take", None)

    def __repr__(self) -> str:
        return f"ReadOnce(browser={self.browser!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            head = read_head(scope["headers"])
        except RepeatedHeader as exc:
            log.info("refused %s %s: %s", scope["method"], scope["path"], exc.message)
            await _render(door_of(scope["path"]), exc, scope, receive, send)
            return
        browser = self.browser
        if browser is not None:
            refusal = browser.refusal(scope["method"], scope["path"], head)
            if refusal is not None:
                log.info("refused %s %s: %s", scope["method"], scope["path"], refusal)
                await _refuse(head, AccessDenied(refusal), scope, receive, send)
                return
        await self.admit(head, scope, receive, send)

    def take(self, scope: Scope, body: bytes, respond: Respond) -> bool:
        """The edge for a request served on callbacks, its whole ``body`` in hand
        (http/server.py): its head read once and admitted as ``__call__`` admits
        it, then offered to the app's ``take``. False when a header is repeated or the
        browser rules refuse it (the ASGI call answers the refusal), or the app does not
        take it: nothing was done."""
        take = self._take
        if take is None:
            return False
        try:
            head = read_head(scope["headers"])
        except RepeatedHeader:
            return False
        browser = self.browser
        if browser is not None and browser.refusal(scope["method"], scope["path"], head):
            return False
        scope[ADMITTED] = Admitted(head, account_id=self.account_id)
        return take(scope, body, respond)

    def admit(self, head: Head, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """Hand the request, read once as ``head``, to the app; nothing is checked here.
        What the app returns is returned to be awaited, without a frame of this method's
        own around it on every request."""
        scope[ADMITTED] = Admitted(head, account_id=self.account_id)
        return self.app(scope, receive, send)


class RequireSignature(ReadOnce):
    """Wraps the gateway's app: read once, verify, authorise, then pass the request on."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        verifier: Verifier,
        account_id: str,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        super().__init__(app, account_id=account_id)
        self.verifier = verifier
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def __repr__(self) -> str:
        return f"RequireSignature({self.verifier!r})"

    def take(self, scope: Scope, body: bytes, respond: Respond) -> bool:
        """As ReadOnce.take, the request verified and authorised first, by the same
        checks as ``__call__`` (its body in hand). False, and nothing done, for a request
        they refuse (``__call__`` answers the refusal in its door's shape) or one that
        needs no signature."""
        take = self._take
        if take is None or len(body) > self.max_body_bytes:
            return False  # the second: refused by ``__call__`` (413), chunked or not
        try:
            head = read_head(scope["headers"])
            door_action = action_of(scope["method"], scope["path"], head.target)
            if door_action is None:
                return False
            door, action = door_action
            checked = self._check_head(scope, head, door, action)
            if not isinstance(checked, Caller):
                checked = self._check_body(
                    scope, head, action, checked, body if checked.needs_body else None
                )
        except (AuthFailure, RepeatedHeader, SignedBodyTooLarge, _QueryRefused):
            return False
        scope[ADMITTED] = Admitted(head, action, checked, self.account_id)
        return take(scope, body, respond)

    def admit(self, head: Head, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """Verify and authorise the request read once as ``head``, then pass it on."""
        return self._verified(head, scope, receive, send)

    async def _verified(self, head: Head, scope: Scope, receive: Receive, send: Send) -> None:
        door_action = action_of(scope["method"], scope["path"], head.target)
        if door_action is None:
            await super().admit(head, scope, receive, send)
            return
        door, action = door_action
        try:
            caller, body = await self._admit(scope, receive, head, door, action)
        except ClientLeft:
            return  # gone before its body was whole: nobody to answer
        except _QueryRefused as refused:  # in the query protocol's XML, as its client reads
            log.info("refused %s %s: %s", scope["method"], scope["path"], refused.exc.wire_type)
            await _render_query(refused.exc, scope, receive, send)
            return
        except (AuthFailure, SignedBodyTooLarge, SignedBodyTimeout) as exc:
            log.info("refused %s %s: %s", scope["method"], scope["path"], exc.wire_type)
            await _render(door, exc, scope, receive, send)
            return
        scope[ADMITTED] = Admitted(head, action, caller, self.account_id)
        await self.app(scope, receive if body is None else _replay(body, receive), send)

    async def _admit(
        self, scope: Scope, receive: Receive, head: Head, door: Door, action: str
    ) -> tuple[Caller, bytes | None]:
        """The verified caller, and the body read to verify it (None: left unread)."""
        checked = self._check_head(scope, head, door, action)
        if isinstance(checked, Caller):
            return checked, None
        body = await self._read_body(scope, receive) if checked.needs_body else None
        return self._check_body(scope, head, action, checked, body), body

    def _check_head(self, scope: Scope, head: Head, door: Door, action: str) -> Caller | Pending:
        """Everything the head says, checked before any of the body is read: the caller
        of a bearer token (authorised), else the signature checked in all but the body."""
        authorization = head.authorization or ""
        if door is Door.OPENAI and authorization[: len(BEARER)].lower() == BEARER.lower():
            if scope.get("scheme") != "https" and not _from_this_host(scope):
                # A token is replayable as it is: only TLS keeps it from the wire.
                raise InvalidSignature(
                    "Bearer tokens are accepted only over TLS (https), or from this host."
                )
            caller = self.verifier.bearer(authorization)
            authorize(caller, action, account_id=self.account_id)
            return caller
        declared = head.content_length or ""
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            # Refused at once: waiting for a body we would refuse lets a client that
            # declares 100 MB and sends nothing hold the request open.
            raise SignedBodyTooLarge(
                f"Request body is larger than the maximum of {self.max_body_bytes} bytes."
            )
        return self.verifier.start(
            scope["method"],
            scope.get("raw_path") or scope["path"].encode(),
            scope.get("query_string", b""),
            scope["headers"],
            head,
            secure=scope.get("scheme") == "https",
        )

    def _check_body(
        self, scope: Scope, head: Head, action: str, pending: Pending, body: bytes | None
    ) -> Caller:
        """The signature checked against the body (None where unsigned), and the caller
        authorised for ``action``, or, for the query protocol, the action its body names."""
        caller = self.verifier.finish(pending, body or b"")
        if not head.target and scope["path"] == "/" and body:
            # The query protocol names its action in the (signed) body: the door reads
            # the same bytes, replayed, so what is authorised here is what runs there.
            target = query_target(body)
            if target is not None:
                try:
                    authorize(caller, iam_action(target), account_id=self.account_id)
                except AuthFailure as exc:
                    raise _QueryRefused(exc) from None
                return caller
        authorize(caller, action, account_id=self.account_id)
        return caller

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        try:
            return await bodies.read_body(
                scope, receive, max_bytes=self.max_body_bytes, timeout_s=self.body_timeout_s
            )
        except BodyTooLarge:
            raise SignedBodyTooLarge(
                f"Request body is larger than the maximum of {self.max_body_bytes} bytes."
            ) from None
        except BodyTimedOut as exc:
            raise SignedBodyTimeout(
                f"The request body did not arrive within {exc.timeout_s:g} seconds."
            ) from None


def _from_this_host(scope: Scope) -> bool:
    client = scope.get("client")
    return client is not None and is_loopback(str(client[0]))


class _QueryRefused(Exception):
    """A query-protocol request (its action named in its body) its key may not make."""

    def __init__(self, exc: AuthFailure) -> None:
        super().__init__(exc.message)
        self.exc = exc


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then what the socket says next."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(
    head: Head, exc: ShipyardError, scope: Scope, receive: Receive, send: Send
) -> None:
    """``exc`` in the door's shape: a form sent to ``POST /`` with no ``X-Amz-Target`` is
    the query protocol's, answered in its XML."""
    if (
        scope["path"] == "/"
        and not head.target
        and "x-www-form-urlencoded" in (head.content_type or "").lower()
    ):
        await _render_query(exc, scope, receive, send)
        return
    await _render(door_of(scope["path"]), exc, scope, receive, send)


async def _render_query(exc: ShipyardError, scope: Scope, receive: Receive, send: Send) -> None:
    status, payload = query.error(exc, str(uuid.uuid4()))
    await Response(payload, status_code=status, media_type="text/xml")(scope, receive, send)


async def _render(
    door: Door, exc: ShipyardError, scope: Scope, receive: Receive, send: Send
) -> None:
    if door is Door.RUNTIME:
        if isinstance(exc, ValidationException):
            # The runtime's clients know ValidationError, not the control plane's code.
            runtime = RuntimeValidationError(exc.message)
            runtime.status_code = exc.status_code
            exc = runtime
        await runtime_error_response(exc, send)
        return
    if door is Door.OPENAI:
        await openai_error_response(exc, send)
        return
    if door is Door.FACADE:
        response = facade_error_response(exc)
    elif door is Door.RPC_V2:
        response = rpc_v2_error_response(exc)
    elif door is Door.V2:
        payload = json.dumps({"error": exc.message})
        response = Response(payload, exc.status_code, media_type="application/json")
    else:
        response = control_error_response(exc)
    await response(scope, receive, send)
