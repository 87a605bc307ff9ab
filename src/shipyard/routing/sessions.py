"""Stateful sessions (InvokeEndpoint's SessionId): a conversation kept on the instance,
or inference-component copy, that holds its state.

A request with ``SessionId: NEW_SESSION`` is routed as any other; the instance that
answers it gets the session, whose id the gateway makes up, tells the model (the
request's ``X-Amzn-SageMaker-Session-Id``) and returns to the client
(``X-Amzn-SageMaker-New-Session-Id: <id>; Expires=<time>``). Later requests naming the
id go to that instance while the session lives: until it expires, the model closes it
(its answer's ``X-Amzn-SageMaker-Closed-Session-Id``), or the instance is gone; after
that the id is a ValidationError, as SageMaker's is.

Kept in the gateway's memory: a session lives no longer than its instance does, and a
gateway restart (which restarts the instances) ends them all. Requests without a
session are routed by the variant's policy, untouched.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from shipyard.errors import RuntimeValidationError
from shipyard.routing.instance import Instance

NEW_SESSION = "NEW_SESSION"
REQUEST_HEADER = b"x-amzn-sagemaker-session-id"
"""On a request: the session it belongs to, or NEW_SESSION (also what the model gets)."""
NEW_HEADER = b"x-amzn-sagemaker-new-session-id"
CLOSED_HEADER = b"x-amzn-sagemaker-closed-session-id"
DEFAULT_TTL_S = 20 * 60.0


@dataclass(frozen=True, slots=True)
class Session:
    endpoint: str
    instance: Instance
    """The process that holds it: an instance restarted in place is a new Instance, so
    its sessions, whose state died with the old process, are gone."""
    expires: float
    """Wall-clock seconds (time.time) after which the session is gone."""

    def header(self, session_id: str) -> bytes:
        """``<id>; Expires=<time>``, as SageMaker answers a new session."""
        at = datetime.fromtimestamp(self.expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{session_id}; Expires={at}".encode()


class Sessions:
    """The live sessions of one gateway, by id."""

    def __init__(
        self, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._live: dict[str, Session] = {}

    def __repr__(self) -> str:
        return f"Sessions(live={len(self._live)}, ttl_s={self.ttl_s:g})"

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def open(self, session_id: str, endpoint: str, instance: Instance) -> Session:
        self._sweep()
        session = Session(endpoint, instance, self._clock() + self.ttl_s)
        self._live[session_id] = session
        return session

    def instance_for(self, endpoint: str, session_id: str) -> Instance:
        """The instance holding session ``session_id`` of ``endpoint``.

        Raises:
            RuntimeValidationError: no such session, or it has expired or been closed.
        """
        session = self._live.get(session_id)
        if session is None or session.endpoint != endpoint:
            raise gone(session_id)
        if session.expires <= self._clock():
            del self._live[session_id]
            raise gone(session_id)
        return session.instance

    def count(self, endpoint: str) -> int:
        """Sessions of ``endpoint`` not yet expired (for the console)."""
        now = self._clock()
        return sum(1 for s in self._live.values() if s.endpoint == endpoint and s.expires > now)

    def close(self, session_id: str, endpoint: str) -> None:
        """The model of ``endpoint`` closed the session (one of its own only)."""
        session = self._live.get(session_id)
        if session is not None and session.endpoint == endpoint:
            del self._live[session_id]

    def _sweep(self) -> None:
        """Forget expired sessions (on each open: their number stays bounded by what a
        TTL's worth of new sessions holds)."""
        now = self._clock()
        for key in [k for k, s in self._live.items() if s.expires <= now]:
            del self._live[key]


def gone(session_id: str) -> RuntimeValidationError:
    return RuntimeValidationError(
        f"Session {session_id} is not valid: it has expired, was closed, or its instance "
        "is gone. Start a new session with SessionId NEW_SESSION."
    )
