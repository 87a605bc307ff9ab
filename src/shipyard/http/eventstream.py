"""AWS event-stream framing (``application/vnd.amazon.eventstream``), the encoding side.

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
"""

from __future__ import annotations

import json
import struct
import zlib

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
