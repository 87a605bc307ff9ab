"""The strategies a variant gives the router: how its requests are placed and admitted.

The router (routing/router.py) does the same steps for every variant: admit the request,
take an instance (waiting in the variant's queue when none can take it), send, learn from
the answer, give the instance back. What differs between kinds of variant is behind two
small interfaces, set on each VariantRoute by whoever builds the table:

- **Dispatch**: which instance may take the request, how it is sent there, and what the
  answer teaches. ``OneModel`` for a variant that serves one model (its routing policy
  chooses; the body goes to ``/invocations``); MultiModelDispatch (routing/multimodel.py)
  for ``Mode: MultiModel``, which chooses by TargetModel, keeps the view of which
  instance holds which model and retries a model too large for one instance on another;
  AdapterDispatch (routing/adapters.py) for an adapter inference component, which registers
  the adapter in its base's copies and names it in each request.
- **Admission**: whether a request may enter, and what the variant does when no instance
  can take it. ``Unlimited`` for a fleet that is there all the time; ServerlessAdmission
  (routing/serverless.py) admits against MaxConcurrency and asks for instances on demand.

A new kind of variant (inference components, sticky sessions) is a new strategy here and
in the module that owns it, not a branch in the router or in routing/invocation.py: what
they ask of a variant (does it read a TargetModel, may its requests wait, is an error
answer the platform's) they ask of its strategies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from shipyard.contract import INVOCATIONS_PATH
from shipyard.http.client import OnAnswer, Response, StreamedResponse
from shipyard.routing.instance import Instance
from shipyard.routing.policies import Policy

if TYPE_CHECKING:
    from shipyard.routing.call import Call
    from shipyard.routing.table import VariantRoute


class Dispatch(Protocol):
    """Places the requests of one variant on its instances."""

    names_model: bool
    """Its requests name a TargetModel (a multi-model variant), read by ``prepare``; a
    request that names one anywhere else is refused, and its answers are never
    streamed."""

    queues: bool
    """Its requests may wait at the gateway for an instance (as its policy says). A
    multi-model variant's do not: one waiting for one model must not hold back the
    requests for the others (a full one answers 503)."""

    def prepare(self, endpoint: str, call: Call) -> None:
        """Read what the dispatch needs from ``call`` before it is routed (only asked
        where ``names_model``); raises the client's error."""
        ...

    def platform_error(self, response: Response, call: Call) -> Exception | None:
        """The client's error for an error answer the platform gave rather than the
        model (a multi-model instance's ModelNotFound), or None: the model's own."""
        ...

    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        """The instance for ``call``, or None when every one is full."""
        ...

    def send(
        self, instance: Instance, call: Call, max_body: int | None, on_answer: OnAnswer
    ) -> Callable[[], None]:
        """Send ``call`` to ``instance``: its answer, or the error (an UpstreamError when
        none came), goes to ``on_answer`` from the loop's callbacks; returns what abandons
        it (then ``on_answer`` is not called). A dispatch that must await first (loading
        a model, registering an adapter) runs that in a task of its own (client.in_task):
        the router does not fork."""
        ...

    def open(
        self, instance: Instance, call: Call
    ) -> contextlib.AbstractAsyncContextManager[StreamedResponse]:
        """Send ``call`` to ``instance`` for a streamed answer: ``async with`` yields it
        once its head is in."""
        ...

    def learn(self, instance: Instance, call: Call, response: Response) -> bool:
        """Learn from ``instance``'s answer; True when another instance may serve what
        this one refused."""
        ...

    def unreachable(self, instance: Instance, call: Call) -> None:
        """The request never reached ``instance``."""
        ...


class Admission(Protocol):
    """Lets the requests of one variant in, and brings instances for them."""

    starts_instances: bool
    """Whether the variant starts instances for the requests that wait (then waiting for
    one with none up is a cold start, not an outage)."""

    @property
    def bound(self) -> int | None:
        """How many requests may wait at the gateway, when the admission bounds them
        itself (a serverless variant's MaxConcurrency); None: as many as the policy makes
        room for."""
        ...

    def admit(self) -> None:
        """Count one request in, or raise (ThrottlingException) to refuse it."""
        ...

    def leave(self) -> None:
        """An admitted request is done."""
        ...

    def waiting(self, variant: VariantRoute) -> None:
        """No instance of ``variant`` can take a request now: it is about to wait."""
        ...


class OneModel:
    """Dispatch for a variant serving one model: its routing policy chooses, and the
    request goes to the instance's ``/invocations`` as it came."""

    __slots__ = ("policy",)

    names_model = False
    queues = True

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __repr__(self) -> str:
        return f"OneModel({self.policy!r})"

    def prepare(self, endpoint: str, call: Call) -> None:
        pass

    def platform_error(self, response: Response, call: Call) -> Exception | None:
        return None

    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        return self.policy.choose(instances)

    def send(
        self, instance: Instance, call: Call, max_body: int | None, on_answer: OnAnswer
    ) -> Callable[[], None]:
        return instance.pool.start(
            b"POST",
            call.path,
            call.headers,
            call.body,
            max_body,
            on_answer,
            content_length=call.content_length,
        )

    def open(
        self, instance: Instance, call: Call
    ) -> contextlib.AbstractAsyncContextManager[StreamedResponse]:
        return open_invocation(instance, call)

    def learn(self, instance: Instance, call: Call, response: Response) -> bool:
        return False

    def unreachable(self, instance: Instance, call: Call) -> None:
        pass


def open_invocation(
    instance: Instance, call: Call
) -> contextlib.AbstractAsyncContextManager[StreamedResponse]:
    """``POST /invocations`` of ``call`` as it came, its answer streamed."""
    return instance.pool.stream(
        b"POST", INVOCATIONS_PATH, call.headers, call.body, content_length=call.content_length
    )


class Unlimited:
    """Admission for a fleet that is always there: every request enters; one that finds
    every instance full waits in the queue (or is refused) as the policy says."""

    __slots__ = ()

    starts_instances = False
    bound: int | None = None

    def __repr__(self) -> str:
        return "Unlimited()"

    def admit(self) -> None:
        pass

    def leave(self) -> None:
        pass

    def waiting(self, variant: VariantRoute) -> None:
        pass


UNLIMITED = Unlimited()


class FromZero:
    """Admission for the copies of an inference component, which may be scaled to zero:
    every request enters, and one that finds no copy running and none starting asks for
    one (``start``) and waits for it, instead of failing while the component comes back.
    (SageMaker fails such requests until an alarm's step policy adds a copy.)"""

    __slots__ = ("_start",)

    starts_instances = True
    bound: int | None = None

    def __init__(self, start: Callable[[], None]) -> None:
        self._start = start

    def __repr__(self) -> str:
        return "FromZero()"

    def admit(self) -> None:
        pass

    def leave(self) -> None:
        pass

    def waiting(self, variant: VariantRoute) -> None:
        if not variant.instances and not variant.coming:
            self._start()
