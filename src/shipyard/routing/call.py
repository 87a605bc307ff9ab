"""Call: one request on its way to an instance, and what is told about it.

The record every door fills (routing/invocation.py and the router read it); kept apart
from the router so that a module naming a call does not import the router.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shipyard.contract import INVOCATIONS_PATH, TARGET_CONTAINER_HOSTNAME, TARGET_MODEL
from shipyard.http.client import Response, StreamedResponse
from shipyard.routing.instance import Instance

if TYPE_CHECKING:  # the tables' strategies name calls
    from shipyard.routing.table import VariantRoute

Headers = list[tuple[bytes, bytes]]


ASK_MODEL = 1
ASK_CONTAINER = 2
ASKED_BY: dict[bytes, int] = {TARGET_MODEL: ASK_MODEL, TARGET_CONTAINER_HOSTNAME: ASK_CONTAINER}
"""The forwarded request headers (as contract.FORWARDED names them) that ask the routing
for something: a TargetModel, a TargetContainerHostname."""


@dataclass(slots=True)
class Call:
    """One request for the router: what to send, and for which model.

    ``body`` is bytes, or an iterator of chunks (then ``content_length`` should say how
    many, and the request is never sent twice). ``model`` is the TargetModel, required by
    a multi-model variant and ignored by others. ``watch_gone``, when given, arranges for
    a callback once the client has disconnected and returns what cancels that: a request
    still waiting for an instance then leaves the queue with ClientGone instead of being
    served to nobody (a client that timed out and retried would otherwise have its
    request served twice, and the queue would hold work nobody waits for).

    ``target`` is the variant the client named (TargetVariant), ``component`` the
    inference component (InferenceComponentName); ``variant`` the route the
    call was routed to, once chosen (routing/invocation.py); ``started`` when the door
    took the request (``time.perf_counter``), for the gateway's share of its latency.
    """

    headers: Headers
    body: bytes | AsyncIterator[bytes]
    content_length: int | None = None
    model: str | None = None
    watch_gone: Callable[[Callable[[], None]], Callable[[], None]] | None = None
    target: str | None = None
    variant: VariantRoute | None = None
    started: float = field(default_factory=time.perf_counter)
    component: str | None = None
    """The InferenceComponentName the client named, if any."""
    session: str | None = None
    """The SessionId the client sent (routing/sessions.py), if any."""
    pinned: Instance | None = None
    """The instance the call must go to (its session's), if any."""
    instance: Instance | None = None
    """The instance the call was sent to, once chosen."""
    opened: bytes | None = None
    """Set when the call opened a session: the New-Session-Id header's value."""
    path: bytes = INVOCATIONS_PATH
    """Where on the instance it goes: ``/invocations``, or for a shadow's copies sent
    together (routing/shadow.py) contract.COPIES_PATH."""
    opening: bool = False
    """Set when the call asks for a new session (NEW_SESSION, routing/invocation.py)."""
    asks: int = 0
    """Which routing headers the client sent (ASK_MODEL, ASK_CONTAINER, as the door saw
    them forwarded): each is refused where the variant cannot honour it, as SageMaker
    refuses it (Invocations.pick)."""

    priority: int | None = None
    """The priority level the client asked for (routing/priorities.py), checked against
    its variant's levels once the variant is chosen; 0 or None: the default."""
    deadline_s: float | None = None
    """The deadline the client asked for (seconds from now by which it must have started
    on an instance), None: none; once the variant is chosen, the earlier of this and
    the variant's default."""
    level: int = 1
    """The level it waits at, once its variant's rules are applied: 1 is the most urgent."""

    def copy_to(self, variant: VariantRoute) -> Call:
        """This call for ``variant`` (a shadow's copy): the same request, no instance
        chosen or pinned, and no client to watch (it is sent once the client has its
        answer, and answers nobody). Field by field rather than ``dataclasses.replace``,
        which costs 5 µs against 0.7 on every copied request (a test keeps the fields
        listed)."""
        return Call(
            self.headers,
            self.body,
            self.content_length,
            self.model,
            None,  # a copy answers nobody: its client leaving must not cancel it
            self.target,
            variant,
            self.started,
            self.component,
            self.session,
            None,
            None,
            self.opened,
            self.path,
            False,
            self.asks,
            self.priority,
            self.deadline_s,
            self.level,
        )


@dataclass(slots=True)
class Exchange:
    """A streamed answer, and who gives it: see Router.stream."""

    variant: VariantRoute
    instance: Instance
    response: StreamedResponse
    head_s: float
    """Seconds from sending to the answer's head."""


Done = Callable[[Response | None, float, BaseException | None], None]
"""Told the outcome of a started call (Router.start): the answer and the model's seconds,
or the error ``invoke`` would raise."""
