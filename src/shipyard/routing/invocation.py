"""Invocation: everything around a router call, once, for every door.

A door (InvokeEndpoint, response streaming, the Open Inference Protocol over REST and
gRPC, the asynchronous consumer, batch transform) only translates its wire format into
a :class:`~shipyard.routing.call.Call` and the answer back. What happens in between
lives here:

- the variant (the one the client named, or one by weight) and, for a multi-model
  variant, the TargetModel the request names;
- the router call (routing/router.py), which chooses the instance, queues, and admits a
  serverless variant's requests against its MaxConcurrency;
- the shadow copies (routing/shadow.py), sent once the production answer is in;
- the server-side batch the instance reports, and the model and overhead latency;
- data capture of what was answered (capture/writer.py);
- a model's error answer turned into the runtime's ModelError (or, for a multi-model
  instance's platform error, the error SageMaker gives for it).

Three ways to invoke, over the router's three drivers: ``run`` returns the whole
answer, ``start`` tells it to a callback (the gateway's callback path), ``stream``
yields it as it arrives. They share one preparation step (``_prepare``: the variant,
TargetModel, session and shadows) and, for a whole answer, one step after it
(``_after``); they differ only in how the answer is delivered. Counting an answer
(Invocations, its 4XX/5XX errors) is the door's last step, through ``count``: only the
door knows the status its client got.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TypeVar

from shipyard.contract import BATCH, parse_batch
from shipyard.errors import EndpointNotFound, ModelError, RuntimeValidationError, UpstreamError
from shipyard.http.client import Response, StreamedResponse
from shipyard.routing import priorities
from shipyard.routing.call import ASK_CONTAINER, ASK_MODEL, Call, Exchange
from shipyard.routing.instance import Instance
from shipyard.routing.pipeline import FAILED_CONTAINER, ContainerGroupPool
from shipyard.routing.router import Router
from shipyard.routing.sessions import CLOSED_HEADER, NEW_HEADER, NEW_SESSION, Sessions, header_at
from shipyard.routing.sessions import gone as sessions_gone
from shipyard.routing.shadow import ShadowCopier
from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)

_OCTET_STREAM = b"application/octet-stream"
SESSION_TABLE_WAIT_S = 2.0
"""How long a session's request whose instance this gateway's table lacks, while the
endpoint expects instances, waits for the next table: several passes of a gateway that
follows another's fleet (control/mirror.py), which may not list an instance yet that
the gateway opening the session already routed to."""
_ERROR_BODY_BYTES = 1 << 20
"""Of a streamed error answer, at most this much is read into the ModelError."""


E = TypeVar("E", bound=BaseException | None)

Answered = Callable[[Response | None, BaseException | None], None]
"""Told the outcome of a started invocation (Invocations.start): the model's successful
answer, or the error ``run`` would raise."""


class Invocations:
    """Invokes endpoints through one router, with everything a door needs around it.

    Guarantee: every invocation that reaches ``run``, ``start`` or ``stream`` is routed,
    copied to shadows, measured and captured the same way, whichever door it came
    through.
    """

    __slots__ = ("router", "shadows", "sessions", "region", "account_id", "_tasks")

    def __init__(
        self,
        router: Router,
        *,
        shadows: ShadowCopier | None = None,
        sessions: Sessions | None = None,
        region: str = "us-east-1",
        account_id: str = "000000000000",
    ) -> None:
        self.router = router
        self.shadows = shadows
        self.sessions = sessions or Sessions()
        router.withdrawn = self.sessions.forget  # an endpoint's sessions go with its table
        self.region = region
        self.account_id = account_id
        self._tasks: set[asyncio.Task[None]] = set()
        """Invocations going on in a task (``start``'s steps that await), held until done."""

    def __repr__(self) -> str:
        return f"Invocations({self.router!r})"

    # -- before the call --------------------------------------------------------------

    def route(self, name: str) -> EndpointRoute:
        """The routing table of real-time endpoint ``name``, or the error its clients get."""
        route = self.router.routes.get(name)
        if route is None:
            raise EndpointNotFound(f"Endpoint {name} of account {self.account_id} not found.")
        if route.async_config is not None:
            raise RuntimeValidationError(
                f"Endpoint {name} is an asynchronous endpoint: invoke it with InvokeEndpointAsync."
            )
        return route

    def pick(self, route: EndpointRoute, call: Call) -> VariantRoute:
        """Choose the call's variant (``call.target``, or by weight) and, for a multi-model
        variant, read its TargetModel; both are kept on the call."""
        variant = call.variant = self._variant(route, call)
        if call.asks:
            _refuse_what_cannot_be(route, variant, call.asks)
        if variant.dispatch.names_model:
            variant.dispatch.prepare(route.name, call)
        return variant

    def _variant(self, route: EndpointRoute, call: Call) -> VariantRoute:
        if route.hosts_components or call.component is not None:
            variant = self.component(route, call.component)
        else:
            variant = self.router.variant_for(route, call.target)
        self.rank(call, variant)
        return variant

    @staticmethod
    def rank(call: Call, variant: VariantRoute) -> None:
        """The level ``call`` waits at and its deadline, under ``variant``'s rules
        (routing/priorities.py), for a door that chose the variant itself.

        Raises:
            RuntimeValidationError: it asks for a level the variant has not.
        """
        if variant.rules.configured or call.priority is not None or call.deadline_s is not None:
            call.level, call.deadline_s = priorities.resolve(
                variant.rules, call.priority, call.deadline_s
            )

    def _session(self, route: EndpointRoute, call: Call) -> bool:
        """Read the call's SessionId (routing/sessions.py): pin the call to its session's
        instance, or admit a NEW_SESSION, which goes to the model unchanged. True when
        the call opens a session.

        Raises:
            RuntimeValidationError: the session has expired or been closed.
            Throttling: a NEW_SESSION beyond the endpoint's open sessions.
        """
        if call.opening:
            return True  # read already (``start``, then ``run``)
        found = header_at(call.headers)
        if found < 0:
            return False
        asked = call.headers[found][1].decode(errors="replace")
        if asked == NEW_SESSION:
            self.sessions.admit(route.name)
            call.opening = True
            return True
        call.session = asked
        pin = self.sessions.where(route.name, asked)
        if pin is None:  # not known here: ``_placed`` asks the store
            call.pinned = None
            return False
        places = [v.instances for v in route.variants if not v.shadow]
        if call.variant is not None:
            places.insert(0, call.variant.instances)  # an inference component's copies
        # None: not in this table (``_placed`` waits for the next one, or refuses it).
        call.pinned = self.sessions.instance_for(pin, places)
        return False

    async def _placed(self, route: EndpointRoute, call: Call) -> tuple[EndpointRoute, VariantRoute]:
        """The route and variant of a session's call whose instance the table lacks.

        On a table that expects instances (a fleet followed from another gateway, or
        instances starting) the instance may be one this gateway has yet to learn of:
        wait for the next table, up to SESSION_TABLE_WAIT_S, and look again. Otherwise,
        or if it is still missing, the instance is gone.

        Raises:
            RuntimeValidationError: the session's instance is gone.
        """
        session = call.session or ""
        sessions = self.sessions
        if sessions.where(route.name, session) is None and not await sessions.fetch(
            route.name, session
        ):
            raise sessions_gone(session)  # no gateway of the store knows it
        loop = asyncio.get_running_loop()
        until = loop.time() + SESSION_TABLE_WAIT_S
        route = self.route(route.name)  # the table now: the door's may be older
        while True:
            call.variant = None
            variant = self.pick(route, call)
            self._session(route, call)
            if call.pinned is not None:
                return route, variant
            variants = [*route.variants, *route.components.values()]
            left = until - loop.time()
            if left <= 0 or not any(v.coming for v in variants):
                raise sessions_gone(session)
            await self.router.next_table(route.name, left)
            route = self.route(route.name)

    @staticmethod
    def _session_variant(route: EndpointRoute, call: Call, variant: VariantRoute) -> VariantRoute:
        """The variant holding the instance of the call's session: with several
        production variants, the one drawn by weight may not be (unless the client named
        one with TargetVariant, which the router then holds it to)."""
        pinned = call.pinned
        if pinned is None or pinned in variant.instances or call.target is not None:
            return variant
        for candidate in route.variants:
            if not candidate.shadow and pinned in candidate.instances:
                call.variant = candidate
                return candidate
        return variant  # gone: the router says so

    def _settle_session(
        self,
        route: EndpointRoute,
        call: Call,
        opening: bool,
        response: Response | StreamedResponse,
    ) -> None:
        """After a good answer: the session the call opened (the model's id, or the
        gateway's) is pinned to the instance that gave it, and named on the request for
        its shadows; one the model closed is forgotten."""
        if opening:
            answered = response.header(NEW_HEADER)
            call.session, call.opened = self.sessions.opened(route.name, call.instance, answered)
            found = header_at(call.headers)
            if found >= 0:
                call.headers[found] = (call.headers[found][0], call.session.encode())
        closed = response.header(CLOSED_HEADER)
        if closed:
            closing = closed.decode(errors="replace").strip()
            self.sessions.close(closing, route.name, call.instance)

    @staticmethod
    def _unopened(call: Call) -> None:
        """Before a NEW_SESSION's shadow copies go: a session the production call did not
        open is named by an id of no session, so no shadow is asked to open one (one it
        did open is named on the request by ``_settle_session``)."""
        found = header_at(call.headers)
        if found >= 0 and call.opened is None:
            call.headers[found] = (call.headers[found][0], Sessions.unsigned_id().encode())

    @staticmethod
    def component(route: EndpointRoute, name: str | None) -> VariantRoute:
        """The copies of inference component ``name`` on ``route``'s endpoint, or the
        error SageMaker gives for a name missing, unknown, or sent to an endpoint of
        models."""
        if not route.hosts_components:
            raise RuntimeValidationError(
                "Inference Component Name header is not allowed for endpoints to which you "
                "dont plan to deploy inference components. Please remove the Inference "
                "Component Name header and try again."
            )
        if name is None:
            raise RuntimeValidationError(
                "Inference Component Name header is required for endpoints to which you "
                "plan to deploy inference components. Please include Inference Component "
                "Name header or consider using SageMaker models."
            )
        variant = route.components.get(name)
        if variant is None:
            raise RuntimeValidationError(
                f"Inference Component {name} does not exist on endpoint {route.name}."
            )
        return variant

    # -- the call ---------------------------------------------------------------------

    async def run(self, route: EndpointRoute, call: Call) -> Response:
        """Send ``call`` and return the model's successful answer.

        Raises:
            The router's errors (routing/router.py); ModelError, or a multi-model
            instance's platform error, for an error answer.
        """
        route, variant, opening, copies = await self._prepared(route, call)
        response: Response | None = None
        model_s, error = 0.0, None
        try:
            response, model_s = await self.router.invoke(route, variant, call)
        except Exception as exc:
            error = exc
        answer = self._after(route, call, variant, opening, copies, response, model_s, error)
        if opening and call.session is not None:
            await self.sessions.share(route.name, call.session)  # before the client has it
        return answer

    def start(self, route: EndpointRoute, call: Call, done: Answered) -> bool:
        """``run`` with no task to await it: its outcome goes to ``done`` from the loop's
        callbacks, the answer ``run`` would return or the error it would raise (True:
        it is on its way). What refuses it before anything was sent (choosing the
        variant, its session, the router's admission) is raised here. A step that must
        await (finding a session's instance in the store or the next table, sharing
        a session just opened) runs in a task of its own."""
        # ``_prepare``, its first two steps written out for the common case.
        variant = call.variant or self.pick(route, call)
        opening = self._session(route, call)
        copies = None
        if call.session is not None or opening or route.copies:
            prepared = self._prepare(route, call)
            if prepared is None:  # a session's instance this gateway has yet to find
                self._in_task(self._run_then(route, call, done))
                return True
            route, variant, opening, copies = prepared

        def answered(
            response: Response | None, model_s: float, error: BaseException | None
        ) -> None:
            try:
                if response is not None and copies is None:  # ``_after``'s common case
                    answer = self._answered(route, call, variant, response, model_s, opening)
                else:
                    answer = self._after(
                        route, call, variant, opening, copies, response, model_s, error
                    )
            except Exception as exc:
                done(None, exc)
                return
            if opening and call.session is not None:
                self._in_task(self._shared_then(route.name, call.session, answer, done))
                return
            done(answer, None)

        self.router.start(route, variant, call, answered)
        return True

    async def _run_then(self, route: EndpointRoute, call: Call, done: Answered) -> None:
        try:
            answer = await self.run(route, call)
        except Exception as exc:
            done(None, exc)
            return
        done(answer, None)

    async def _shared_then(
        self, endpoint: str, session: str, answer: Response, done: Answered
    ) -> None:
        try:
            await self.sessions.share(endpoint, session)
        except Exception as exc:
            done(None, exc)
            return
        done(answer, None)

    def _in_task(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _prepare(
        self, route: EndpointRoute, call: Call, *, streamed: bool = False
    ) -> tuple[EndpointRoute, VariantRoute, bool, list[VariantRoute] | None] | None:
        """What every way to invoke does first, at once: the variant (and TargetModel),
        the session (True: the call opens one) and the shadows its copies go to. None
        when the call names a session whose instance this table lacks (``_prepared``
        awaits it)."""
        variant = call.variant
        if variant is None:
            variant = call.variant = (
                self._variant(route, call) if streamed else self.pick(route, call)
            )
        opening = self._session(route, call)
        if call.session is None and not opening and not route.copies and not streamed:
            return route, variant, False, None  # the common case: nothing more to do
        if call.session is not None and call.pinned is None and not opening:
            return None
        return self._prepared_for(route, call, variant, opening, streamed)

    async def _prepared(
        self, route: EndpointRoute, call: Call, *, streamed: bool = False
    ) -> tuple[EndpointRoute, VariantRoute, bool, list[VariantRoute] | None]:
        """``_prepare``, awaiting a session's instance where the table lacks it."""
        prepared = self._prepare(route, call, streamed=streamed)
        if prepared is not None:
            return prepared
        route, variant = await self._placed(route, call)
        return self._prepared_for(route, call, variant, False, streamed)

    def _prepared_for(
        self,
        route: EndpointRoute,
        call: Call,
        variant: VariantRoute,
        opening: bool,
        streamed: bool,
    ) -> tuple[EndpointRoute, VariantRoute, bool, list[VariantRoute] | None]:
        if call.pinned is not None:
            variant = self._session_variant(route, call, variant)
        if streamed and variant.dispatch.names_model:
            raise RuntimeValidationError(
                f"Endpoint {route.name} is a multi-model endpoint: a streamed invocation "
                "does not support multi-model endpoints; use InvokeEndpoint."
            )
        shadows = self.shadows
        copies = (
            shadows.pick(route, variant)
            if shadows is not None and route.copies and isinstance(call.body, bytes)
            else None  # a body read from its source as it is sent cannot be sent twice
        )
        return route, variant, opening, copies

    def _after(
        self,
        route: EndpointRoute,
        call: Call,
        variant: VariantRoute,
        opening: bool,
        copies: list[VariantRoute] | None,
        response: Response | None,
        model_s: float,
        error: BaseException | None,
    ) -> Response:
        """What every way to invoke does once the router has answered: the shadows'
        copies sent (they run once this callback is over: after the client's answer is
        written; no fault of theirs reaches the client), then the answer measured,
        settled and captured (``_answered``), or the error raised."""
        if copies:
            try:
                if opening:
                    self._unopened(call)
                assert self.shadows is not None
                self.shadows.send(route, copies, call)
            except Exception:
                log.exception("copying an invocation to %s's shadows failed", route.name)
        if response is None:
            raise self._logged(
                route.name, error or AssertionError("neither an answer nor an error")
            )
        return self._answered(route, call, variant, response, model_s, opening)

    def _answered(
        self,
        route: EndpointRoute,
        call: Call,
        variant: VariantRoute,
        response: Response,
        model_s: float,
        opening: bool,
    ) -> Response:
        """What follows the router's answer: the batch and latency measured, an error
        answer raised as the client's error, the session settled, the exchange captured."""
        batch = response.header(BATCH)
        if batch is not None:
            observed = parse_batch(batch)
            if observed is not None:
                variant.metrics.observe_batch(*observed)
        if response.status >= 300:
            failure = variant.dispatch.platform_error(response, call)
            if failure is not None:
                raise failure
            raise self.model_error(route.name, response)
        self.latency(call, model_s)
        if call.session is not None or opening:
            self._settle_session(route, call, opening, response)
        capture = variant.capture
        if capture is not None and isinstance(call.body, bytes):
            # One random draw; only sampled records are buffered.
            kind = response.header(b"content-type") or _OCTET_STREAM
            capture.offer(call.headers, call.body, response.body, kind)
        return response

    @contextlib.asynccontextmanager
    async def stream(
        self, route: EndpointRoute, call: Call, *, head_timeout_s: float | None = None
    ) -> AsyncIterator[Exchange]:
        """Send ``call`` and yield the model's successful answer once its head is in.

        ``head_timeout_s`` bounds the wait for the head (an instance, then its answer);
        without it the caller's own deadline covers the whole exchange. The caller reads
        ``exchange.response.chunks()`` inside the block and reports the model's time
        through ``latency``.

        Raises:
            As ``run``; RuntimeValidationError for a multi-model variant, whose answers
            are never streamed.
        """
        route, variant, opening, copies = await self._prepared(route, call, streamed=True)
        shadows = self.shadows
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(head_timeout_s):
                        exchange = await stack.enter_async_context(
                            self.router.stream(route, variant, call)
                        )
                except TimeoutError:
                    if head_timeout_s is None:
                        raise
                    # An instance chosen (and so maybe sent to it), the model's
                    # timeout; never chosen, the gateway's overload (retried by boto3).
                    reached = call.instance is not None
                    late = self.router.late(variant, reached=reached)
                    raise self._logged(route.name, late) from None
                if exchange.response.status >= 300:
                    whole = await _whole(exchange.response, self.router.timeout_s)
                    raise self.model_error(route.name, whole)
                if call.session is not None or opening:
                    self._settle_session(route, call, opening, exchange.response)
                    if opening and call.session is not None:
                        await self.sessions.share(route.name, call.session)
                yield exchange
        finally:
            if copies:
                assert shadows is not None
                if opening:
                    self._unopened(call)
                shadows.send(route, copies, call)

    @contextlib.asynccontextmanager
    async def hold(self, route: EndpointRoute, call: Call) -> AsyncIterator[Instance]:
        """Hold an instance for a bidirectional stream, which the caller carries to it
        itself: the variant as for every call (TargetVariant, else by weight), then
        Router.hold. ``call.variant`` and ``call.instance`` say where it went.

        Raises:
            RuntimeValidationError for a multi-model variant or an inference
            component, which do not stream both ways; as Router.hold otherwise.
        """
        variant = call.variant
        if variant is None:
            variant = call.variant = self._variant(route, call)
        if variant.dispatch.names_model or variant.component is not None:
            raise RuntimeValidationError(
                f"Endpoint {route.name} cannot stream both ways: its variant {variant.name} "
                "serves many models."
            )
        async with self.router.hold(route, variant, call) as (held, instance):
            call.variant = held
            yield instance

    # -- after the call ---------------------------------------------------------------

    @staticmethod
    def latency(call: Call, model_s: float) -> None:
        """Record the model's share of the call and the gateway's (the rest, from the
        moment the door took the request)."""
        variant = call.variant
        if variant is not None:
            overhead_s = max(time.perf_counter() - call.started - model_s, 0.0)
            variant.metrics.latency.add(model_s, overhead_s)

    @staticmethod
    def count(call: Call | None, status: int, error: BaseException | None = None) -> None:
        """Count one answered request, and its 4xx/5xx, on the variant it was routed to,
        when it reached the model: sent to an instance, or answered by the model. What
        the gateway refuses itself (a bad header, an unknown session, no room in the
        queue) is not the model's invocation, wherever the refusal is found. A model's
        own error (``error`` a ModelError) counts by the status the model answered, as
        CloudWatch's Invocation4XXErrors and Invocation5XXErrors do, not by ModelError's
        424."""
        if isinstance(error, ModelError):
            status = error.original_status_code
        elif call is None or call.instance is None:
            return
        if call is not None and call.variant is not None:
            m = call.variant.metrics
            m.invocations.inc()
            if status >= 500:
                m.errors_5xx.inc()
            elif status >= 400:
                m.errors_4xx.inc()

    def _log_group(self, name: str) -> str:
        group = f"/aws/sagemaker/Endpoints/{name}"
        return f"arn:aws:logs:{self.region}:{self.account_id}:log-group:{group}"

    def _logged(self, name: str, error: E) -> E:
        """``error``, a ModelError the router made (a timeout) given the endpoint's log
        group as every other ModelError has it (its ``LogStreamArn``)."""
        if isinstance(error, ModelError) and not error.log_stream_arn:
            error.log_stream_arn = self._log_group(name)
        return error

    def model_error(self, name: str, response: Response) -> ModelError:
        """The instance answered with an error status: the model's own failure. A step of
        a multi-container model is named by its ContainerHostname or position."""
        message = response.body.decode(errors="replace")
        kind = "client" if response.status < 500 else "server"
        source = (response.header(FAILED_CONTAINER) or b"primary").decode(errors="replace")
        return ModelError(
            f"Received {kind} error ({response.status}) from {source} with message "
            f'"{message}". See the instance log for more information.',
            original_status_code=response.status,
            original_message=message,
            log_stream_arn=self._log_group(name),
        )


async def _whole(response: StreamedResponse, timeout_s: float) -> Response:
    """An error answer read whole (its first MiB), to be reported as a ModelError."""
    pieces: list[bytes] = []
    size = 0
    with contextlib.suppress(TimeoutError, UpstreamError):
        async with asyncio.timeout(timeout_s):
            async for chunk in response.chunks():
                pieces.append(chunk)
                size += len(chunk)
                if size >= _ERROR_BODY_BYTES:
                    break
    return Response(response.status, response.headers, b"".join(pieces)[:_ERROR_BODY_BYTES])


def _refuse_what_cannot_be(route: EndpointRoute, variant: VariantRoute, asks: int) -> None:
    """A routing header the variant cannot honour is SageMaker's ValidationError: a
    TargetModel where the variant is not multi-model, a TargetContainerHostname where
    its model has one container. (A multi-container model judges the latter itself,
    routing/pipeline.py: a Serial pipeline refuses it, a Direct one needs it.) Only
    called for a request that sent one, so every other request pays a test of ``asks``."""
    if asks & ASK_MODEL and not variant.dispatch.names_model:
        raise RuntimeValidationError(
            f"Endpoint {route.name} is not a multi-model endpoint and does not support "
            "target model header."
        )
    pools = [instance.pool for instance in variant.instances]
    if (
        asks & ASK_CONTAINER
        and pools
        and not any(isinstance(pool, ContainerGroupPool) for pool in pools)
    ):
        raise RuntimeValidationError(
            f"Endpoint {route.name} is not configured for direct invocation: "
            "TargetContainerHostname is only valid for a model whose containers are invoked "
            "directly (InferenceExecutionConfig.Mode Direct)."
        )
