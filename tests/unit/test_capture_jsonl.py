"""Capture records written by template are the JSON SageMaker's records are."""

from __future__ import annotations

import base64
import json
import re
import uuid

from shipyard.capture.config import CaptureConfig
from shipyard.capture.jsonl import Captured, encode_lines, file_key

CONFIG = CaptureConfig(
    enabled=True,
    sampling_percentage=100,
    destination="file:///tmp/capture",
    capture_input=True,
    capture_output=True,
    csv_content_types=("text/csv",),
    json_content_types=("application/json", "application/jsonlines"),
)


def captured(body: bytes, content_type: str, inference_id: str | None = None) -> Captured:
    return Captured(
        at=1_700_000_000.25,
        inference_id=inference_id,
        input=body,
        input_type=content_type,
        output=body,
        output_type=content_type,
    )


def test_text_bodies_with_quotes_and_unicode_round_trip() -> None:
    body = '{"q": "say \\"hi\\"\\n", "name": "Zoë ☃"}'.encode()
    records = [captured(body, "application/json; charset=utf-8", 'id "1"')]
    (line,) = encode_lines(records, CONFIG).splitlines()
    record = json.loads(line)
    assert record["captureData"]["endpointInput"] == {
        "observedContentType": "application/json; charset=utf-8",
        "mode": "INPUT",
        "data": body.decode(),
        "encoding": "JSON",
    }
    assert record["captureData"]["endpointOutput"]["mode"] == "OUTPUT"
    assert record["eventMetadata"]["inferenceId"] == 'id "1"'
    assert record["eventMetadata"]["inferenceTime"] == "2023-11-14T22:13:20Z"
    assert record["eventVersion"] == "0"


def test_unlisted_types_and_bodies_that_are_not_utf8_are_base64() -> None:
    lines = encode_lines(
        [captured(b"\x00\xff", "text/csv"), captured(b"1,2", "application/x-npy")], CONFIG
    ).splitlines()
    for line, body in zip(lines, (b"\x00\xff", b"1,2"), strict=True):
        data = json.loads(line)["captureData"]["endpointInput"]
        assert data["encoding"] == "BASE64"
        assert base64.b64decode(data["data"]) == body


def test_every_record_has_its_own_version_4_event_id() -> None:
    lines = encode_lines([captured(b"1", "text/csv")] * 50, CONFIG).splitlines()
    ids = [json.loads(line)["eventMetadata"]["eventId"] for line in lines]
    assert len(set(ids)) == 50
    assert all(uuid.UUID(i).version == 4 for i in ids)
    assert "inferenceId" not in json.loads(lines[0])["eventMetadata"]


def test_files_are_named_as_sagemaker_names_them() -> None:
    key = file_key("ep", "AllTraffic", 1_700_000_000.25)
    assert re.fullmatch(r"ep/AllTraffic/2023/11/14/22/13-20-250-[0-9a-f-]{36}\.jsonl", key)
