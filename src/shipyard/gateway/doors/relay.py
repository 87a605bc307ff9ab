"""Relaying a streamed answer to its client, for every door that streams one.

``StreamRelay`` takes a door's ``prepare`` (which reaches, routes and reads the request
into a Call) and does the rest: the streamed router call (routing/invocation.py), one
framed write per chunk as it arrives, the stream's failure as its last event, a
disconnect or a silent model cutting the exchange short, and the count. Each door gives
it a ``Framing`` (the response stream's event-stream events, the OpenAI door's
server-sent events) and its own error shape.

Nothing is held beyond the chunk in hand and the client reader's bounded buffer
(http/client.py): a slow client slows the instance through TCP flow control, and a
client that disconnects cancels the exchange, which gives the instance back and closes
its connection. Once events flow, a failure is the stream's last event:

- ``StreamBroken``: the model raised mid-stream (its message comes through the runtime's
  STREAM_ERROR chunk), or the instance's answer broke off;
- ``ModelInvocationTimeExceeded``: no chunk came within the invocation timeout.

The invocation timeout bounds the wait for the answer's head and every gap between two
chunks, never the whole stream, which may run as long as the model keeps producing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

from shipyard.contract import RESPONSE_STREAM_HEADER, STREAM_ERROR
from shipyard.errors import (
    AuthFailure,
    ClientGone,
    InternalFailure,
    ModelError,
    PayloadTooLarge,
    RuntimeFailure,
    ShipyardError,
    UpstreamError,
)
from shipyard.http import bodies
from shipyard.http.client import Response
from shipyard.routing.call import Call, Exchange
from shipyard.routing.invocation import Invocations
from shipyard.routing.table import EndpointRoute

log = logging.getLogger(__name__)

Receive = Any
Send = Any

ASK_STREAM = (RESPONSE_STREAM_HEADER.encode(), b"true")
"""The forwarded header that asks the instance for a streamed answer."""


class FramingError(Exception):
    """A framing cannot write what the model sent (a line past its limit, say): the
    stream ends with the model's failure."""


class Framing(Protocol):
    """How a door writes a streamed answer: its head, one model chunk, a failure once
    events flow, and the end. One per request (a framing may hold a partial line)."""

    def head(self, exchange: Exchange, call: Call) -> dict[str, Any]: ...

    def parts(self, chunk: bytes) -> Iterable[bytes]: ...

    def failure(self, code: str, message: str) -> bytes: ...

    def internal_failure(self) -> bytes: ...

    def end(self) -> bytes: ...


ErrorRenderer = Callable[[ShipyardError, Send], Awaitable[None]]
Prepare = Callable[["StreamClient"], Awaitable[tuple[EndpointRoute, Call]]]


class StreamRelay:
    """A streamed invocation from the call to the client's last byte, in a door's framing.

    ``serve`` takes the door's ``prepare`` (which reaches, routes and reads the request
    into a Call) and does the rest: the streamed router call (routing/invocation.py),
    one framed write per chunk, the stream's failure as its last event, a disconnect
    or a silent model cutting the exchange short, and the count. Errors before the
    first chunk are the door's own (``render_error``).
    """

    def __init__(self, invocations: Invocations, render_error: ErrorRenderer) -> None:
        self.invocations = invocations
        self.router = invocations.router
        self.render_error = render_error

    async def serve(
        self, receive: Receive, send: Send, prepare: Prepare, framing: Framing, label: str
    ) -> None:
        calls: list[Call] = []
        client = StreamClient(receive)
        error: BaseException | None = None
        try:
            status = await self._invoke(client, send, prepare, framing, calls)
        except (RuntimeFailure, AuthFailure) as exc:
            status, error = exc.status_code, exc
            if isinstance(exc, PayloadTooLarge) and exc.body_left:
                await bodies.drain(receive)
            await self.render_error(exc, send)
        except ClientGone:
            return
        except asyncio.CancelledError:
            if not client.gone:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            if not client.answered:
                return  # left while its request waited: nothing was answered
            status = 200
        except Exception:
            log.exception("streamed invocation of %s failed", label)
            status = 500
            if client.answered and not client.finishing:  # events are flowing: end them
                await send({"type": "http.response.body", "body": framing.internal_failure()})
            elif not client.answered:
                await self.render_error(InternalFailure("Internal failure."), send)
        finally:
            client.stop_watching()
        if calls:
            Invocations.count(calls[0], status, error)

    async def _invoke(
        self,
        client: StreamClient,
        send: Send,
        prepare: Prepare,
        framing: Framing,
        calls: list[Call],
    ) -> int:
        route, call = await prepare(client)
        calls.append(call)
        client.watch()  # from here a disconnect cancels the exchange
        async with self.invocations.stream(
            route, call, head_timeout_s=self.router.timeout_s
        ) as exchange:
            await self._relay(exchange, call, client, send, route.name, framing)
            model_s = min(exchange.head_s + client.streamed_s, time.perf_counter() - call.started)
        self.invocations.latency(call, model_s)
        return 200

    async def _relay(
        self,
        exchange: Exchange,
        call: Call,
        client: StreamClient,
        send: Send,
        name: str,
        framing: Framing,
    ) -> None:
        """One event per chunk, then the end or the failure.

        The head goes out with the first chunk, not before: a stream that fails before
        its first chunk is answered with the door's usual error (a ModelError), and
        the client's first read brings the head and the first event together.
        """
        response = exchange.response
        marker = response.header(STREAM_ERROR)
        chunks = aiter(response.chunks())
        began = time.perf_counter()
        client.time_model(self.router.timeout_s)
        while True:
            chunk = await self._next(chunks, client, marker)
            if isinstance(chunk, _Failure):
                if not client.answered:
                    raise chunk.model_error(name, self.invocations)
                break
            if not client.answered:
                await send(framing.head(exchange, call))
                client.answered = True
            if chunk is None:
                break
            try:
                parts = framing.parts(chunk)
            except FramingError as exc:  # the model's answer cannot be framed: its failure
                chunk = _Failure("StreamBroken", f"The model's stream broke off: {exc}.", 502)
                break
            for part in parts:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            client.since = client.loop.time()  # the model's clock starts again
        client.streamed_s = time.perf_counter() - began
        client.finishing = True  # the last send ends the response: no disconnect to watch
        if isinstance(chunk, _Failure):
            end = framing.failure(chunk.code, chunk.message)
        else:
            end = framing.end()
        await send({"type": "http.response.body", "body": end})

    async def _next(
        self, chunks: AsyncIterator[bytes], client: StreamClient, marker: bytes | None
    ) -> bytes | None | _Failure:
        """The next chunk of the model's answer, None at its end, or why it failed."""
        try:
            client.waiting = True
            chunk: bytes = await anext(chunks)
        except StopAsyncIteration:
            return None
        except UpstreamError as exc:
            return _Failure("StreamBroken", f"The model's stream broke off: {exc}.", 502)
        except asyncio.CancelledError:
            if client.gone or not client.idle:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            timeout_s = self.router.timeout_s
            return _Failure(
                "ModelInvocationTimeExceeded",
                f"The model sent nothing for {timeout_s:g} seconds; the stream was ended.",
                504,
            )
        finally:
            client.waiting = False
        if marker is not None and chunk.startswith(marker):
            text = chunk[len(marker) :].decode(errors="replace")
            return _Failure("StreamBroken", f"The model failed mid-stream: {text}", 500)
        return chunk


class StreamClient:
    """The client's side of one streamed invocation, and the two reasons to cut it short.

    Once watched, a disconnect cancels the task serving the request, wherever it is
    waiting (for an instance, for the head, for the next chunk, for the socket), so
    everything it holds is given back at once rather than at the next chunk. Once the
    model is timed (``time_model``), the same cancel ends a stream whose model sent
    nothing for ``idle_s`` while the door was waiting for it (``waiting``; time spent
    waiting for a slow client to take a chunk does not count). One timer per stream,
    moved on only when it fires, rather than a timeout armed and disarmed per chunk:
    that was a tenth of the door's CPU per request.
    """

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.loop = asyncio.get_running_loop()
        self.gone = False
        self.idle = False
        self.answered = False
        self.finishing = False
        self.waiting = False
        self.since = 0.0
        """Loop time the door last started waiting for the model."""
        self.streamed_s = 0.0
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle_s = 0.0

    def watch(self) -> None:
        self._task = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                break
        if not self.finishing and not self.idle:
            self.gone = True
            self._cancel()

    def time_model(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self.since = self.loop.time()
        self._timer = self.loop.call_at(self.since + idle_s, self._check_idle)

    def _check_idle(self) -> None:
        now = self.loop.time()
        due = self.since + self._idle_s
        if self.finishing or self.gone:
            return
        if not self.waiting:  # held up by the client: look again a whole period later
            self._timer = self.loop.call_at(now + self._idle_s, self._check_idle)
            return
        if now < due:
            self._timer = self.loop.call_at(due, self._check_idle)
            return
        self.idle = True
        self._cancel()

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._timer is not None:
            self._timer.cancel()


class _Failure:
    """Why a model's stream ended early: a ModelStreamError event once events have gone
    out, a ModelError before."""

    __slots__ = ("code", "message", "status")

    def __init__(self, code: str, message: str, status: int) -> None:
        self.code = code
        self.message = message
        self.status = status

    def model_error(self, name: str, invocations: Invocations) -> ModelError:
        response = Response(self.status, [], self.message.encode())
        return invocations.model_error(name, response)
