"""The event-stream encoder against botocore's own parser (EventStreamBuffer), and against
the EventStream that boto3's invoke_endpoint_with_response_stream hands its callers."""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import botocore.session
import pytest
from botocore.eventstream import EventStream, EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.parsers import EventStreamJSONParser

from shipyard.http import eventstream


def parse(data: bytes) -> list[Any]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return list(buffer)


@pytest.mark.parametrize("size", [0, 1, 17, 65536, 3 * 1024 * 1024])
def test_a_payload_part_is_read_back_by_botocore_with_its_bytes_and_headers(size: int) -> None:
    chunk = os.urandom(size)
    [message] = parse(eventstream.payload_part(chunk))
    assert message.payload == chunk
    assert message.headers == {
        ":event-type": "PayloadPart",
        ":message-type": "event",
        ":content-type": "application/octet-stream",
    }
    assert message.to_response_dict()["status_code"] == 200


def test_frames_split_anywhere_are_reassembled_in_order() -> None:
    chunks = [b"alpha", b"", b"\x00\xff" * 1000, "héllo".encode()]
    wire = b"".join(eventstream.payload_part(c) for c in chunks)
    buffer = EventStreamBuffer()
    seen = []
    for start in range(0, len(wire), 7):  # fed in odd slices, as a socket may deliver it
        buffer.add_data(wire[start : start + 7])
        seen += [m.payload for m in buffer]
    assert seen == chunks


def test_a_corrupted_byte_fails_botocore_s_checksum() -> None:
    wire = bytearray(eventstream.payload_part(b"payload"))
    wire[-6] ^= 0x01
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        parse(bytes(wire))


def test_the_message_crc_covers_prelude_headers_and_payload() -> None:
    wire = eventstream.payload_part(b"abc")
    assert int.from_bytes(wire[-4:], "big") == zlib.crc32(wire[:-4])
    assert int.from_bytes(wire[8:12], "big") == zlib.crc32(wire[:8])


def test_a_stream_error_is_an_exception_message_with_a_json_body() -> None:
    [message] = parse(eventstream.stream_error("ModelStreamError", "boom", "StreamBroken"))
    assert message.headers[":message-type"] == "exception"
    assert message.headers[":exception-type"] == "ModelStreamError"
    assert json.loads(message.payload) == {"Message": "boom", "ErrorCode": "StreamBroken"}
    assert message.to_response_dict()["status_code"] == 400


def test_too_large_payloads_and_headers_are_refused() -> None:
    with pytest.raises(ValueError):
        eventstream.frame(b"", b"\0" * (eventstream.MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(ValueError):
        eventstream.encode_headers({"x" * 256: "v"})


class _Raw:
    """The raw response body botocore's EventStream reads: ``stream()`` in pieces."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self) -> Any:
        for start in range(0, len(self.data), 5):
            yield self.data[start : start + 5]

    def close(self) -> None:
        pass


def _boto3_stream(wire: bytes) -> EventStream:
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    operation = model.operation_model("InvokeEndpointWithResponseStream")
    body_shape = operation.output_shape.members["Body"]
    return EventStream(_Raw(wire), body_shape, EventStreamJSONParser(), operation.name)


def test_boto3_iterates_payload_parts_then_raises_the_model_stream_error() -> None:
    wire = (
        eventstream.payload_part(b"one ")
        + eventstream.payload_part(b"two")
        + eventstream.stream_error("ModelStreamError", "the model failed", "StreamBroken")
    )
    events = iter(_boto3_stream(wire))
    assert next(events) == {"PayloadPart": {"Bytes": b"one "}}
    assert next(events) == {"PayloadPart": {"Bytes": b"two"}}
    with pytest.raises(EventStreamError) as raised:
        next(events)
    error = raised.value.response["Error"]
    assert error["Code"] == "ModelStreamError"
    assert error["Message"] == "the model failed"


def test_boto3_raises_an_internal_stream_failure_by_its_name() -> None:
    wire = eventstream.payload_part(b"x") + eventstream.stream_error(
        "InternalStreamFailure", "Internal failure."
    )
    events = iter(_boto3_stream(wire))
    assert next(events) == {"PayloadPart": {"Bytes": b"x"}}
    with pytest.raises(EventStreamError) as raised:
        next(events)
    assert raised.value.response["Error"]["Code"] == "InternalStreamFailure"
