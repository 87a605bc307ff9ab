"""The event-stream decoder (http/eventstream.py): messages out of bytes as they come,
every header type, both CRCs, and the size limit checked from the prelude alone."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, datetime

import pytest

from shipyard.http import eventstream
from shipyard.http.eventstream import Decoder, MalformedEvent


def test_messages_come_out_whole_whatever_the_bytes_are_cut_into() -> None:
    frames = [eventstream.bidi_part(b"x" * n, "BINARY") for n in (0, 1, 1000)]
    frames.append(eventstream.bidi_part("héllo".encode(), "UTF8", "PARTIAL"))
    data = b"".join(frames)
    decoder = Decoder(max_message_bytes=4096)
    out = [m for n in range(len(data)) for m in decoder.feed(data[n : n + 1])]
    assert [m.payload for m in out] == [b"", b"x", b"x" * 1000, "héllo".encode()]
    assert out[3].headers["DataType"] == "UTF8"
    assert out[3].headers["CompletionState"] == "PARTIAL"
    assert out[0].headers[":event-type"] == "PayloadPart"
    assert decoder.pending == 0


def test_every_header_type_is_read() -> None:
    when_ms = 1_700_000_000_123
    ident = uuid.uuid4()
    headers = b"".join(
        [
            bytes((1,)) + b"t" + bytes((0,)),
            bytes((1,)) + b"f" + bytes((1,)),
            bytes((1,)) + b"b" + bytes((2,)) + struct.pack(">b", -3),
            bytes((1,)) + b"s" + bytes((3,)) + struct.pack(">h", 300),
            bytes((1,)) + b"i" + bytes((4,)) + struct.pack(">i", 70000),
            bytes((1,)) + b"l" + bytes((5,)) + struct.pack(">q", 2**40),
            bytes((1,)) + b"y" + bytes((6,)) + struct.pack(">H", 2) + b"\x00\xff",
            bytes((1,)) + b"d" + bytes((8,)) + struct.pack(">q", when_ms),
            bytes((1,)) + b"u" + bytes((9,)) + ident.bytes,
        ]
    )
    (message,) = Decoder(max_message_bytes=1024).feed(eventstream.frame(headers, b"p"))
    assert message.headers == {
        "t": True,
        "f": False,
        "b": -3,
        "s": 300,
        "i": 70000,
        "l": 2**40,
        "y": b"\x00\xff",
        "d": datetime.fromtimestamp(when_ms / 1000, UTC),
        "u": ident,
    }


def test_a_corrupt_message_is_refused() -> None:
    frame = bytearray(eventstream.bidi_part(b"data", "BINARY"))
    frame[-6] ^= 1
    with pytest.raises(MalformedEvent, match="CRC"):
        list(Decoder(max_message_bytes=1024).feed(bytes(frame)))


def test_a_message_over_the_limit_is_refused_from_its_prelude() -> None:
    frame = eventstream.bidi_part(b"x" * 2000, "BINARY")
    with pytest.raises(MalformedEvent, match="over the limit"):
        list(Decoder(max_message_bytes=1024).feed(frame[:12]))
