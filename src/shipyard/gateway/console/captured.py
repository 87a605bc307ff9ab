"""The last records of an endpoint's data capture, made readable for the console.

Capture writes one JSON line per sampled invocation into files named by time under the
config's ``DestinationS3Uri`` (capture/jsonl.py). The console reads the newest few of
those files through the gateway's ObjectStore, so the same ``file_roots`` and S3
endpoint apply as to every other read, and shows the last ``RECORDS_SHOWN`` records:
input and output as text where they are text, their size where they are not.

Reading costs a listing of the endpoint's folder and at most ``FILES_READ`` files of
``MAX_FILE_BYTES``: the view is polled slowly (pages.py) and only while its page is open.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from shipyard.errors import NoSuchObject, ObjectStoreError
from shipyard.storage.objects import ObjectStore

RECORDS_SHOWN = 20
FILES_READ = 3
MAX_FILE_BYTES = 1 << 20
SHOWN_BYTES = 2000
"""Of each body, the most shown; the rest is counted."""


@dataclass(frozen=True, slots=True)
class Body:
    content_type: str
    text: str | None
    """The body as text (cut to ``SHOWN_BYTES``), or None where it is binary."""
    size: int


@dataclass(frozen=True, slots=True)
class CapturedRecord:
    time: str
    inference_id: str
    variant: str
    input: Body | None
    output: Body | None


@dataclass(frozen=True, slots=True)
class Capture:
    """What the view shows: where capture goes, and its last records (or why none)."""

    destination: str | None
    records: tuple[CapturedRecord, ...] = ()
    problem: str = ""


def last_records(objects: ObjectStore, destination: str, endpoint: str) -> Capture:
    """The newest ``RECORDS_SHOWN`` records captured for ``endpoint``, newest first."""
    try:
        prefix = objects.join(destination, endpoint) + "/"
        files = [(uri, key) for uri, key in objects.list_prefix(prefix) if key.endswith(".jsonl")]
    except (ObjectStoreError, NoSuchObject, OSError) as exc:
        return Capture(destination, problem=f"Cannot list {destination}: {exc}")
    # Keys are <variant>/yyyy/mm/dd/hh/mm-ss-mmm-<uuid>.jsonl: newest last, per variant.
    files.sort(key=lambda f: f[1].split("/", 1)[-1])
    records: list[CapturedRecord] = []
    for uri, key in reversed(files[-FILES_READ:]):
        variant = key.split("/", 1)[0]
        try:
            data = objects.read_bytes(uri, limit=MAX_FILE_BYTES)
        except (ObjectStoreError, NoSuchObject, OSError):
            continue  # removed meanwhile, or too large to show
        for line in reversed(data.decode("utf-8", errors="replace").splitlines()):
            record = _record(line, variant)
            if record is not None:
                records.append(record)
        if len(records) >= RECORDS_SHOWN:
            break
    records.sort(key=lambda r: r.time, reverse=True)
    return Capture(destination, tuple(records[:RECORDS_SHOWN]))


def _record(line: str, variant: str) -> CapturedRecord | None:
    try:
        item = json.loads(line)
        data = item.get("captureData") or {}
        meta = item.get("eventMetadata") or {}
    except (ValueError, AttributeError):
        return None
    return CapturedRecord(
        time=str(meta.get("inferenceTime", "")),
        inference_id=str(meta.get("inferenceId") or meta.get("eventId") or ""),
        variant=variant,
        input=_body(data.get("endpointInput")),
        output=_body(data.get("endpointOutput")),
    )


def _body(part: object) -> Body | None:
    if not isinstance(part, dict):
        return None
    content_type = str(part.get("observedContentType", ""))
    data = str(part.get("data", ""))
    if part.get("encoding") != "BASE64":
        return Body(content_type, data[:SHOWN_BYTES], len(data.encode()))
    try:
        raw = base64.b64decode(data, validate=True)
        text: str | None = raw.decode("utf-8")[:SHOWN_BYTES]
    except (binascii.Error, UnicodeDecodeError):
        raw, text = b"", None
    return Body(content_type, text, len(raw) if raw else len(data) * 3 // 4)
