"""A raw HTTP/2 client for the bidirectional-streaming door, on h2: what AWS's client
cannot express (flow control held back, resets, malformed events, many streams on one
connection), and event-stream messages written and read as the SDKs do."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from shipyard.http import eventstream


def request_event(payload: bytes | str, *, partial: bool = False) -> bytes:
    """A PayloadPart request event, as AWS's client frames one (unsigned)."""
    text = isinstance(payload, str)
    data = payload.encode() if isinstance(payload, str) else payload
    return eventstream.bidi_part(
        data, "UTF8" if text else "BINARY", "PARTIAL" if partial else "COMPLETE"
    )


def envelope(inner: bytes, signature: bytes = b"\0" * 32, date_ms: int = 0) -> bytes:
    """``inner`` inside a signed envelope (``:date``, ``:chunk-signature``)."""
    headers = (
        bytes((5,)) + b":date" + bytes((8,)) + struct.pack(">q", date_ms)
        + bytes((16,)) + b":chunk-signature" + bytes((6,)) + struct.pack(">H", len(signature))
        + signature
    )  # fmt: skip
    return eventstream.frame(headers, inner)


@dataclass
class Event:
    kind: str  # PayloadPart, ModelStreamError, InternalStreamFailure
    data: bytes
    headers: dict[str, Any]

    @property
    def text(self) -> str | bytes:
        return self.data.decode() if self.headers.get("DataType") == "UTF8" else self.data

    @property
    def error(self) -> dict[str, Any]:
        return json.loads(self.data)


@dataclass
class Stream:
    client: H2Client
    stream_id: int
    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    events: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    ended: bool = False
    reset: int | None = None
    head: asyncio.Event = field(default_factory=asyncio.Event)
    decoder: eventstream.Decoder = field(
        default_factory=lambda: eventstream.Decoder(max_message_bytes=64 * 1024 * 1024)
    )

    async def send(self, data: bytes, *, end: bool = False) -> None:
        await self.client.send_data(self.stream_id, data, end=end)

    async def part(self, payload: bytes | str, *, partial: bool = False) -> None:
        await self.send(request_event(payload, partial=partial))

    async def end(self) -> None:
        await self.client.send_data(self.stream_id, b"", end=True)

    def cancel(self) -> None:
        self.client.conn.reset_stream(self.stream_id)
        self.client.flush()

    async def wait_head(self, timeout_s: float = 30) -> int:
        await asyncio.wait_for(self.head.wait(), timeout_s)
        assert self.status is not None
        return self.status

    async def next_event(self, timeout_s: float = 30) -> Event | None:
        """The next event; None at the answer's end."""
        return await asyncio.wait_for(self.events.get(), timeout_s)

    async def rest(self, timeout_s: float = 30) -> list[Event]:
        out = []
        while (event := await self.next_event(timeout_s)) is not None:
            out.append(event)
        return out

    def json_body(self) -> dict[str, Any]:
        return json.loads(bytes(self.body))


class H2Client:
    """One HTTP/2 connection; ``read_paused`` stops acknowledging received data (its
    window then fills and the server must stop sending)."""

    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.streams: dict[int, Stream] = {}
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.window_open = asyncio.Event()
        self.read_paused = False
        self.unacknowledged: list[tuple[int, int]] = []
        self._task: asyncio.Task[None] | None = None
        self.authority = ""
        self.goaway = asyncio.Event()
        """Set once the server sent GOAWAY (the streams open go on)."""

    @classmethod
    async def connect(
        cls, port: int, *, tls: bool = False, cafile: str | None = None, window: int | None = None
    ) -> H2Client:
        self = cls()
        context = None
        if tls:
            context = ssl.create_default_context(cafile=cafile)
            context.set_alpn_protocols(["h2"])
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="localhost" if tls else None
        )
        self.authority = f"127.0.0.1:{port}"
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        self.conn.initiate_connection()
        self.flush()
        self._task = asyncio.ensure_future(self._read())
        return self

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def open(
        self, endpoint: str, headers: dict[str, str] | None = None, *, path: str | None = None
    ) -> Stream:
        stream_id = self.conn.get_next_available_stream_id()
        request = [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":authority", self.authority.encode()),
            (
                b":path",
                (path or f"/endpoints/{endpoint}/invocations-bidirectional-stream").encode(),
            ),
            (b"content-type", b"application/vnd.amazon.eventstream"),
        ]
        request += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        stream = self.streams[stream_id] = Stream(self, stream_id)
        self.conn.send_headers(stream_id, request)
        self.flush()
        await self.writer.drain()
        return stream

    async def send_data(self, stream_id: int, data: bytes, *, end: bool) -> None:
        view = memoryview(data)
        while True:
            size = min(
                self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size
            )
            if size <= 0 and view:
                self.window_open.clear()
                await self.window_open.wait()
                continue
            chunk, view = view[:size], view[size:]
            self.conn.send_data(stream_id, bytes(chunk), end_stream=end and not view)
            self.flush()
            await self.writer.drain()
            if not view:
                return

    def resume_reading(self) -> None:
        self.read_paused = False
        for size, stream_id in self.unacknowledged:
            self.conn.acknowledge_received_data(size, stream_id)
        self.unacknowledged.clear()
        self.flush()

    async def _read(self) -> None:
        while True:
            data = await self.reader.read(65536)
            if not data:
                for stream in self.streams.values():
                    if not stream.ended:
                        stream.ended = True
                        stream.events.put_nowait(None)
                return
            for event in self.conn.receive_data(data):
                self._on(event)
            self.flush()

    def _on(self, event: Any) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            stream = self.streams[event.stream_id]
            stream.headers = dict(event.headers)
            stream.status = int(stream.headers[b":status"])
            stream.head.set()
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams[event.stream_id]
            if self.read_paused:
                self.unacknowledged.append((event.flow_controlled_length, event.stream_id))
            else:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream.status == 200:
                for message in stream.decoder.feed(event.data):
                    kind = message.headers.get(":event-type") or message.headers.get(
                        ":exception-type"
                    )
                    stream.events.put_nowait(Event(str(kind), message.payload, message.headers))
            else:
                stream.body += event.data
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams[event.stream_id]
            stream.ended = True
            stream.events.put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams[event.stream_id]
            stream.reset = event.error_code
            if not stream.ended:
                stream.ended = True
                stream.events.put_nowait(None)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window_open.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.writer.close()


STREAMING_EVENTS = "STREAMING-AWS4-HMAC-SHA256-EVENTS"


def signed_head(
    authority: str, path: str, key: str, secret: str, region: str = "us-east-1"
) -> tuple[dict[str, str], str]:
    """The SigV4 headers of a bidirectional stream's request, and its signature (the seed
    of its events' chain), as AWS's SDKs sign them."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(
        method="POST",
        url=f"https://{authority}{path}",
        headers={
            "X-Amz-Content-SHA256": STREAMING_EVENTS,
            "Content-Type": "application/vnd.amazon.eventstream",
        },
    )
    SigV4Auth(Credentials(key, secret), "sagemaker", region).add_auth(request)
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-type"}
    seed = headers["Authorization"].rsplit("Signature=", 1)[1]
    return headers, seed


class EventSigner:
    """Signs events as AWS's SDKs do, each chained to the signature before it."""

    def __init__(self, seed: str, secret: str, region: str = "us-east-1") -> None:
        self.prior = seed
        self.secret = secret
        self.region = region

    def sign(self, inner: bytes, *, corrupt: bool = False) -> bytes:
        import datetime as dt
        import hashlib
        import hmac

        now = dt.datetime.now(dt.UTC)
        millis = int(now.timestamp() * 1000)
        stamp = dt.datetime.fromtimestamp(millis / 1000, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        date_header = bytes((5,)) + b":date" + bytes((8,)) + struct.pack(">q", millis)
        day = stamp[:8]
        key = ("AWS4" + self.secret).encode()
        for part in (day, self.region, "sagemaker", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        to_sign = "\n".join(
            (
                "AWS4-HMAC-SHA256-PAYLOAD",
                stamp,
                f"{day}/{self.region}/sagemaker/aws4_request",
                self.prior,
                hashlib.sha256(date_header).hexdigest(),
                hashlib.sha256(inner).hexdigest(),
            )
        )
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).digest()
        self.prior = signature.hex()
        if corrupt:
            signature = bytes(32)
        return envelope(inner, signature, millis)
