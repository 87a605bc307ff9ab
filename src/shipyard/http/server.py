"""Limits on connections and request heads, enforced while they arrive (uvicorn's
httptools protocol).

uvicorn takes any number of headers of any size, and waits forever for a head that
never ends; by the time the app sees ``scope["headers"]`` a 32 MB header has been
buffered whole. So the protocol itself counts: a head with more than ``max_headers``
headers or more than ``max_head_bytes`` bytes is answered ``431`` and the connection
closed, and a head not complete ``head_timeout_s`` after its first byte is answered
``408``.

Time is bounded around requests too. A connection that sends nothing is closed
``timeout_keep_alive`` (the gateway's ``idle_timeout_s``) after it opens, as uvicorn
already closes one idle between requests; uvicorn alone arms that timer only after a
first response, so a connection that never spoke was kept for ever. And a request
answered before its body was read (a refusal at the edge, a body over the limit) has
``drain_timeout_s`` for the rest of its body to arrive, dropped unread as it comes,
so the client reads the answer rather than a reset; then the connection is closed.
What the protocol writes in one turn of the loop leaves in one system call
(shipyard/writes.py). Everything else (bodies, the app) is uvicorn's, unchanged.

The edge also tells the app whether a request's body has arrived whole (``body_arrived``):
a body parsed in the same read as its head, the common case, is read with no deadline;
and calls it back when a client's connection is lost (``on_disconnect``), so a request
waiting for an instance leaves the queue without a task of its own watching ``receive``.

**The callback path.** The app may also serve a request with no ASGI cycle or task: its
``serve_whole`` (``ServeWhole``), given the scope, the whole body and a ``respond`` that
writes the answer. The protocol *holds* a POST at the end of its head (``_hold``: nothing
before it still to answer, a plain path, room under the limits, a client reading its
answers) and, once its body is whole in that read or the next, *offers* it
(``_offer``): one seam, the only place the protocol calls the app's callback path. A
request the app declines, or one whose body does not come in time, is *released*
(``_release``) to uvicorn's cycle as if never held. An ``_Answering`` stands in for
uvicorn's cycle while the app answers. (On the data path, *take* means one thing only:
the router taking an instance for a call.)
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE

from shipyard.http.keepalive import LazyKeepAlive
from shipyard.http.writes import CoalescingTransport

Respond = Callable[[int, list[tuple[bytes, bytes]], bytes], None]
"""Writes the answer to a request served on the callback path: status, headers, body."""
ServeWhole = Callable[[Any, bytes, Respond], bool]
"""The app's driver of the callback path (the edge's ``serve_whole``,
gateway/edge/signatures.py): serve a request whose body is whole, with no ASGI cycle or
task. True once it has it, and then it calls ``respond`` once; False when it leaves the
request to the ASGI app, having done nothing."""

logger = logging.getLogger(__name__)

_PLAIN_PATH = re.compile(rb"/[A-Za-z0-9._~!$&'()*+,;=:@/-]*")
"""A request target that is its own path as uvicorn decodes it: absolute, nothing
escaped, no query or fragment."""

_EDGE = "shipyard.edge"
"""The scope key for (the connection's protocol, the request's number on it)."""


def _fields_size(headers: list[tuple[bytes, bytes]]) -> int:
    """The bytes of a head's header lines, each ``name: value`` and its line's end."""
    size = 4 * len(headers)
    for name, value in headers:
        size += len(name) + len(value)
    return size


def body_arrived(scope: Mapping[str, Any]) -> bool:
    """Whether the request's whole body has been parsed already, so that reading it
    cannot wait on the client; False when the edge did not see the request."""
    edge = scope.get(_EDGE)
    return edge is not None and edge[0].completed_messages >= edge[1]


def on_disconnect(scope: dict[str, Any]) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """What arranges for a callback once the request's client has disconnected (soon, if
    it has already); it returns what cancels the arrangement. One that never calls back
    when the edge did not see the request."""
    edge = scope.get(_EDGE)
    return _never if edge is None else edge[0].watch_lost


def _never(callback: Callable[[], None]) -> Callable[[], None]:
    return _nothing


def _nothing() -> None:
    pass


_FIELDS_TOO_LARGE = "Request header fields too large."
"""The 431 refusal of a head, or of trailer fields, past max_headers or max_head_bytes."""

_UNKNOWN_CODING = "Transfer codings other than chunked are not implemented."
"""The 501 refusal of a request whose Transfer-Encoding names another coding."""
_NO_CODING = (b"chunked", b"")


async def _fields_too_large(scope: Any, receive: Any, send: Any) -> None:
    """The app of a request refused for its trailer fields while queued behind others
    (_drop_request): in its turn, after their answers, it answers the refusal, and the
    connection ends."""
    body = _FIELDS_TOO_LARGE.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 431, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class LimitedHttpToolsProtocol(LazyKeepAlive):
    """uvicorn's httptools protocol with the limits of the module (and the keep-alive
    timer of shipyard/keepalive.py); see there."""

    max_headers = 100
    max_head_bytes = 64 * 1024
    head_timeout_s = 10.0
    drain_timeout_s = 3.0
    hold_body_s = 0.05
    """How long a held request whose head came alone waits for its body (the next read)
    before it goes to uvicorn."""
    serve_whole: ServeWhole | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_head = True
        self._in_head = False
        """A head began (on_message_begin) and is not complete."""
        self._completed_here = False
        """A message was completed by the data being parsed."""
        self._head_started_here = False
        self._head_bytes = 0
        self._reads = 0
        """The reads so far (data_received)."""
        self._read_bytes = 0
        """The bytes of the read being parsed."""
        self._head_read = 0
        """The read a head began in (on_message_begin): see on_headers_complete."""
        self._trailers: tuple[int, int] | None = None
        """The fields and bytes of a request's head and of its chunked body's trailer
        fields so far, once a trailer field came."""
        self._refused: tuple[int, str] | None = None
        self._refusal: Callable[[], None] | None = None
        """A refusal of a request that came while one before it was still to be answered:
        written once that one is (see _defer)."""
        self._held: list[bytes] | None = None
        """The body so far of a request held to be offered once whole (``_offer``)."""
        self._hold_timer: Any = None
        """Armed while a held request whose head came alone waits for its body."""
        self._head_timer: Any = None
        self._drain_timer: Any = None
        self._begun_messages = 0
        self._upgrading = False
        """The head just parsed asked to switch protocols: see _without_upgrade."""
        self._asked: tuple[int, int, int] | None = None
        """The last request parsed again without its upgrade: its number, and the count
        and bytes of its head's fields as they came."""
        self._lost = False
        self._lost_watchers: set[Callable[[], None]] = set()
        self.completed_messages = 0
        """Requests on the connection whose body has been parsed whole."""
        # Fixed for the connection: whether a request may be held at all (uvicorn's
        # cycle logs what it answers; a root path changes the scope's path).
        self._may_hold = self.serve_whole is not None and not self.access_log and not self.root_path
        self._one_read_within = self.max_head_bytes - self.max_headers

    def connection_made(self, transport: Any) -> None:
        # A response's head and body in one system call (shipyard/writes.py).
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        # The keep-alive timeout, from before the first request as after each: data
        # stops it (and a begun head has the head timer).
        self.idle_from_now()

    def data_received(self, data: bytes) -> None:
        self._completed_here = False
        self._reads += 1
        self._read_bytes = len(data)
        # uvicorn's data_received, repeated rather than called (a frame less per read),
        # with requests asking to switch protocols served as HTTP/1.1 (_without_upgrade).
        self._idle_since = None  # LazyKeepAlive's _unset_keepalive_if_required
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._invalid()
        except httptools.HttpParserUpgrade as upgrade:
            self._without_upgrade(data[upgrade.args[0] :])
        if self._held is not None:
            self._held_after_read()
        if self._refused is not None:
            self._refuse(*self._refused)
            return
        if self._awaiting_head:
            # A message that ended inside this data may have begun the next head in it:
            # only data wholly inside a head counts (at most one chunk is not counted).
            if self._head_started_here:
                self._head_started_here = False
            else:
                self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, _FIELDS_TOO_LARGE)
                return
            # Armed once this data is parsed, and only for a head left incomplete (or
            # bytes that began none): a whole request in one read, the common case,
            # costs no timer.
            if self._head_timer is None and (self._in_head or not self._completed_here):
                self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def on_message_begin(self) -> None:
        # uvicorn's on_message_begin and LazyKeepAlive's, repeated rather than called:
        # two frames less per request.
        self._idle_since = None
        self._in_head = True
        self._head_read = self._reads
        self._trailers = None
        self.url = b""
        self.expect_100_continue = False
        headers: list[tuple[bytes, bytes]] = []
        self.headers = headers
        self._begun_messages += 1
        scope: Any = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": headers,
            "state": self.app_state.copy(),
            _EDGE: (self, self._begun_messages),
        }
        self.scope = scope

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            headers = self.headers
            if len(headers) >= self.max_headers:
                # One more than the limit: refused, and no more of the head is kept.
                self._refused = (431, _FIELDS_TOO_LARGE)
                return
            # uvicorn's on_header, repeated rather than called: a frame less per header.
            # The head's bytes are held to their limit once it is complete.
            name = name.lower()
            if name == b"expect":
                if value.lower() == b"100-continue":
                    self.expect_100_continue = True
            elif name == b"transfer-encoding" and self._refused is None:
                # llhttp frames a body by its last coding, which must be chunked, and
                # leaves the codings before it applied: a body it de-chunks would reach
                # the model still compressed (gzip, chunked). None is decoded here
                # (RFC 9112 6.1: 501 for a transfer coding the server does not know; an
                # empty list element is no coding, RFC 9110 5.6.1).
                if any(c.strip().lower() not in _NO_CODING for c in value.split(b",")):
                    self._refused = (501, _UNKNOWN_CODING)
            headers.append((name, value))
            return
        # A chunked body's trailer field: httptools reports it as a header, after the
        # head was read (a signature checked, a door's headers read). Appended to the
        # scope it would reach the door on one path and not the other: dropped, and
        # counted with the head's fields against the head's limits.
        trailers = self._trailers
        if trailers is None:
            asked = self._asked
            if asked is not None and asked[0] == self._begun_messages:
                trailers = asked[1:]  # the head as it came, upgrade and all
            else:
                trailers = len(self.headers), _fields_size(self.headers)
        count, size = trailers
        self._trailers = count, size = count + 1, size + len(name) + len(value) + 4
        if (count > self.max_headers or size > self.max_head_bytes) and self._refused is None:
            self._refused = (431, _FIELDS_TOO_LARGE)
            self._drop_request()

    def _drop_request(self) -> None:
        """The request being read, refused at its trailer fields after its head began it,
        so that the refusal is its only answer:

        - held (no cycle yet): dropped, and the refusal written at once;
        - queued behind requests still to be answered: its cycle keeps its place, with an
          app that answers the refusal in its turn (marked answered early, it would tell
          uvicorn's shutdown and the drain timer that nothing is left to answer);
        - its app running: the app reads a disconnect and what it sends is dropped;
          marked answered, it lets the refusal out at once;
        - its answer begun (a door that answers before reading the body): the
          connection ends, with no second answer after it.
        """
        if self._held is not None:
            self._held = None
            self._cancel_hold_timer()
            return
        cycle = self.cycle
        if cycle is None or getattr(cycle, "scope", None) is not self.scope:
            return  # not this request's cycle: the refusal waits for its answer
        if cycle.response_started:
            self.transport.close()
            return
        for i, (queued, _) in enumerate(self.pipeline):
            if queued is cycle:
                self.pipeline[i] = (cycle, _fields_too_large)
                return
        cycle.disconnected = True
        cycle.response_complete = True
        cycle.message_event.set()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._awaiting_head = False
        self._head_bytes = 0
        if self._head_timer is not None:
            self._cancel_head_timer()
        if self._refused is None and (
            # A head that began and ended in one read of at most ``max_head_bytes`` less
            # one byte for each of its fields is within the limit as counted below (the
            # count gives each field's line four bytes beside its name and value; it
            # takes three or more on the wire): only a longer head is counted.
            (self._head_read != self._reads or self._read_bytes > self._one_read_within)
            and len(self.url) + _fields_size(self.headers) > self.max_head_bytes
        ):
            self._refused = (431, _FIELDS_TOO_LARGE)
        if self._refused is not None:
            return  # the request is refused: no app task for it
        upgrade = self.parser.should_upgrade()
        if upgrade and self.parser.get_method() != b"CONNECT":
            # The parser takes what follows this head for the other protocol's: the
            # request is parsed again without its upgrade (_without_upgrade).
            self._upgrading = True
            return
        if self._may_hold and self._hold():
            return
        super().on_headers_complete()
        if upgrade:
            # A CONNECT, answered by the app (no tunnel here), and the connection closed.
            self.cycle.keep_alive = False

    def _hold(self) -> bool:
        """Hold the request, with no ASGI cycle or task, to offer it once whole:
        a POST with nothing before it still to answer (no pipelining), no upgrade asked
        (on_headers_complete), no 100-continue to send, a plain path, and room under
        uvicorn's concurrency limit. The scope gets what uvicorn's on_headers_complete
        gives it."""
        cycle = self.cycle
        url = self.url
        limit = self.limit_concurrency
        if (
            (cycle is not None and not cycle.response_complete)
            or self.pipeline
            or self.expect_100_continue
            or _PLAIN_PATH.fullmatch(url) is None
            or self.parser.get_method() != b"POST"
            or (limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit))
            # A client not reading its answers: uvicorn's send waits for it, and what it
            # sends meanwhile queues behind, where answers served here would pile up.
            or self.flow.write_paused
            or self.transport.get_write_buffer_size() > HIGH_WATER_LIMIT
        ):
            return False
        scope = self.scope
        scope["method"] = "POST"
        http_version = self.parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = url.decode("ascii")
        scope["raw_path"] = url
        scope["query_string"] = b""
        self._held = []
        return True

    def _held_after_read(self) -> None:
        """A read is parsed and the held request's body is not whole yet."""
        if self._held or self._hold_timer is not None or self.transport.is_closing():
            # Its body is not whole in the read that brought its head, or in the one
            # after: uvicorn's, as any request (its body read, under the door's
            # deadline, by the ASGI app). On a connection ending, nothing.
            self._release()
        else:
            # The head came alone: http.client, urllib3, requests and httpx write a
            # request's head and its body apart. Its body is offered if it is whole in
            # the next read, and the request is released to uvicorn otherwise.
            self._hold_timer = self.loop.call_later(self.hold_body_s, self._hold_timed_out)

    def _offer(self, body: bytes) -> bool:
        """The seam: the held request offered to the app's ``serve_whole``, an
        _Answering standing in for uvicorn's cycle (what uvicorn's keep-alive,
        pipelining and shutdown read) until it is answered. False: declined, nothing
        done."""
        assert self.serve_whole is not None
        keep_alive = self.scope["http_version"] != "1.0" and self.parser.should_keep_alive()
        answering = _Answering(self, keep_alive)
        previous, self.cycle = self.cycle, answering  # type: ignore[assignment]
        try:
            served = self.serve_whole(self.scope, body, answering.respond)
        except Exception:
            # Left to the app, unless it was answered before the failure (answering it
            # again would write a second answer for one request).
            logger.exception("serving a whole request failed")
            served = answering.response_complete
        if not served:
            answering.response_complete = True  # whatever it began answers nothing
            self.cycle = previous
        return served

    def _release(self, body: bytes | None = None) -> None:
        """Give the held request to uvicorn, as if never held: its cycle and ASGI task
        start, with the body so far."""
        held, self._held = self._held, None
        self._cancel_hold_timer()
        if self.transport.is_closing():
            return
        if body is None:
            assert held is not None
            body = b"".join(held)
        super().on_headers_complete()
        if body:
            super().on_body(body)

    def on_body(self, body: bytes) -> None:
        # A refused request has no cycle of its own (the connection's first may have
        # none at all): its body is dropped, and the refusal answered once the data
        # is parsed.
        if self._refused is None:
            if self._held is not None:
                self._held.append(body)
                return
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused is not None or self._upgrading:
            return
        held = self._held
        if held is None:
            super().on_message_complete()
        else:
            # The held request's body is whole: offered, and released to uvicorn (its
            # message complete) if the app declines it.
            self._held = None
            if self._hold_timer is not None:  # the head came alone: its body is here
                self._cancel_hold_timer()
            body = held[0] if len(held) == 1 else b"".join(held)
            if not self._offer(body):
                self._release(body)
                super().on_message_complete()
        self.completed_messages += 1
        self._completed_here = True
        self._awaiting_head = True
        self._head_started_here = True
        if self._drain_timer is not None:
            self._cancel_drain_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        refusal = self._refusal
        if refusal is not None and not self._owes_an_answer():
            self._refusal = None
            refusal()
            return
        if self.cycle.response_complete and not self._awaiting_head and self._drain_timer is None:
            # Answered while its body is still coming: drop the rest (uvicorn does once
            # the response is complete) for a while, then give up on the connection.
            self._drain_timer = self.loop.call_later(self.drain_timeout_s, self._drain_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._held = None
        self._cancel_hold_timer()
        self._cancel_head_timer()
        self._cancel_drain_timer()
        super().connection_lost(exc)
        self._lost = True
        watchers, self._lost_watchers = self._lost_watchers, set()
        for callback in watchers:
            callback()

    def watch_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once the connection is lost; see on_disconnect."""
        if self._lost:
            self.loop.call_soon(callback)
            return _nothing
        self._lost_watchers.add(callback)
        return functools.partial(self._lost_watchers.discard, callback)

    def shutdown(self) -> None:
        # A request held for its body is in flight: uvicorn's, to be drained as its own.
        if self._held is not None:
            self._release()
        super().shutdown()
        transport = self.transport
        if (
            transport.is_closing()
            and not self._lost
            and transport.get_extra_info("ssl_object") is not None
            and not transport.get_write_buffer_size()
        ):
            # uvicorn closed it, nothing owed on it. Over TLS the close sends
            # close_notify and then waits for the client's own, which a pooled client
            # that is not reading (botocore's) never sends: uvicorn's graceful shutdown
            # would wait the whole drain for a connection with nothing on it. Our
            # close_notify has gone to the socket (nothing left at the TLS layer); the
            # client's is not needed (RFC 8446 6.1), so the connection ends now.
            transport.abort()

    def _hold_timed_out(self) -> None:
        self._hold_timer = None
        if self._held is not None:
            self._release()

    def _cancel_hold_timer(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None

    def _drain_timed_out(self) -> None:
        self._drain_timer = None
        if not self._awaiting_head and not self.transport.is_closing():
            self.transport.close()

    def _cancel_drain_timer(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None

    def _head_timed_out(self) -> None:
        # Armed when the first byte of a head arrives and cancelled when the head is
        # complete; an idle keep-alive connection is uvicorn's keep-alive timeout's.
        self._head_timer = None
        if self._awaiting_head:
            self._refuse(408, "The request head did not arrive in time.")

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _owes_an_answer(self) -> bool:
        """A request before the one being read is still to be answered (in flight, or
        pipelined behind one that is): an answer now would be read as its."""
        cycle = self.cycle
        return (cycle is not None and not cycle.response_complete) or bool(self.pipeline)

    def _defer(self, refusal: Callable[[], None]) -> None:
        """Answer ``refusal`` once every request before it is answered, in order (RFC 9112
        9.3.2), reading nothing more meanwhile."""
        if self._refusal is None:
            self._refusal = refusal
        self.flow.pause_reading()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a request that does not parse, in its turn.
        if self._owes_an_answer():
            self._defer(functools.partial(super().send_400_response, msg))
            return
        super().send_400_response(msg)

    def _should_upgrade(self) -> bool:
        # uvicorn's switch to its WebSocket protocol: the gateway has none to switch to,
        # whatever the server's ``ws`` setting (see _without_upgrade).
        return False

    def _invalid(self) -> None:
        # uvicorn's answer to bytes its parser refuses.
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    def _without_upgrade(self, rest: bytes) -> None:
        """Serve a request that asked to switch protocols (``Connection: upgrade`` with
        ``Upgrade``: h2c, websocket or any other) as plain HTTP/1.1, as RFC 9110 7.8 lets
        a server: the gateway switches to none. httptools' parser ends such a request at
        its head and hands back the bytes after it (its body, any request after it) as
        the other protocol's, so the head is given to a fresh parser again, without the
        upgrade, and those bytes after it; the request, body and all, then goes the way
        of any other. A CONNECT is not parsed again (see on_headers_complete); bytes after
        its head in the same read are dropped."""
        view = memoryview(rest)
        while self._upgrading:  # set only for a head not refused (on_headers_complete)
            self._upgrading = False
            headers = self.headers
            head = [
                self.parser.get_method(),
                b" ",
                self.url,
                b" HTTP/",
                self.parser.get_http_version().encode(),
                b"\r\n",
            ]
            for name, value in headers:
                if name == b"upgrade":
                    continue
                if name == b"connection":
                    tokens = (t.strip() for t in value.split(b","))
                    value = b", ".join(t for t in tokens if t and t.lower() != b"upgrade")
                    if not value:
                        continue
                head += (name, b": ", value, b"\r\n")
            head.append(b"\r\n")
            # The same request once more: its number, and its fields as they came (a
            # chunked body's trailer fields count with them, see on_header).
            self._begun_messages -= 1
            self._asked = (self._begun_messages + 1, len(headers), _fields_size(headers))
            parser = self.parser = httptools.HttpRequestParser(self)
            parser.set_dangerous_leniencies(lenient_data_after_close=True)  # uvicorn's
            try:
                parser.feed_data(b"".join(head))
                parser.feed_data(view)
            except httptools.HttpParserError:
                self._invalid()
            except httptools.HttpParserUpgrade as upgrade:
                view = view[upgrade.args[0] :]  # after the next request's head

    def _refuse(self, status: int, message: str) -> None:
        if self.transport.is_closing():
            return
        if self._owes_an_answer():
            self._defer(functools.partial(self._refuse, status, message))
            return
        body = message.encode()
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: " + str(len(body)).encode() + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


class _Answering:
    """Stands in for uvicorn's request cycle while a request served on the callback path
    (LimitedHttpToolsProtocol._offer) is answered: it carries what uvicorn's protocol reads
    of a cycle (an answer under way holds pipelined requests back; a shutdown or a lost
    connection marks it), and writes the answer as uvicorn's cycle would."""

    __slots__ = ("protocol", "keep_alive", "response_complete", "disconnected")

    def __init__(self, protocol: LimitedHttpToolsProtocol, keep_alive: bool) -> None:
        self.protocol = protocol
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False

    @property
    def message_event(self) -> _NoEvent:
        return _NO_EVENT  # uvicorn sets it when the connection is lost: nobody waits

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write the answer (its headers lower-case names, one of them its length) as
        uvicorn's send writes it: the server's default headers first, and
        ``connection: close`` when the connection ends with it."""
        if self.response_complete:
            return
        self.response_complete = True
        protocol = self.protocol
        transport = protocol.transport
        if self.disconnected or transport.is_closing():
            return
        content = [STATUS_LINE[status]]
        for name, value in protocol.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        search = HEADER_VALUE_RE.search
        for name, value in headers:
            if search(value) is not None:
                # What uvicorn's send refuses (a line break would let a value, an
                # instance's Content-Type say, write headers of its own): as there, the
                # connection ends with no answer.
                logger.error("refused to answer with the headers %r", headers)
                transport.close()
                return
            content += [name, b": ", value, b"\r\n"]
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content += [b"\r\n", body]
        transport.write(b"".join(content))
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()


class _NoEvent:
    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


def limited_protocol(
    *,
    max_headers: int,
    max_head_bytes: int,
    head_timeout_s: float,
    drain_timeout_s: float = LimitedHttpToolsProtocol.drain_timeout_s,
    serve_whole: ServeWhole | None = None,
) -> type[LimitedHttpToolsProtocol]:
    """The protocol class to give ``uvicorn.run(http=...)``, with these limits; the idle
    timeout is uvicorn's ``timeout_keep_alive``. ``serve_whole``: the app's driver of the
    callback path (see the module)."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {
            "max_headers": max_headers,
            "max_head_bytes": max_head_bytes,
            "head_timeout_s": head_timeout_s,
            "drain_timeout_s": drain_timeout_s,
            "serve_whole": staticmethod(serve_whole) if serve_whole is not None else None,
        },
    )
