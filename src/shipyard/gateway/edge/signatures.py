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

Both edges have two drivers over the same checks (``_prepare`` before the body,
``_finish`` with a signed body): the ASGI call, and ``serve_whole`` for a request whose
body is already whole (the callback path, http/server.py). They differ only in how the
body arrives and how a refusal is written: ``serve_whole`` declines, and the ASGI call
answers it in the door's shape.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple

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
ServeWhole = Callable[[Scope, bytes, Respond], bool]
"""An app's ``serve_whole``: the callback path's driver (http/server.py)."""


class ReadOnce:
    """Wraps the gateway's app: read the head once, refuse repeats, hand the doors the value;
    with ``browser`` rules, refuse what they refuse.

    Two drivers over one preparation (``_prepare``): ``__call__``, the ASGI app, and
    ``serve_whole``, the callback path's, for a request whose body is already whole. They
    differ only in how the body reaches the preparation and how a refusal is written."""

    def __init__(
        self, app: ASGIApp, *, account_id: str = "", browser: BrowserRules | None = None
    ) -> None:
        self.app = app
        self.account_id = account_id
        self.browser = browser
        self._serve_whole: ServeWhole | None = getattr(app, "serve_whole", None)

    def __repr__(self) -> str:
        return f"ReadOnce(browser={self.browser!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            pending = self._prepare(scope)
            if pending is not None:  # a signed body: read, then checked
                body = await self._read_body(scope, receive, pending)
                self._finish(scope, pending, body)
                receive = _replay(body, receive)
        except ClientLeft:
            return  # gone before its body was whole: nobody to answer
        except _Refused as refused:
            log.info("refused %s %s: %s", scope["method"], scope["path"], refused.reason)
            await refused.render(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def serve_whole(self, scope: Scope, body: bytes, respond: Respond) -> bool:
        """The callback path's driver (http/server.py): the request, its whole ``body``
        in hand, prepared as ``__call__`` prepares it, then offered to the app's
        ``serve_whole``. False, with nothing done, for a request the preparation refuses
        (``__call__`` answers the refusal in its door's shape) or the app declines."""
        serve = self._serve_whole
        if serve is None:
            return False
        try:
            pending = self._prepare(scope, len(body))
            if pending is not None:
                self._finish(scope, pending, body)
        except _Refused:
            return False
        return serve(scope, body, respond)

    def _prepare(self, scope: Scope, length: int | None = None) -> _Pending | None:
        """What both drivers do before the body: read the head once (a repeated header
        refused) and hold it to the browser rules; the request admitted
        (``scope[ADMITTED]``). ``length``: the body's, when it is whole already. None: no
        body is needed to admit it. Raises _Refused."""
        try:
            head = read_head(scope["headers"])
        except RepeatedHeader as exc:
            raise _Refused(door_of(scope["path"]), exc) from None
        browser = self.browser
        if browser is not None:
            refusal = browser.refusal(scope["method"], scope["path"], head)
            if refusal is not None:
                raise _Refused(_shape_of(scope, head), AccessDenied(refusal), refusal)
        scope[ADMITTED] = Admitted(head, account_id=self.account_id)
        return None

    async def _read_body(self, scope: Scope, receive: Receive, pending: _Pending) -> bytes:
        """The body ``pending`` needs, read for ``__call__``; only RequireSignature asks."""
        raise AssertionError("ReadOnce admits every request by its head")

    def _finish(self, scope: Scope, pending: _Pending, body: bytes) -> None:
        """The request admitted with the body ``pending`` asked for; only RequireSignature
        asks."""
        raise AssertionError("ReadOnce admits every request by its head")


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

    def _prepare(self, scope: Scope, length: int | None = None) -> _Pending | None:
        """Read once, then everything the head says checked before any of the body is
        read: a bearer token's caller authorised, or the signature checked in all but
        the body (a _Pending when the body is signed; an unsigned body is never read).
        A path that needs no signature is admitted unchecked."""
        try:
            head = read_head(scope["headers"])
        except RepeatedHeader as exc:
            raise _Refused(door_of(scope["path"]), exc) from None
        door_action = action_of(scope["method"], scope["path"], head.target)
        if door_action is None:
            scope[ADMITTED] = Admitted(head, account_id=self.account_id)
            return None
        door, action = door_action
        try:
            if length is not None and length > self.max_body_bytes:
                raise _too_large(self.max_body_bytes)  # a whole body, chunked or not
            checked = self._check_head(scope, head, door, action)
        except (AuthFailure, SignedBodyTooLarge) as exc:
            raise _Refused(door, exc, exc.wire_type) from None
        if isinstance(checked, Caller):
            scope[ADMITTED] = Admitted(head, action, checked, self.account_id)
            return None
        pending = _Pending(head, door, action, checked)
        if checked.needs_body:
            return pending
        self._finish(scope, pending, None)  # unsigned (TLS only): the body is not read
        return None

    def _finish(self, scope: Scope, pending: _Pending, body: bytes | None) -> None:
        """The signature checked against ``body`` (None where unsigned), and the caller
        authorised: the request admitted. Raises _Refused."""
        head, door, action, checked = pending
        try:
            caller = self._check_body(scope, head, action, checked, body)
        except _QueryRefused as refused:  # in the query protocol's XML, as its client reads
            raise _Refused(None, refused.exc, refused.exc.wire_type) from None
        except AuthFailure as exc:
            raise _Refused(door, exc, exc.wire_type) from None
        scope[ADMITTED] = Admitted(head, action, caller, self.account_id)

    async def _read_body(self, scope: Scope, receive: Receive, pending: _Pending) -> bytes:
        """The signed body, up to ``max_body_bytes``, within ``body_timeout_s``."""
        try:
            return await bodies.read_body(
                scope, receive, max_bytes=self.max_body_bytes, timeout_s=self.body_timeout_s
            )
        except BodyTooLarge:
            exc: ShipyardError = _too_large(self.max_body_bytes)
        except BodyTimedOut as timed_out:
            exc = SignedBodyTimeout(
                f"The request body did not arrive within {timed_out.timeout_s:g} seconds."
            )
        raise _Refused(pending.door, exc, exc.wire_type)

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
            raise _too_large(self.max_body_bytes)
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


def _from_this_host(scope: Scope) -> bool:
    client = scope.get("client")
    return client is not None and is_loopback(str(client[0]))


class _QueryRefused(Exception):
    """A query-protocol request (its action named in its body) its key may not make."""

    def __init__(self, exc: AuthFailure) -> None:
        super().__init__(exc.message)
        self.exc = exc


class _Pending(NamedTuple):
    """A request whose head the edge has checked, its signed body still to check."""

    head: Head
    door: Door
    action: str
    checked: Pending


class _Refused(Exception):
    """A request the edge refuses: ``exc``, answered in ``door``'s shape (None: the query
    protocol's XML); ``reason`` is what the log says of it."""

    def __init__(self, door: Door | None, exc: ShipyardError, reason: str | None = None) -> None:
        super().__init__(exc.message)
        self.door = door
        self.exc = exc
        self.reason = exc.message if reason is None else reason

    async def render(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.door is None:
            await _render_query(self.exc, scope, receive, send)
        else:
            await _render(self.door, self.exc, scope, receive, send)


def _too_large(max_body_bytes: int) -> SignedBodyTooLarge:
    return SignedBodyTooLarge(f"Request body is larger than the maximum of {max_body_bytes} bytes.")


def _shape_of(scope: Scope, head: Head) -> Door | None:
    """The shape a refusal of the browser rules is answered in: a form sent to ``POST /``
    with no ``X-Amz-Target`` is the query protocol's (None), answered in its XML."""
    if (
        scope["path"] == "/"
        and not head.target
        and "x-www-form-urlencoded" in (head.content_type or "").lower()
    ):
        return None
    return door_of(scope["path"])


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
