"""Stateful sessions (InvokeEndpoint's SessionId): a conversation kept on the instance,
or inference-component copy, that holds its state.

A request with ``SessionId: NEW_SESSION`` is routed as any other; the instance that
takes it gets the session, whose id the gateway makes up once that instance is chosen,
tells the model (the request's ``X-Amzn-SageMaker-Session-Id``) and returns to the
client (``X-Amzn-SageMaker-New-Session-Id: <id>; Expires=<time>``). Later requests naming
the id go to that instance while the session lives: until it expires, the model closes
it (its answer's ``X-Amzn-SageMaker-Closed-Session-Id``), or the instance is gone; after
that the id is a ValidationError, as SageMaker's is.

**The id says where the session lives.** It carries its expiry and the instance that
holds it (a digest of the instance's id and address, which a process restarted in place
does not share), signed with a key every gateway of one store shares (storage/secrets.py).
So any gateway, or any worker of ``shipyard serve --workers``, routes a session's
requests without asking the one that opened it, and an id a client made up, or one
whose expiry it changed, is refused like an unknown one. Each gateway remembers the
sessions closed, through it or through another gateway of the same store
(routing/session_closes.py shares them), until they would have expired. Requests
without a session are routed by the variant's policy, untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import struct
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shipyard.contract import SESSION_ID
from shipyard.errors import RuntimeValidationError
from shipyard.routing.instance import Instance

if TYPE_CHECKING:
    from shipyard.routing.router import Call

NEW_SESSION = "NEW_SESSION"
REQUEST_HEADER = b"x-amzn-sagemaker-session-id"
"""On a request: the session it belongs to, or NEW_SESSION (also what the model gets)."""
NEW_HEADER = b"x-amzn-sagemaker-new-session-id"
CLOSED_HEADER = b"x-amzn-sagemaker-closed-session-id"
DEFAULT_TTL_S = 20 * 60.0
MAX_CLOSING = 100_000
"""Closes kept for the store's other gateways while it cannot be written."""

log = logging.getLogger(__name__)
_PAYLOAD = struct.Struct(">I8s8s")
"""An id's signed part: expiry (whole Unix seconds), a random nonce, the instance digest."""
_MAC_BYTES = 16
_ID_CHARS = 2 * (_PAYLOAD.size + _MAC_BYTES)
"""An id is hexadecimal, as botocore's pattern for session ids allows
(``[a-zA-Z0-9](-*[a-zA-Z0-9])*``)."""


class Sessions:
    """Makes and reads session ids; remembers the sessions opened and closed here."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
        key: bytes | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self.key = key if key is not None else secrets.token_bytes(32)
        """The signing key; the gateway sets the one its store shares (app.py)."""
        self._opened: dict[str, tuple[str, float]] = {}
        """Sessions opened here: id → (endpoint, expiry), for the console's count."""
        self._closed: dict[str, float] = {}
        """Sessions closed, here or through another gateway of the store: id → the
        expiry they would have reached."""
        self.closing: list[tuple[str, float]] = []
        """Closes answered here and not yet shared with the store's other gateways
        (routing/session_closes.py takes them)."""
        self._swept = 0.0

    def __repr__(self) -> str:
        return f"Sessions(live={len(self._opened)}, ttl_s={self.ttl_s:g})"

    @staticmethod
    def unsigned_id() -> str:
        """An id of the same shape that names no session (no gateway made it)."""
        return secrets.token_hex(_ID_CHARS // 2)

    def assign(self, call: Call, endpoint: str, instance: Instance) -> None:
        """``call`` opens a session and goes to ``instance``: make its id, and put it on
        the request in place of NEW_SESSION (or of the id made for an instance tried
        before). Called by the router as it sends the call (routing/router.py)."""
        expires = math.ceil(self._clock() + self.ttl_s)  # whole seconds, never short
        payload = _PAYLOAD.pack(expires, secrets.token_bytes(8), instance.digest)
        session_id = (payload + self._mac(endpoint, payload)).hex()
        call.session = session_id
        found = header_at(call.headers)
        if found >= 0:
            call.headers[found] = (call.headers[found][0], session_id.encode())

    def opened(self, session_id: str, endpoint: str) -> bytes:
        """The model took the session: remember it, and give the New-Session-Id header's
        value, ``<id>; Expires=<time>`` as SageMaker answers it."""
        expires = float(int(session_id[:8], 16))  # the payload's first field
        self._sweep()
        self._opened[session_id] = (endpoint, expires)
        at = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{session_id}; Expires={at}".encode()

    def instance_for(
        self, endpoint: str, session_id: str, places: Iterable[Iterable[Instance]]
    ) -> Instance | None:
        """The instance, among ``places`` (the instances of the endpoint's variants or
        copies), holding session ``session_id`` of ``endpoint``; None when the session
        is good but its instance is not among them (gone, or not in this gateway's
        table yet: routing/invocation.py tells which).

        Raises:
            RuntimeValidationError: no such session (an id this store's gateways did not
                make, or made for another endpoint), or it has expired or been closed.
        """
        read = self._read(endpoint, session_id)
        if read is None or session_id in self._closed:
            raise gone(session_id)
        expires, digest = read
        if expires <= self._clock():
            self._opened.pop(session_id, None)
            raise gone(session_id)
        for instances in places:
            for instance in instances:
                if instance.digest == digest:
                    return instance
        return None

    def count(self, endpoint: str) -> int:
        """Sessions of ``endpoint`` opened here and not yet expired or closed (for the
        console)."""
        now = self._clock()
        return sum(1 for e, expires in self._opened.values() if e == endpoint and expires > now)

    def close(self, session_id: str, endpoint: str, instance: Instance | None) -> None:
        """The model of ``endpoint`` on ``instance`` closed the session: one of its own
        only."""
        read = self._read(endpoint, session_id)
        if read is None or instance is None or read[1] != instance.digest:
            return
        self._sweep()
        self._opened.pop(session_id, None)
        if session_id not in self._closed:
            self._closed[session_id] = read[0]
            if len(self.closing) < MAX_CLOSING:
                self.closing.append((session_id, read[0]))
            else:  # the store has been unreachable for long: refused here, not shared
                log.warning(
                    "session %s closed: not shared, %d closes wait", session_id, MAX_CLOSING
                )

    def learn(self, closed: Iterable[tuple[str, float]]) -> None:
        """Sessions closed through other gateways of the store (id, expiry)."""
        for session_id, expires in closed:
            self._closed[session_id] = expires
            self._opened.pop(session_id, None)
        self._sweep()  # a gateway that opens and closes none forgets them too

    def _read(self, endpoint: str, session_id: str) -> tuple[float, bytes] | None:
        """(expiry, instance digest) of an id signed for ``endpoint``; None otherwise."""
        if len(session_id) != _ID_CHARS:
            return None
        try:
            raw = bytes.fromhex(session_id)
        except ValueError:
            return None
        if raw.hex() != session_id:
            return None  # one spelling per id (lower case): closes are kept by it
        payload, mac = raw[: _PAYLOAD.size], raw[_PAYLOAD.size :]
        if not hmac.compare_digest(mac, self._mac(endpoint, payload)):
            return None
        expires, _, digest = _PAYLOAD.unpack(payload)
        return float(expires), digest

    def _mac(self, endpoint: str, payload: bytes) -> bytes:
        signed = endpoint.encode() + b"\0" + payload
        return hmac.new(self.key, signed, hashlib.sha256).digest()[:_MAC_BYTES]

    def _sweep(self) -> None:
        """Forget what has expired (on an open or a close, at most once a second: what
        is kept stays bounded by a TTL's worth of sessions, and a client opening many
        does not make each open read them all)."""
        now = self._clock()
        if now - self._swept < 1.0:
            return
        self._swept = now
        for key in [k for k, (_, expires) in self._opened.items() if expires <= now]:
            del self._opened[key]
        for key in [k for k, expires in self._closed.items() if expires <= now]:
            del self._closed[key]


def header_at(headers: list[tuple[bytes, bytes]]) -> int:
    """Where a request's SessionId header is among ``headers``, or -1. The doors forward
    headers under their canonical names (contract.FORWARDED), so no name is lower-cased
    here, on every request; a loop, not a generator, for the same reason."""
    for n, (key, _) in enumerate(headers):
        if key == SESSION_ID or key == REQUEST_HEADER:
            return n
    return -1


def gone(session_id: str) -> RuntimeValidationError:
    return RuntimeValidationError(
        f"Session {session_id} is not valid: it has expired, was closed, or its instance "
        "is gone. Start a new session with SessionId NEW_SESSION."
    )
