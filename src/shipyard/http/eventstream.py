"""AWS event-stream framing (``application/vnd.amazon.eventstream``), both ways.

InvokeEndpointWithResponseStream answers in these frames, and boto3 reads them with
botocore's ``EventStreamBuffer``. botocore only parses them, and the libraries that also
write them (awscrt, amazon-eventstream) are a native extension or an abandoned package
for what is about 30 lines, so the encoder is written here, after the specification
botocore's parser implements:

    prelude   total length (uint32) | headers length (uint32) | CRC32 of those 8 bytes
    headers   per header: name length (uint8) | name | type 7 = string | length (uint16)
              | value
    payload   bytes
    trailer   CRC32 of everything before it

all integers big-endian. tests/unit/test_eventstream.py checks every frame written here
against botocore's own parser.

A PayloadPart frame's headers never change, so they are encoded once: per chunk the work
is two CRC32s (zlib's, which runs at memory speed) and one join.

``Decoder`` reads them (bidirectional streaming's request events): every header type of
the specification, both CRCs checked, each message held to a size limit before any of it
is buffered past its prelude.
"""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

MEDIA_TYPE = b"application/vnd.amazon.eventstream"

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
"""Most payload bytes one frame carries (botocore accepts up to 24 MiB): the door splits
larger chunks over several PayloadPart events."""

_STRING = 7  # the header value type of a UTF-8 string
_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")


def encode_headers(headers: dict[str, str]) -> bytes:
    """Headers in the event-stream wire form, all of them strings."""
    out = bytearray()
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        if len(raw_name) > 255 or len(raw_value) > 65535:
            raise ValueError(f"event-stream header {name!r} is too long")
        out += bytes((len(raw_name),)) + raw_name + bytes((_STRING,))
        out += struct.pack(">H", len(raw_value)) + raw_value
    return bytes(out)


def frame(headers: bytes, payload: bytes) -> bytes:
    """One message: ``headers`` already encoded (see encode_headers), then ``payload``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"an event-stream payload holds at most {MAX_PAYLOAD_BYTES} bytes")
    prelude = _PRELUDE.pack(16 + len(headers) + len(payload), len(headers))
    head = prelude + _CRC.pack(zlib.crc32(prelude)) + headers
    return b"".join((head, payload, _CRC.pack(zlib.crc32(payload, zlib.crc32(head)))))


_PAYLOAD_PART = encode_headers(
    {
        ":event-type": "PayloadPart",
        ":message-type": "event",
        ":content-type": "application/octet-stream",
    }
)


def payload_part(chunk: bytes) -> bytes:
    """A ``PayloadPart`` event carrying ``chunk``: boto3 yields ``{"PayloadPart":
    {"Bytes": chunk}}``."""
    return frame(_PAYLOAD_PART, chunk)


def stream_error(exception_type: str, message: str, error_code: str | None = None) -> bytes:
    """An exception event (``ModelStreamError``, ``InternalStreamFailure``): boto3 raises
    botocore's EventStreamError with this code and message while iterating."""
    body: dict[str, str] = {"Message": message}
    if error_code is not None:
        body["ErrorCode"] = error_code
    headers = encode_headers(
        {
            ":exception-type": exception_type,
            ":message-type": "exception",
            ":content-type": "application/json",
        }
    )
    return frame(headers, json.dumps(body).encode())


def bidi_part(payload: bytes, data_type: str, completion: str = "COMPLETE") -> bytes:
    """A bidirectional stream's ``PayloadPart`` event: ``DataType`` (UTF8 or BINARY) and
    ``CompletionState`` (PARTIAL or COMPLETE) as string headers, as AWS's client reads
    them."""
    headers = _BIDI_HEADERS.get((data_type, completion))
    if headers is None:
        raise ValueError(f"no PayloadPart of DataType {data_type}, {completion}")
    return frame(headers, payload)


_BIDI_HEADERS = {
    (kind, state): encode_headers(
        {
            ":event-type": "PayloadPart",
            ":message-type": "event",
            ":content-type": "application/octet-stream",
            "DataType": kind,
            "CompletionState": state,
        }
    )
    for kind in ("UTF8", "BINARY")
    for state in ("PARTIAL", "COMPLETE")
}


class MalformedEvent(ValueError):
    """Bytes that are not an event-stream message: a bad CRC, a length out of bounds, a
    header of no known type."""


HeaderValue = bool | int | bytes | str | datetime | uuid.UUID


@dataclass(slots=True)
class Message:
    """One decoded event-stream message: its headers by name, its payload, and the
    bytes its signature covers (the whole message as it came)."""

    headers: dict[str, HeaderValue]
    payload: bytes
    raw: bytes


class Decoder:
    """Event-stream messages out of bytes fed as they arrive.

    ``feed`` buffers at most one message (and the next one's start); a message whose
    prelude declares more than ``max_message_bytes`` is refused before its body is
    read. Fails with MalformedEvent, after which the decoder is of no further use.
    """

    def __init__(self, *, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self._buffer = bytearray()

    def __repr__(self) -> str:
        return f"Decoder(buffered={len(self._buffer)})"

    @property
    def pending(self) -> int:
        """Bytes held of a message not yet whole."""
        return len(self._buffer)

    def feed(self, data: bytes) -> Iterator[Message]:
        self._buffer += data
        while len(self._buffer) >= 12:
            total, headers_length = _PRELUDE.unpack_from(self._buffer)
            (prelude_crc,) = _CRC.unpack_from(self._buffer, 8)
            if zlib.crc32(self._buffer[:8]) != prelude_crc:
                raise MalformedEvent("the prelude's CRC does not match")
            if total > self.max_message_bytes:
                raise MalformedEvent(
                    f"a message of {total} bytes is over the limit of {self.max_message_bytes}"
                )
            if total < 16 + headers_length:
                raise MalformedEvent("a message shorter than its headers")
            if len(self._buffer) < total:
                return
            raw = bytes(self._buffer[:total])
            del self._buffer[:total]
            (crc,) = _CRC.unpack_from(raw, total - 4)
            if zlib.crc32(raw[: total - 4]) != crc:
                raise MalformedEvent("the message's CRC does not match")
            headers = decode_headers(raw[12 : 12 + headers_length])
            yield Message(headers, raw[12 + headers_length : total - 4], raw)


def decode_headers(data: bytes) -> dict[str, HeaderValue]:
    """Headers in the event-stream wire form, each value as its type says."""
    out: dict[str, HeaderValue] = {}
    at = 0
    try:
        while at < len(data):
            size = data[at]
            name = data[at + 1 : at + 1 + size].decode()
            at += 1 + size
            kind = data[at]
            at += 1
            value: HeaderValue
            if kind in (0, 1):
                value = kind == 0
            elif kind in _FIXED:
                width, fmt = _FIXED[kind]
                (number,) = struct.unpack_from(fmt, data, at)
                at += width
                value = datetime.fromtimestamp(number / 1000, UTC) if kind == 8 else number
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", data, at)
                raw = data[at + 2 : at + 2 + length]
                if len(raw) != length:
                    raise MalformedEvent("a header value cut short")
                at += 2 + length
                value = raw.decode() if kind == 7 else bytes(raw)
            elif kind == 9:
                value = uuid.UUID(bytes=bytes(data[at : at + 16]))
                at += 16
            else:
                raise MalformedEvent(f"header {name!r} has no known type ({kind})")
            out[name] = value
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, MalformedEvent):
            raise
        raise MalformedEvent(f"malformed headers: {exc}") from None
    return out


_FIXED = {2: (1, ">b"), 3: (2, ">h"), 4: (4, ">i"), 5: (8, ">q"), 8: (8, ">q")}
