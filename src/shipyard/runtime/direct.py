"""An invocation answered from the HTTP protocol itself, without an ASGI task.

With one worker the handlers run inline on the event loop (:mod:`workers`): the loop
waits for them whatever serves the request. An ASGI cycle around that call (a task, the
app's coroutines, ``receive`` and ``send`` messages, uvicorn's checks on each) cost about
as much CPU as the handler of a cheap model, and the instance shares the machine's cores
with the gateway and its clients (bench/results/instance_direct.md). So the instance's
protocol answers ``POST /invocations`` once its body is whole, in the parser's callback:
the app's ``answer_now`` runs the handlers and returns the answer, which leaves in one
write.

What is not answered here goes through uvicorn's ASGI cycle as before, the app deciding
before any handler runs: a request asking ``Expect: 100-continue``, every request of an
app whose handlers run on threads, and what ``answer_now`` declines (a streamed answer
asked for, a batched request, an adapter's). A handler that returns an iterator is
collected by an ASGI task of its own (``answer_now`` returns the app that does it).

Written by hand because uvicorn offers no way to answer a request without its cycle; it
reuses uvicorn's protocol and cycle for everything else (parsing, keep-alive, pipelined
requests, the write side's flow control), so that a request answered here and one
answered by the app leave the connection in the same state. The body is read whole
before the answer, as the app reads it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

Headers = list[tuple[bytes, bytes]]
ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]

_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""What no header value may hold (a line break would let a value write headers)."""


class Answer(NamedTuple):
    """A whole answer: status, headers (without the server's own), body."""

    status: int
    headers: Headers
    body: bytes


class AnswersNow(Protocol):
    def answer_now(self, headers: Headers, body: bytes) -> Answer | ASGIApp | None:
        """The answer to ``POST /invocations`` with these headers and this whole body; an
        ASGI app that finishes it on a task; or None, before any handler ran, when the
        request must go through the app."""
        ...


def header_value(text: str) -> bytes:
    """``text`` as a header value; ValueError when it cannot be one."""
    value = text.encode("latin-1")
    if _CONTROL.search(value):
        raise ValueError(f"not a valid header value: {text!r}")
    return value


class DirectProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol answering ``answers``' invocations in its callbacks
    (see the module); :func:`direct_protocol` makes one for an app."""

    answers: AnswersNow

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: Any = None
        """The cycle of an invocation whose body is still arriving."""

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # app is not self.app for uvicorn's stand-in (limit_concurrency).
        if app is self.app and _invocation(cycle):
            if cycle.more_body:
                self._waiting = cycle  # answered once its body is whole
                return
            if self._answer(cycle):  # a pipelined request, its body already read
                return
        super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        waiting = self._waiting
        if waiting is None:
            super().on_body(body)
        else:
            # Read whole before the answer, as the app reads it: uvicorn's own on_body
            # would pause reading past a high-water mark until the app's receive.
            waiting.body += body

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle, self._waiting = self._waiting, None
        if cycle is not None and not self._answer(cycle):
            super()._start_asgi_task(cycle, self.app)

    def connection_lost(self, exc: Exception | None) -> None:
        self._waiting = None
        super().connection_lost(exc)

    def _answer(self, cycle: Any) -> bool:
        outcome = self.answers.answer_now(cycle.scope["headers"], bytes(cycle.body))
        if outcome is None:
            return False
        if isinstance(outcome, Answer):
            _write(self, cycle, outcome)
        else:
            super()._start_asgi_task(cycle, outcome)  # type: ignore[arg-type]
        return True


def direct_protocol(base: type[HttpToolsProtocol], app: AnswersNow) -> type[HttpToolsProtocol]:
    """``base`` (uvicorn's httptools protocol, or one derived from it) answering ``app``'s
    invocations in its callbacks (see the module)."""
    name = f"Direct{base.__name__}"
    return type(name, (DirectProtocol, base), {"answers": app, "__qualname__": name})


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
