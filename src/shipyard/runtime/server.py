"""The container contract over HTTP: ``GET /ping`` and ``POST /invocations``.

A raw ASGI callable rather than a framework app: every invocation passes through here, and
two routes need no router, no request object and no middleware. The per-request work is
one pass over the headers, the handlers (inline on the loop with one worker, on handler
threads with more; ``/ping`` answers while they run either way: :mod:`workers`), and two
``send`` calls (the floor we compare against is the peer harness's bare ASGI echo app:
bench/README.md). An invocation has one handler path, ``RuntimeApp.answer``, which both
drivers call: the instance's protocol, once the body is whole, with no ASGI task
(http/direct.py), and the app's ASGI call, an adapter that reads the body and sends
what ``answer`` gives. In multi-model mode :mod:`model_contract`'s app is served instead,
so none of its work lands on this path. With server-side batching on, a request goes to
the :mod:`batching` FIFO instead of straight to the handlers, and its answer carries
``X-Shipyard-Batch``; without it, the only cost is one attribute test.

Errors: a handler that raises is logged with its traceback and answered with 500 (or the
exception's own ``status_code`` when it is an int in 400..599) and a ``text/plain`` body
``<ExcType>: <message>``, which the gateway turns into SageMaker's ``ModelError``. A
streamed answer (:mod:`streaming`) that fails once begun ends with that text instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple
from urllib.parse import unquote

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shipyard.contract import (
    ADAPTER_IDENTIFIER,
    BATCH,
    COPIES_PATH,
    ERROR,
    RESPONSE_STREAM,
    format_batch,
    pack_outcomes,
    unpack_copies,
)
from shipyard.errors import CodecError
from shipyard.http.direct import Answer, Finish, direct_protocol, header_value
from shipyard.http.keepalive import LazyKeepAlive
from shipyard.http.writes import coalescing
from shipyard.runtime import streaming
from shipyard.runtime.adapters import NOT_FOUND, AdapterError, Adapters
from shipyard.runtime.batching import BatchConfig, Batcher
from shipyard.runtime.bidi import BidiStreams
from shipyard.runtime.handlers import Context, Handlers, Request, watch_loss
from shipyard.runtime.workers import Inline, PingStandby, Runner, batch_runner

log = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"
SESSION_ID = b"x-amzn-sagemaker-session-id"
NEW_SESSION_ID = b"x-amzn-sagemaker-new-session-id"
CLOSED_SESSION_ID = b"x-amzn-sagemaker-closed-session-id"
DEFAULT_TYPE = "application/json"

_PING_START: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-length", b"0")],
}
_EMPTY_BODY: Message = {"type": "http.response.body", "body": b""}
_COPIES = COPIES_PATH.decode()
_OUTCOMES_TYPE = (b"content-type", b"application/octet-stream")
_TURN_S = 0.05
"""How long copies run inline before the loop gets a turn (pings, other connections)."""


class RuntimeApp:
    """The ASGI app of one instance: serves ``handlers`` on the two contract routes."""

    def __init__(
        self,
        handlers: Handlers,
        *,
        threads: Runner | None = None,
        batching: BatchConfig | None = None,
        adapters: Adapters | None = None,
        bidi_max_streams: int = 100,
    ) -> None:
        self.handlers = handlers
        self.bidi = BidiStreams(
            getattr(handlers, "stream", None), handlers.model, max_streams=bidi_max_streams
        )
        """Bidirectional streams: ``stream_fn`` over a WebSocket per stream (:mod:`bidi`)."""
        self.threads = threads or Inline()
        self.adapters = adapters
        """The adapters loaded into this process (:mod:`adapters`)."""
        self.batcher = (
            None if batching is None else Batcher(handlers, batch_runner(self.threads), batching)
        )
        threads = self.threads
        self._inline = threads.call if isinstance(threads, Inline) and adapters is None else None
        """How ``answer`` calls the handlers in place (one worker, no adapters); None
        where it may not."""
        self._threaded = not isinstance(threads, Inline)
        """Whether handlers run on threads, where they can be told that their request's
        connection was lost while they run (``context.cancelled``)."""

    def __repr__(self) -> str:
        return f"RuntimeApp({self.handlers!r}, {self.threads!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # any path: the model has one stream_fn
                await self.bidi.serve(scope, receive, send)
            return  # uvicorn runs with lifespan off
        path = scope["path"]
        method = scope["method"]
        if path == "/invocations":
            if method == "POST":
                await self._invocations(scope, receive, send)
            else:
                await _plain(send, 405, "Method Not Allowed", allow=b"POST")
        elif path == "/ping":
            if method == "GET" or method == "HEAD":
                await send(_PING_START)
                await send(_EMPTY_BODY)
            else:
                await _plain(send, 405, "Method Not Allowed", allow=b"GET, HEAD")
        elif path == "/adapters" or path.startswith("/adapters/"):
            await self._adapters(scope, receive, send)
        elif path == _COPIES:
            if method == "POST":
                await self._copies(receive, send)
            else:
                await _plain(send, 405, "Method Not Allowed", allow=b"POST")
        else:
            await _plain(send, 404, "Not Found")

    async def _invocations(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /invocations`` on the ASGI path: the body read, then ``answer``'s
        outcome sent, or run."""
        message = await receive()
        body: bytes = message.get("body", b"")
        if message.get("more_body", False):
            chunks = [body]
            while message.get("more_body", False):
                message = await receive()
                chunks.append(message.get("body", b""))
            body = b"".join(chunks)
        if message["type"] == "http.disconnect":
            return
        outcome = self.answer(scope["headers"], body)
        if isinstance(outcome, Answer):
            await _send(send, outcome)
        else:
            await outcome(receive, send)

    def answer(self, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer | Finish:
        """The one handler path of ``POST /invocations``, for both drivers (the
        protocol's callback, http/direct.py, and the ASGI call): the whole answer when
        the handlers run inline here (one worker, no adapters, nothing batched or
        streamed), or a handler's failure; else what finishes it on a task, the handlers
        run as ``threads`` runs them."""
        handlers = self.handlers
        adapters = self.adapters
        context: Context | None
        if adapters is None:
            content_type, accept, attributes, streamed, _ = request_headers(headers)
        else:
            content_type, accept, attributes, streamed, raw = request_headers(
                headers, ADAPTER_IDENTIFIER
            )
            if raw is not None:
                adapter = raw.decode("latin-1")
                held = adapters.registered.get(adapter)
                if held is None:
                    text = f"{NOT_FOUND}: Adapter {adapter} is not registered."
                    return _plain_answer(404, text, code=NOT_FOUND)
                # Never batched: a batch is of the base model's requests.
                context = context_of(headers, attributes, adapter)
                return functools.partial(
                    self._run, held[1], body, content_type, accept, context, streamed
                )
        context = context_of(headers, attributes) if handlers.uses_context else None
        if self.batcher is not None and handlers.batchable(content_type):
            return functools.partial(self._batched, (body, content_type, accept, context))
        inline = self._inline
        if streamed or inline is None:
            return functools.partial(
                self._run, handlers, body, content_type, accept, context, streamed
            )
        try:
            payload, media_type = inline(handlers.answer, body, content_type, accept, context)
            if not isinstance(payload, bytes):  # an iterator, collected on a task
                return functools.partial(self._whole, payload, media_type, context)
            return Answer(200, _answer_headers(payload, media_type, context), payload)
        except Exception as exc:
            return _failure_answer(exc)

    async def _run(
        self,
        handlers: Handlers,
        body: bytes,
        content_type: str,
        accept: str,
        context: Context | None,
        streamed: bool,
        receive: Receive,
        send: Send,
    ) -> None:
        """The handlers run as ``threads`` runs them, on a task; their answer sent,
        streamed when asked for and given as an iterator. Handlers on threads that take a
        context have the connection watched meanwhile (``context.cancelled``)."""
        watch = None
        if context is not None and handlers.uses_context and self._threaded:
            watch = _watch_loss(context, receive)
        try:
            await self._run_and_send(
                handlers, body, content_type, accept, context, streamed, receive, send
            )
        finally:
            if watch is not None:
                watch.cancel()

    async def _run_and_send(
        self,
        handlers: Handlers,
        body: bytes,
        content_type: str,
        accept: str,
        context: Context | None,
        streamed: bool,
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            payload, media_type = await self.threads.run(
                handlers.answer, body, content_type, accept, context
            )
            if not isinstance(payload, bytes):  # the handlers returned an iterator
                if streamed:
                    await self._stream(payload, media_type, context, receive, send)
                else:
                    await self._whole(payload, media_type, context, receive, send)
                return
            answer = Answer(200, _answer_headers(payload, media_type, context), payload)
        except Exception as exc:
            answer = _failure_answer(exc)
        await _send(send, answer)

    async def _whole(
        self,
        chunks: streaming.Chunks,
        media_type: str,
        context: Context | None,
        receive: Receive,
        send: Send,
    ) -> None:
        """A handler's iterator nobody asked to stream, collected and sent whole."""
        try:
            payload = await streaming.collect(self.threads, chunks, receive)
            if payload is None:
                return  # the gateway left: nobody to answer
            answer = Answer(200, _answer_headers(payload, media_type, context), payload)
        except Exception as exc:
            answer = _failure_answer(exc)
        await _send(send, answer)

    async def _copies(self, receive: Receive, send: Send) -> None:
        """``POST /copies``: a shadow variant's copies, each invoked as ``POST
        /invocations`` would be, answered with each one's status and seconds
        (shipyard/contract.py). One at a time when the handlers run inline, as
        pipelined requests would be; otherwise all at once, so that the handler threads
        or a batch take them as they take concurrent requests."""
        try:
            copies = unpack_copies(await _read_body(receive))
        except ValueError as exc:
            await _plain(send, 400, f"Not a sequence of copies: {exc}")
            return
        if isinstance(self.threads, Inline) and self.adapters is None and self.batcher is None:
            outcomes = []
            turn = time.perf_counter()
            for headers, body in copies:
                outcomes.append(await self._copy(headers, body))
                if time.perf_counter() - turn > _TURN_S:  # a ping waits for one copy more
                    await asyncio.sleep(0)
                    turn = time.perf_counter()
        else:
            outcomes = await asyncio.gather(*(self._copy(h, b) for h, b in copies))
        payload = pack_outcomes(outcomes)
        headers = [_OUTCOMES_TYPE, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _copy(self, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, float]:
        """One copy's status and seconds, by the handler path of an invocation
        (``answer``), with its answer dropped but its status; each in a context of its
        own, as a request's task is."""
        started = time.perf_counter()
        try:
            outcome = contextvars.copy_context().run(self.answer, headers, body)
            if isinstance(outcome, Answer):
                return outcome.status, time.perf_counter() - started
            status = await asyncio.ensure_future(_status_of(outcome))
        except Exception:
            log.exception("a shadow copy failed")
            status = 500
        return status, time.perf_counter() - started

    async def _adapters(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /adapters`` and ``DELETE /adapters/<name>`` (:mod:`adapters`)."""
        method, path = scope["method"], scope["path"]
        try:
            if self.adapters is None:
                raise AdapterError(404, "NotFound", "This server takes no adapters.")
            self.adapters.check(scope["headers"])
            if path == "/adapters" and method == "POST":
                name, src = Adapters.request(await _read_body(receive))
                await asyncio.to_thread(self.adapters.register, name, src)
                text = f"Adapter {name} registered"
            elif path != "/adapters" and method == "DELETE":
                name = unquote(path.removeprefix("/adapters/"))
                await asyncio.to_thread(self.adapters.unregister, name)
                text = f"Adapter {name} unregistered"
            else:
                await _plain(send, 405, "Method Not Allowed", allow=b"POST, DELETE")
                return
        except AdapterError as exc:
            log.warning("adapter request refused (%s): %s", exc.status, exc)
            await _plain(send, exc.status, f"{exc.code}: {exc}", code=exc.code)
            return
        except Exception as exc:
            await _send(send, _failure_answer(exc))
            return
        await _plain(send, 200, text)

    async def _batched(self, request: Request, receive: Receive, send: Send) -> None:
        assert self.batcher is not None
        try:
            batched = await self.batcher.submit(request)
            headers = _answer_headers(batched.payload, batched.media_type, request[3])
        except Exception as exc:
            await _send(send, _failure_answer(exc))
            return
        headers.append((BATCH, format_batch(batched.size, batched.wait_s)))
        await _send(send, Answer(200, headers, batched.payload))

    async def _stream(
        self,
        chunks: streaming.Chunks,
        media_type: str,
        context: Context | None,
        receive: Receive,
        send: Send,
    ) -> None:
        first = await streaming.first_chunk(self.threads, chunks)  # raises: an error status
        headers = with_context([(b"content-type", header_value(media_type))], context)
        await streaming.send_stream(send, receive, self.threads, chunks, first, headers, _described)


class RequestHeaders(NamedTuple):
    content_type: str
    accept: str
    attributes: str | None
    """Custom attributes, when sent."""
    streamed: bool
    """Whether a streamed answer is asked for (RESPONSE_STREAM)."""
    target: bytes | None
    """The header named ``target`` (a multi-model server's TargetModel), when sent."""


def request_headers(
    headers: list[tuple[bytes, bytes]], target: bytes | None = None
) -> RequestHeaders:
    """What the runtime reads of an invocation's headers; defaults where one is missing."""
    content_type = accept = DEFAULT_TYPE
    attributes: str | None = None
    streamed = False
    found: bytes | None = None
    for name, value in headers:
        if name == b"content-type":
            content_type = value.decode("latin-1") or DEFAULT_TYPE
        elif name == b"accept":
            accept = value.decode("latin-1")
            if accept == "*/*" or not accept:
                accept = DEFAULT_TYPE
        elif name == CUSTOM_ATTRIBUTES:
            attributes = value.decode("latin-1")
        elif name == RESPONSE_STREAM:
            streamed = True
        elif name == target:
            found = value
    return RequestHeaders(content_type, accept, attributes, streamed, found)


def _answer_headers(
    payload: bytes, media_type: str, context: Context | None
) -> list[tuple[bytes, bytes]]:
    """The headers of a handler's whole answer; ValueError for a media type or custom
    attributes that cannot be a header's value."""
    headers = [
        (b"content-type", header_value(media_type)),
        (b"content-length", str(len(payload)).encode()),
    ]
    return with_context(headers, context)


def with_context(
    headers: list[tuple[bytes, bytes]], context: Context | None
) -> list[tuple[bytes, bytes]]:
    """``headers`` and the custom attributes and session headers the handlers set, if any
    (UTF-8, as ever)."""
    if context is not None:
        if context.response_custom_attributes is not None:
            value = header_value(context.response_custom_attributes, "utf-8")
            headers.append((CUSTOM_ATTRIBUTES, value))
        if context.new_session is not None:
            headers.append((NEW_SESSION_ID, context.new_session.encode()))
        if context.closed_session is not None:
            headers.append((CLOSED_SESSION_ID, context.closed_session.encode()))
    return headers


def context_of(
    headers: list[tuple[bytes, bytes]], attributes: str | None, adapter: str | None = None
) -> Context:
    """The handlers' Context of a request: its custom attributes, the adapter it names,
    and its session (read only for handlers that take a context)."""
    session = None
    for name, value in headers:
        if name == SESSION_ID:
            session = value.decode("latin-1")
            break
    return Context(attributes, adapter, session)


def _watch_loss(context: Context, receive: Receive) -> asyncio.Future[Message]:
    """Set ``context.cancelled`` once the request's connection is lost: ``receive``, past
    the body, answers only then (or once the answer is complete, by when the watch is
    cancelled). Cancelling what it returns ends the watch."""
    lost = watch_loss(context)
    watch = asyncio.ensure_future(receive())

    def seen(watch: asyncio.Future[Message]) -> None:
        if not watch.cancelled() and watch.exception() is None:
            lost.set()

    watch.add_done_callback(seen)
    return watch


async def _status_of(finish: Finish) -> int:
    """The status of the answer ``finish`` sends; the rest of it is dropped. The gateway
    never leaves a copy: a watch for that waits for ever (and is cancelled with the
    answer)."""
    status = 500

    async def receive() -> Message:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("never reached")

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await finish(receive, send)
    return status


def _plain_headers(length: int) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(length).encode()),
    ]


def _described(exc: Exception) -> str:
    return describe_failure(exc)[1]


def _failure_answer(exc: Exception) -> Answer:
    """The answer to a handler's ``exc`` (describe_failure), logged."""
    status, text = describe_failure(exc)
    return _plain_answer(status, text)


async def _send(send: Send, answer: Answer) -> None:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})


def describe_failure(exc: Exception) -> tuple[int, str]:
    """The status and ``<ExcType>: <message>`` answering a handler's ``exc``, logged.

    Call it inside the ``except`` block, so the log carries the traceback.
    """
    status = getattr(exc, "status_code", None)
    if type(status) is not int or not 400 <= status <= 599:
        status = 500
    if isinstance(exc, CodecError):
        # The client's mistake, answered by our own defaults: a traceback would be noise.
        log.warning("invocation refused (%s): %s", status, exc)
    else:
        log.exception("invocation failed (%s)", status)
    text = str(exc)
    name = type(exc).__name__
    return status, f"{name}: {text}" if text else name


def _plain_answer(
    status: int, text: str, *, allow: bytes | None = None, code: str | None = None
) -> Answer:
    body = text.encode()
    headers = _plain_headers(len(body))
    if allow is not None:
        headers.append((b"allow", allow))
    if code is not None:
        headers.append((ERROR, code.encode()))
    return Answer(status, headers, body)


async def _plain(
    send: Send, status: int, text: str, *, allow: bytes | None = None, code: str | None = None
) -> None:
    await _send(send, _plain_answer(status, text, allow=allow, code=code))


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` but not yet listening.

    Bound here rather than by uvicorn so that a taken port is an ordinary ``OSError`` the
    caller can report (uvicorn would log and ``sys.exit``); uvicorn starts listening on it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def unix_listener(fd: int) -> socket.socket:
    """The bound Unix socket inherited as ``fd``: the gateway that started the instance
    bound it in a folder of its own and sends invocations there (backends/instance_sockets.py)."""
    sock = socket.socket(fileno=fd)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()  # not ours to close
        raise ValueError(f"--unix-socket-fd {fd} is not a Unix stream socket.")
    sock.set_inheritable(False)  # the model's own child processes do not get it
    return sock


def serve(app: App, sock: socket.socket, unix_sock: socket.socket | None = None) -> None:
    """Serve ``app`` (a RuntimeApp, or a MultiModelApp) on ``sock``, and on ``unix_sock``
    when given, until SIGINT or SIGTERM.

    When the app runs its handlers inline, a PingStandby answers ``/ping`` on ``sock``
    while one of them holds the loop; requests on ``unix_sock`` wait for the loop.
    """
    protocol: type[HttpToolsProtocol] = coalescing(LazyKeepAlive)
    if isinstance(app, RuntimeApp):
        protocol = direct_protocol(protocol, app)
    config = uvicorn.Config(
        app,
        loop="uvloop",
        # uvicorn's httptools protocol, a response's head and body in one system call, one
        # keep-alive timer per connection (shipyard/http/keepalive.py), and a RuntimeApp's
        # invocations answered without an ASGI task (http/direct.py).
        http=protocol,
        # Bidirectional streams (runtime/bidi.py): the gateway pings, and answers within
        # the part limit plus the PARTIAL parts joined to it.
        ws="websockets-sansio" if isinstance(app, RuntimeApp) else "none",
        ws_max_size=32 * 1024 * 1024,
        ws_ping_interval=None,
        ws_per_message_deflate=False,
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=120,
    )
    runner = getattr(app, "threads", None)
    standby = PingStandby(sock, runner) if isinstance(runner, Inline) else None
    # The Unix socket listens first: the gateway sends requests there only once ``sock``
    # has answered a ping.
    sockets = [sock] if unix_sock is None else [unix_sock, sock]
    _Server(config, standby).run(sockets=sockets)


class _Server(uvicorn.Server):
    """uvicorn's server, starting the standby once it listens."""

    def __init__(self, config: uvicorn.Config, standby: PingStandby | None) -> None:
        super().__init__(config)
        self.standby = standby

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.standby is None:
            return
        config = self.config
        # The protocol uvicorn's own startup builds for each accepted connection (its
        # create_protocol), so a connection the standby hands over is served the same way.
        protocol = functools.partial(
            config.http_protocol_class,
            config=config,  # type: ignore[call-arg]  # typed as asyncio.Protocol's class
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        self.standby.start(asyncio.get_running_loop(), protocol)
