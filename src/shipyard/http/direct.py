"""An invocation answered from the HTTP protocol itself, without an ASGI task.

With one worker the handlers run inline on the event loop (:mod:`workers`): the loop
waits for them whatever serves the request. An ASGI cycle around that call (a task, the
app's coroutines, ``receive`` and ``send`` messages, uvicorn's checks on each) cost about
as much CPU as the handler of a cheap model, and the instance shares the machine's cores
with the gateway and its clients (bench/results/instance_direct.md). So the instance's
protocol answers ``POST /invocations`` once its body is whole, in the parser's callback.

The app has one handler path, ``answer(headers, body)`` (``Answers``), and both drivers
call it: this protocol, and the app's own ASGI call, which reads the body and is then
only an adapter from ``answer``'s outcome to ASGI messages. The outcome is a whole
``Answer``, which leaves here in one write; or a ``Finish`` (a streamed answer, a batch,
handlers on threads, an iterator to collect), which the protocol runs on an ASGI task of
its own, past the body it has read.

What goes to the app's ASGI call, as before: a request asking ``Expect:
100-continue``, any other path, and every request while the client is not reading its
answers (the transport's write buffer is full), where the app's ``send`` waits for it
while the requests behind queue.

Written by hand because uvicorn offers no way to answer a request without its cycle; it
reuses uvicorn's protocol and cycle for everything else (parsing, keep-alive, pipelined
requests), so that a request answered here and one answered by the app leave the
connection in the same state. The body is read whole before the answer, as the app reads
it. A pipelined request is answered on the loop's next turn, as uvicorn starts its task;
and an exception that escapes ``answer`` is answered as uvicorn answers an app's.
"""

from __future__ import annotations

import contextvars
import io
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple, Protocol

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]

_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""What no header value may hold (a line break would let a value write headers)."""


class Answer(NamedTuple):
    """A whole answer: status, headers (without the server's own), body."""

    status: int
    headers: Headers
    body: bytes


Finish = Callable[[Any, Any], Awaitable[None]]
"""What finishes an answer on a task, given the request's ``receive`` (past its body: it
only tells of a disconnect) and ``send``."""


class Answers(Protocol):
    def answer(self, headers: Headers, body: bytes) -> Answer | Finish:
        """The one handler path of ``POST /invocations`` with these headers and this
        whole body: the whole answer, or what finishes it on a task."""
        ...


_INTERNAL_ERROR = Answer(
    500,
    [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")],
    b"Internal Server Error",
)
"""uvicorn's answer to an app that raised where the app had no answer of its own."""


def header_value(text: str, encoding: str = "latin-1") -> bytes:
    """``text`` as a header value; ValueError when it cannot be one."""
    value = text.encode(encoding)
    if _CONTROL.search(value):
        raise ValueError(f"not a valid header value: {text!r}")
    return value


class DirectProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol answering ``answers``' invocations in its callbacks
    (see the module); :func:`direct_protocol` makes one for an app."""

    answers: Answers

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: tuple[Any, io.BytesIO] | None = None
        """The cycle of an invocation whose body is still arriving, and its body so far.
        ``getvalue`` hands over the buffer itself (CPython shares it when nothing else
        holds it), where growing uvicorn's ``bytearray`` and taking ``bytes`` of it
        copied every body once more (a fresh 6 MB buffer costs 1,500 page faults); and
        small pieces cost no more than their bytes, as in the bytearray."""

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # app is not self.app for uvicorn's stand-in (limit_concurrency).
        if app is self.app and _invocation(cycle):
            if cycle.more_body:
                buffer = io.BytesIO()
                if cycle.body:
                    # A pipelined request started as the one before it completed: what
                    # of its body arrived meanwhile went to uvicorn's cycle (moved, not
                    # held twice).
                    buffer.write(cycle.body)
                    cycle.body = bytearray()
                self._waiting = (cycle, buffer)  # answered once its body is whole
            else:
                # A pipelined request, its body already read, started as the one before
                # it completed: answered on the loop's next turn, as uvicorn starts its
                # task, so that a queue of them does not nest one answer in another.
                self.loop.call_soon(self._answer_or_start, cycle)
            return
        super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        waiting = self._waiting
        if waiting is None:
            super().on_body(body)
        else:
            # Read whole before the answer, as the app reads it: uvicorn's own on_body
            # would pause reading past a high-water mark until the app's receive.
            waiting[1].write(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            cycle, buffer = waiting
            # bytes, as uvicorn's receive hands on, should the app's ASGI call serve it.
            cycle.body = buffer.getvalue()
            self._answer_or_start(cycle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._waiting = None
        super().connection_lost(exc)

    def _answer_or_start(self, cycle: Any) -> None:
        if self.transport.is_closing() or cycle.disconnected:
            return  # an earlier answer closed the connection: nobody to answer
        if self.flow.write_paused or self.transport.get_write_buffer_size() > HIGH_WATER_LIMIT:
            # The client is not reading its answers as fast as they come: the app's send
            # waits for it, and the requests behind queue meanwhile (uvicorn's
            # backpressure), where answering here would pile them up in the buffer.
            super()._start_asgi_task(cycle, self.app)
            return
        body = bytes(cycle.body)
        try:
            # In a context of its own, as the task of an ASGI request would be.
            outcome = contextvars.copy_context().run(
                self.answers.answer, cycle.scope["headers"], body
            )
        except BaseException:
            # What uvicorn's task does with an app's exception: log it, answer 500.
            log.exception("invocation failed in the protocol")
            cycle.keep_alive = False
            _write(self, cycle, _INTERNAL_ERROR)
            return
        # The body is the outcome's now: the cycle, which the connection keeps until its
        # next request, need not keep it too (uvicorn's receive lets it go once read).
        cycle.body = b""
        if isinstance(outcome, Answer):
            _write(self, cycle, outcome)
        else:
            super()._start_asgi_task(cycle, _past_body(outcome))  # type: ignore[arg-type]


def direct_protocol(base: type[HttpToolsProtocol], app: Answers) -> type[HttpToolsProtocol]:
    """``base`` (uvicorn's httptools protocol, or one derived from it) answering ``app``'s
    invocations in its callbacks (see the module)."""
    name = f"Direct{base.__name__}"
    return type(name, (DirectProtocol, base), {"answers": app, "__qualname__": name})


def _past_body(finish: Finish) -> ASGIApp:
    """The ASGI app of a request whose answer ``finish`` finishes: uvicorn's cycle still
    holds the body's message (emptied, the body read here), taken before ``finish``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await finish(receive, send)

    return app


def _invocation(cycle: Any) -> bool:
    """Whether uvicorn's ``cycle`` is an invocation that may be answered directly."""
    scope = cycle.scope
    return (
        scope["path"] == "/invocations"
        and scope["method"] == "POST"
        and not cycle.waiting_for_100_continue
    )


def _write(protocol: Any, cycle: Any, answer: Answer) -> None:
    """Send ``answer`` in one write and leave ``cycle`` and the connection as uvicorn's
    own ``send`` leaves them after a whole answer."""
    status, headers, body = answer
    head = [STATUS_LINE[status]]
    for name, value in protocol.server_state.default_headers:
        head += (name, b": ", value, b"\r\n")
    for name, value in headers:
        head += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    head += (b"\r\n", body)
    cycle.response_started = cycle.response_complete = True
    protocol.transport.write(b"".join(head))
    if not cycle.keep_alive:
        protocol.transport.close()
    cycle.on_response()
