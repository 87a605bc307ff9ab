"""Stateful sessions (InvokeEndpoint's SessionId), as SageMaker defines them: the model
owns the session; the gateway routes its requests to the instance, or inference-component
copy, that holds it.

A request with ``SessionId: NEW_SESSION`` is routed as any other and reaches the model
unchanged. The model creates the session and answers
``X-Amzn-SageMaker-New-Session-Id: <id>; Expires=<time>``; the gateway passes that on and
pins the id to the instance that answered, until the time the model gave (at most
``max_ttl_s`` on: a later one is cut to it). An id the model answers that names a session
live on another instance is the model's error, and that session stays. A model that
answers no id (one written without sessions) gets the gateway's own: an id made here,
lasting ``ttl_s`` from the answer. Later requests naming the id go to its instance, with
the id in the same header, while the session lives: until it expires, the model closes
it (its answer's ``X-Amzn-SageMaker-Closed-Session-Id``), or the instance is gone; after
that the id is a ValidationError, as SageMaker's is.

**Bounded.** A gateway keeps at most ``max_open`` sessions per endpoint opened through
it; beyond that a NEW_SESSION is refused (ThrottlingException) before it reaches the
model, and expired sessions free their places: each NEW_SESSION first forgets the
sessions expired by then (in order of expiry, so at little cost), and an endpoint taken
out of routing is forgotten whole (``forget``). What it learned of other gateways'
sessions, and the closes, are bounded as well (``MAX_KNOWN``, ``MAX_CLOSED``).

**Across gateways.** The gateway's own ids say where the session lives: they carry the
expiry and the instance (a digest of its id and address, which a process restarted in
place does not share), signed with a key every gateway of one store shares
(storage/secrets.py), so any gateway routes them without asking; one a client made up or
altered is refused. A model's own id says nothing, so the gateway that saw it opened
records the pin in the store before the client has the id (storage/sessions.py); another
gateway that does not know an id reads it there once. Closes are shared through the store
in the background (routing/session_closes.py). Requests without a session pay for one
scan of their headers.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import hmac
import logging
import math
import re
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shipyard.contract import SESSION_ID
from shipyard.errors import ModelError, RuntimeValidationError, Throttling
from shipyard.routing.instance import Instance

if TYPE_CHECKING:
    from shipyard.storage.sessions import SessionPins

NEW_SESSION = "NEW_SESSION"
REQUEST_HEADER = b"x-amzn-sagemaker-session-id"
"""On a request: the session it belongs to, or NEW_SESSION (also what the model gets)."""
NEW_HEADER = b"x-amzn-sagemaker-new-session-id"
CLOSED_HEADER = b"x-amzn-sagemaker-closed-session-id"
DEFAULT_TTL_S = 20 * 60.0
DEFAULT_MAX_TTL_S = 6 * 3600.0
DEFAULT_MAX_OPEN = 10_000
MAX_CLOSING = 100_000
"""Closes kept for the store's other gateways while it cannot be written."""
MAX_CLOSED = 100_000
"""Closed sessions remembered (until they would have expired); the oldest are forgotten
first. A model's own id forgotten here is still refused: the store says it is closed."""
MAX_KNOWN = 10_000
"""Sessions opened through other gateways, learned from the store, kept (oldest out)."""

Pin = tuple[bytes, float]
"""Where a session lives and until when: the instance's digest, the expiry (Unix time)."""

log = logging.getLogger(__name__)
_PAYLOAD = struct.Struct(">I8s8s")
"""A gateway id's signed part: expiry (whole Unix seconds), a nonce, the instance digest."""
_MAC_BYTES = 16
_ID_CHARS = 2 * (_PAYLOAD.size + _MAC_BYTES)
"""A gateway id is hexadecimal, as botocore's pattern for session ids allows."""
_VALID_ID = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
"""botocore's pattern for a session id (at most 256 characters)."""
_MAX_ID = 256
_COMPACT_MIN = 1024
"""Expiries of sessions no longer open kept before the heap of expiries is rebuilt."""
_LAST_TIME = 253402300799.0
"""9999-12-31T23:59:59Z: the last time an expiry can say."""


class Sessions:
    """Pins sessions to instances; makes the gateway's own ids and reads them."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
        max_open: int = DEFAULT_MAX_OPEN,
        clock: Callable[[], float] = time.time,
        key: bytes | None = None,
        pins: SessionPins | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_ttl_s = max_ttl_s
        self.max_open = max_open
        self._clock = clock
        self.key = key if key is not None else secrets.token_bytes(32)
        """The signing key; the gateway sets the one its store shares (app.py)."""
        self.pins = pins
        """The store's pins of models' own ids; None: this gateway alone."""
        self._open: dict[str, dict[str, Pin]] = {}
        """Sessions opened here: endpoint → id → pin."""
        self._known: OrderedDict[tuple[str, str], Pin] = OrderedDict()
        """Sessions opened through other gateways, read from the store."""
        self._closed: dict[str, float] = {}
        """Sessions closed, here or through another gateway of the store: key (``key``)
        → the expiry they would have reached."""
        self.closing: list[tuple[str, float]] = []
        """Closes (key, expiry) answered here and not yet shared with the store's other
        gateways (routing/session_closes.py takes them)."""
        self._expiries: list[tuple[float, str, str]] = []
        """A heap of (expiry, endpoint, id) of the sessions opened here, the earliest
        first; some no longer open (closed, forgotten, opened again) until they expire or
        the heap is rebuilt (``_compact_at``)."""
        self._compact_at = _COMPACT_MIN

    def __repr__(self) -> str:
        live = sum(len(o) for o in self._open.values())
        return f"Sessions(live={live}, ttl_s={self.ttl_s:g}, max_open={self.max_open})"

    @staticmethod
    def unsigned_id() -> str:
        """An id of the gateway's shape that names no session (no gateway made it)."""
        return secrets.token_hex(_ID_CHARS // 2)

    # -- opening ----------------------------------------------------------------------

    def admit(self, endpoint: str) -> None:
        """A NEW_SESSION for ``endpoint`` may go to the model: fewer than ``max_open`` of
        its sessions opened here live (the expired ones, of every endpoint, are forgotten
        first).

        Raises:
            Throttling: as many as that live.
        """
        self._expire()
        opened = self._open.get(endpoint)
        if opened is not None and len(opened) >= self.max_open:
            raise Throttling(
                f"Endpoint {endpoint} has {self.max_open} open sessions, the most it may "
                "have: close one or wait for one to expire before opening another."
            )

    def opened(
        self, endpoint: str, instance: Instance | None, answered: bytes | None
    ) -> tuple[str, bytes]:
        """The model on ``instance`` answered a NEW_SESSION with ``answered`` (its
        New-Session-Id header, or None): pin the session, and give its id and the header
        the client gets, ``<id>; Expires=<time>``. Without an id from the model, the
        gateway's own (signed, naming the instance), lasting ``ttl_s``.

        Raises:
            ModelError: the model answered a New-Session-Id that is not one, or one that
                names a session live on another instance (which stays there).
        """
        digest = instance.digest if instance is not None else b""
        if answered:
            session_id, expires = self._read_header(answered)
            try:
                live = self.where(endpoint, session_id)
            except RuntimeValidationError:
                live = None  # expired or closed: the model may use the id again
            if live is not None and live[0] != digest:
                raise taken(session_id, answered)
        else:
            expires = float(math.ceil(self._clock() + self.ttl_s))  # whole seconds
            payload = _PAYLOAD.pack(int(expires), secrets.token_bytes(8), digest)
            session_id = (payload + self._mac(endpoint, payload)).hex()
        self._expire()
        opened = self._open.setdefault(endpoint, {})
        opened[session_id] = (digest, expires)
        heapq.heappush(self._expiries, (expires, endpoint, session_id))
        self._closed.pop(key(endpoint, session_id), None)  # a model may reuse its ids
        return session_id, f"{session_id}; Expires={_iso(expires)}".encode()

    def _read_header(self, value: bytes) -> tuple[str, float]:
        """(id, expiry) of a model's New-Session-Id: ``<id>; Expires=<ISO 8601 time>``.
        Without an Expires, or with one no date, the gateway's ``ttl_s`` from now; one
        later than ``max_ttl_s`` from now, that (whole seconds)."""
        text = value.decode("latin-1")
        session_id, _, rest = text.partition(";")
        session_id = session_id.strip()
        if len(session_id) > _MAX_ID or not _VALID_ID.fullmatch(session_id):
            raise ModelError(
                f"The model answered a new session id that is not one: {text[:300]!r} "
                "(an id is letters, digits and single hyphens, at most 256 characters).",
                original_status_code=200,
                original_message=text[:300],
            )
        expires = None
        for part in rest.split(";"):
            name, _, at = part.strip().partition("=")
            if name.strip().lower() == "expires":
                expires = _parse_time(at.strip())
        now = self._clock()
        if expires is None:
            expires = float(math.ceil(now + self.ttl_s))
        return session_id, min(expires, float(math.floor(now + self.max_ttl_s)))

    async def share(self, endpoint: str, session_id: str) -> None:
        """Record a model's own id opened here in the store, so that every gateway of it
        routes the session: before the client has the id. The gateway's own ids need no
        record; nor does a gateway without a store.

        Raises:
            ModelError: the store has the id live on another instance (opened through
                another gateway): it stays there, and is no longer pinned here.
        """
        pins = self.pins
        pin = self._open.get(endpoint, {}).get(session_id)
        if pins is None or pin is None or self._signed(endpoint, session_id) is not None:
            return
        try:
            recorded = await asyncio.to_thread(
                pins.record, key(endpoint, session_id), *pin, self._clock()
            )
        except Exception:
            log.exception("recording session %s in the store failed: this gateway alone "
                          "routes it", session_id)  # fmt: skip
            return
        if not recorded:  # live on another instance, opened through another gateway
            opened = self._open.get(endpoint)
            if opened is not None and opened.get(session_id) == pin:
                del opened[session_id]
            raise taken(session_id, session_id.encode())

    # -- following --------------------------------------------------------------------

    def where(self, endpoint: str, session_id: str) -> Pin | None:
        """The pin of live session ``session_id`` of ``endpoint``; None when this gateway
        does not know the id (``fetch`` asks the store).

        Raises:
            RuntimeValidationError: it has expired or been closed.
        """
        pin = self._open.get(endpoint, {}).get(session_id)
        if pin is None:
            pin = self._known.get((endpoint, session_id))
        if pin is None:
            pin = self._signed(endpoint, session_id)
            if pin is None:
                return None
        if pin[1] <= self._clock() or key(endpoint, session_id) in self._closed:
            raise gone(session_id)
        return pin

    async def fetch(self, endpoint: str, session_id: str) -> bool:
        """Learn session ``session_id`` of ``endpoint`` from the store (opened through
        another gateway of it); whether it is there, open."""
        pins = self.pins
        if pins is None or len(session_id) > _MAX_ID:
            return False
        found = await asyncio.to_thread(pins.find, key(endpoint, session_id), self._clock())
        if found is None:
            return False
        known = self._known
        known[(endpoint, session_id)] = found
        while len(known) > MAX_KNOWN:
            known.popitem(last=False)
        return True

    @staticmethod
    def instance_for(pin: Pin, places: Iterable[Iterable[Instance]]) -> Instance | None:
        """The instance, among ``places`` (the instances of the endpoint's variants or
        copies), that ``pin`` names; None when it is not among them (gone, or not in this
        gateway's table yet: routing/invocation.py tells which)."""
        digest = pin[0]
        for instances in places:
            for instance in instances:
                if instance.digest == digest:
                    return instance
        return None

    def count(self, endpoint: str) -> int:
        """Sessions of ``endpoint`` opened here and not yet expired or closed (for the
        console)."""
        now = self._clock()
        return sum(1 for _, expires in self._open.get(endpoint, {}).values() if expires > now)

    # -- closing ----------------------------------------------------------------------

    def close(self, session_id: str, endpoint: str, instance: Instance | None) -> None:
        """The model of ``endpoint`` on ``instance`` closed the session: one of its own
        only."""
        try:
            pin = self.where(endpoint, session_id)
        except RuntimeValidationError:
            return
        if pin is None or instance is None or pin[0] != instance.digest:
            return
        opened = self._open.get(endpoint)
        if opened is not None:
            opened.pop(session_id, None)
        self._known.pop((endpoint, session_id), None)
        closed = key(endpoint, session_id)
        self._closed[closed] = pin[1]
        while len(self._closed) > MAX_CLOSED:
            del self._closed[next(iter(self._closed))]
        if len(self.closing) < MAX_CLOSING:
            self.closing.append((closed, pin[1]))
        else:  # the store has been unreachable for long: refused here, not shared
            log.warning("session %s closed: not shared, %d closes wait", session_id, MAX_CLOSING)

    def learn(self, closed: Iterable[tuple[str, float]]) -> None:
        """Sessions closed through other gateways of the store (key, expiry)."""
        for closed_key, expires in closed:
            self._closed[closed_key] = expires
        while len(self._closed) > MAX_CLOSED:
            del self._closed[next(iter(self._closed))]
        now = self._clock()
        for closed_key in [k for k, expires in self._closed.items() if expires <= now]:
            del self._closed[closed_key]

    # -- the gateway's own ids --------------------------------------------------------

    def _signed(self, endpoint: str, session_id: str) -> Pin | None:
        """The pin a gateway id signed for ``endpoint`` carries; None for any other."""
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
        return digest, float(expires)

    def _mac(self, endpoint: str, payload: bytes) -> bytes:
        signed = endpoint.encode() + b"\0" + payload
        return hmac.new(self.key, signed, hashlib.sha256).digest()[:_MAC_BYTES]

    def forget(self, endpoint: str) -> None:
        """``endpoint`` is out of routing (deleted, or its fleet gone): forget its
        sessions opened here and those learned from the store. Its gateway ids name
        instances no table holds; a later request naming one of its sessions is refused,
        as one whose instance is gone."""
        self._open.pop(endpoint, None)
        for known in [k for k in self._known if k[0] == endpoint]:
            del self._known[known]

    def _expire(self) -> None:
        """Forget the sessions opened here that have expired, earliest first: each is
        looked at once, when it expires. The heap keeps the expiries of sessions closed
        or forgotten until theirs come; when those make up most of it, it is rebuilt
        from the open ones (at a cost shared by the sessions opened since)."""
        expiries, now = self._expiries, self._clock()
        while expiries and expiries[0][0] <= now:
            expires, endpoint, session_id = heapq.heappop(expiries)
            opened = self._open.get(endpoint)
            if opened is None:
                continue
            pin = opened.get(session_id)
            if pin is not None and pin[1] == expires:
                del opened[session_id]
                if not opened:
                    del self._open[endpoint]
        if len(expiries) > self._compact_at:
            expiries[:] = [
                (expires, endpoint, session_id)
                for endpoint, opened in self._open.items()
                for session_id, (_, expires) in opened.items()
            ]
            heapq.heapify(expiries)
            self._compact_at = 2 * len(expiries) + _COMPACT_MIN


def key(endpoint: str, session_id: str) -> str:
    """What names a session in the store and among the closes: ids are the models', so
    two endpoints may use the same one."""
    return hashlib.sha256(f"{endpoint}\0{session_id}".encode()).hexdigest()


def header_at(headers: list[tuple[bytes, bytes]]) -> int:
    """Where a request's SessionId header is among ``headers``, or -1. The doors forward
    headers under their canonical names (contract.FORWARDED), so no name is lower-cased
    here, on every request; a loop, not a generator, for the same reason."""
    for n, (name, _) in enumerate(headers):
        if name == SESSION_ID or name == REQUEST_HEADER:
            return n
    return -1


def taken(session_id: str, answered: bytes) -> ModelError:
    """The model answered a new session id that is another instance's live session."""
    text = answered.decode("latin-1")[:300]
    return ModelError(
        f"The model answered new session id {session_id[:300]}, which names a session "
        "open on another instance of the endpoint: refused, and that session stays there.",
        original_status_code=200,
        original_message=text,
    )


def gone(session_id: str) -> RuntimeValidationError:
    return RuntimeValidationError(
        f"Session {session_id} is not valid: it has expired, was closed, or its instance "
        "is gone. Start a new session with SessionId NEW_SESSION."
    )


def _iso(expires: float) -> str:
    """SageMaker's form of an expiry: UTC, whole seconds (``2025-01-01T00:00:00Z``)."""
    return datetime.fromtimestamp(int(expires), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> float | None:
    """An ISO 8601 time (UTC when it names no zone) as Unix time; None if it is none."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return min(max(at.timestamp(), 0.0), _LAST_TIME)
