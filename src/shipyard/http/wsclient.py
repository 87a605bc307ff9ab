"""A WebSocket client for one stream to an instance, frame by frame.

Bidirectional streaming reaches an instance over a WebSocket, one frame per part both
ways, a frame that does not end its message (FIN 0) being a part that does not end its
message either. A client that hands over whole messages (the ``websockets`` library's
own asyncio client) would hold a message's first frames until its last: this one runs
the library's sans-I/O protocol (RFC 6455's state machine, its handshake, pings and
close) over an asyncio stream and hands each frame over as it comes, so a frame goes on
at once and nothing is buffered beyond the frame in hand. It reads only when asked
(``receive``): an instance that sends faster than the gateway's client reads is held
back by TCP's own flow control.

Nothing of shipyard: the door (gateway/doors/bidi.py) decides what frames mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidStatus
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri


class Refused(Exception):
    """The instance answered the handshake with another status than 101."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        super().__init__(f"the WebSocket handshake was refused with {status}")
        self.status = status
        self.body = body
        self.headers = headers

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


def _refusal(answer: bytes) -> Refused | None:
    """The status and body of an HTTP answer that is no WebSocket's, when it has one."""
    head, _, body = answer.partition(b"\r\n\r\n")
    match = _STATUS_LINE.match(head)
    if match is None:
        return None
    return Refused(int(match.group(1)), body, [])


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})")


class Unreachable(Exception):
    """The instance could not be reached, or its handshake broke off."""


@dataclass(slots=True)
class Part:
    """One data frame: ``text`` (a text message's frames, continuations included),
    ``data``, and ``fin`` (whether it ends its message)."""

    text: bool
    data: bytes
    fin: bool


@dataclass(slots=True)
class Closed:
    """The instance closed the WebSocket (``code`` 1006: the connection was lost)."""

    code: int
    reason: str


class WebSocket:
    """One WebSocket to an instance: ``send`` a frame, ``receive`` the next one."""

    def __init__(
        self,
        protocol: ClientProtocol,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.protocol = protocol
        self.reader = reader
        self.writer = writer
        self.pings_unanswered = 0
        self._text = False  # the message being received is text
        self._frames: list[Frame] = []

    def __repr__(self) -> str:
        return f"WebSocket(state={self.protocol.state.name})"

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        path: str,
        *,
        socket_path: str | None = None,
        timeout_s: float,
        subprotocols: list[str] | None = None,
        max_size: int | None = None,
    ) -> WebSocket:
        """Open a WebSocket to ``path`` on the instance (over ``socket_path`` when
        given, else TCP), offering ``subprotocols``; Refused or Unreachable when it
        cannot be had."""
        protocol = ClientProtocol(
            parse_uri(f"ws://{host}:{port}{path}"),
            subprotocols=subprotocols,  # type: ignore[arg-type]
            max_size=max_size,
        )
        try:
            async with asyncio.timeout(timeout_s):
                if socket_path is not None:
                    reader, writer = await asyncio.open_unix_connection(socket_path)
                else:
                    reader, writer = await asyncio.open_connection(host, port)
                socket = cls(protocol, reader, writer)
                request = protocol.connect()
                protocol.send_request(request)
                await socket._flush()
                await socket._handshake()
                return socket
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"cannot reach the instance: {exc!r}") from None

    async def _handshake(self) -> None:
        seen = b""  # what the instance answered, for an answer websockets cannot parse
        while True:
            data = await self.reader.read(65536)
            if len(seen) < 65536:
                seen += data
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
            accepted = False
            for event in self.protocol.events_received():
                if isinstance(event, Response):
                    if event.status_code != 101 or self.protocol.state is not State.OPEN:
                        self.writer.close()
                        raise Refused(
                            event.status_code,
                            bytes(event.body or b""),
                            list(event.headers.raw_items()),
                        )
                    accepted = True
                elif isinstance(event, Frame):  # sent right after the 101, in its read
                    self._frames.append(event)
            if accepted:
                return
            self._check_handshake(seen)
            if not data:
                raise Unreachable("the instance closed the connection during the handshake")

    def _check_handshake(self, seen: bytes) -> None:
        """Raise Refused or Unreachable for a handshake that failed."""
        error = self.protocol.handshake_exc
        if isinstance(error, InvalidStatus):
            response = error.response
            self.writer.close()
            raise Refused(
                response.status_code,
                bytes(response.body or b""),
                list(response.headers.raw_items()),
            )
        if isinstance(error, InvalidHandshake):
            self.writer.close()
            refused = _refusal(seen)  # an HTTP/1.0 answer, say: still a refusal
            if refused is not None:
                raise refused
            raise Unreachable(f"the instance's handshake was not WebSocket's: {error}")

    async def send(self, data: bytes, *, text: bool, fin: bool, continuation: bool) -> None:
        """One data frame: the first of a message (``continuation`` False) or the next."""
        if self.protocol.state is not State.OPEN:
            return
        if continuation:
            self.protocol.send_continuation(data, fin)
        elif text:
            self.protocol.send_text(data, fin)
        else:
            self.protocol.send_binary(data, fin)
        await self._flush()

    async def ping(self) -> None:
        if self.protocol.state is State.OPEN:
            self.pings_unanswered += 1
            self.protocol.send_ping(b"")
            await self._flush()

    async def receive(self) -> Part | Closed:
        """The next data frame, or how the WebSocket closed."""
        while True:
            while self._frames:
                frame = self._frames.pop(0)
                if frame.opcode is Opcode.PONG:
                    self.pings_unanswered = 0
                elif frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                    self._text = frame.opcode is Opcode.TEXT
                    return Part(self._text, bytes(frame.data), frame.fin)
                elif frame.opcode is Opcode.CONT:
                    return Part(self._text, bytes(frame.data), frame.fin)
                elif frame.opcode is Opcode.CLOSE:
                    close = Close.parse(bytes(frame.data)) if frame.data else None
                    await self._flush()  # the protocol's answer to the close
                    return Closed(close.code if close else 1005, close.reason if close else "")
            if self.protocol.state is State.CLOSED:
                return Closed(1006, "the connection was lost")
            try:
                data = await self.reader.read(65536)
            except OSError:
                data = b""
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
            self._frames.extend(self.protocol.events_received())  # type: ignore[arg-type]
            await self._flush()  # pongs to the instance's pings
            if not data and not self._frames:
                return Closed(1006, "the connection was lost")

    async def close_input(self) -> None:
        """Close 1000 from our side, still reading what the instance sends until its
        own close."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(1000, "")
            await self._flush()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the WebSocket (the instance's answer is not waited for)."""
        with contextlib.suppress(Exception):
            if self.protocol.state is State.OPEN:
                self.protocol.send_close(code, reason)
                await self._flush()
        self.abort()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (OSError, RuntimeError):
                pass  # the read side sees the connection lost
