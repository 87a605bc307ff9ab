"""SageMaker's data capture record, one JSON line per captured invocation, and its file.

A record, as SageMaker Model Monitor reads it::

    {"captureData": {"endpointInput": {"observedContentType": "text/csv", "mode": "INPUT",
                                       "data": "1,2\\n", "encoding": "CSV"},
                     "endpointOutput": {"observedContentType": "text/csv",
                                        "mode": "OUTPUT", "data": "3\\n",
                                        "encoding": "CSV"}},
     "eventMetadata": {"eventId": "<uuid>", "inferenceId": "<the client's>",
                       "inferenceTime": "2024-05-01T12:00:00Z"},
     "eventVersion": "0"}

A body whose content type is a CSV or JSON one of the config (CaptureContentTypeHeader)
is written as text, any other (or one that is not UTF-8) in base64. Files are named as
SageMaker names them: ``<endpoint>/<variant>/yyyy/mm/dd/hh/mm-ss-mmm-<uuid>.jsonl``
under the destination, stamped with the time of their first record, in UTC.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shipyard.capture.config import CaptureConfig


@dataclass(slots=True)
class Captured:
    """One sampled invocation as the data path hands it over, not yet encoded: the
    encoding is the writer's work, off the request's path."""

    at: float
    """When the invocation was answered: seconds since the epoch."""
    inference_id: str | None
    input: bytes | None
    input_type: str
    output: bytes | None
    output_type: str

    @property
    def size(self) -> int:
        """Bytes held, as the writer's buffer counts them."""
        return len(self.input or b"") + len(self.output or b"")


def encode_lines(items: Iterable[Captured], config: CaptureConfig) -> bytes:
    """The records of ``items`` as JSON Lines, each line ending with a newline."""
    encoder = LineEncoder(config)
    return "".join(encoder.line(item) for item in items).encode()


class LineEncoder:
    """Writes records as text, by template rather than through ``json.dumps``.

    Why by hand: every sampled invocation is encoded on the gateway, in the process
    that serves the data path, and ``json.dumps`` of the nested record costs several
    times more than escaping its few strings with json's own C escaper (measured in
    bench/data_capture.py). The escaping is json's, so the text is the same JSON.
    """

    __slots__ = ("_csv", "_json", "_types", "_second", "_stamp", "_id_prefix", "_id_next")

    def __init__(self, config: CaptureConfig) -> None:
        self._csv = frozenset(config.csv_content_types)
        self._json = frozenset(config.json_content_types)
        self._types: dict[str, tuple[str, str]] = {}
        """Content type as observed -> (its encoding, it as a JSON string): a handful."""
        self._second = -1
        self._stamp = ""
        # Event ids: a random version 4 UUID per encoder, whose last 48 bits count up
        # from a random start: unique, and a fraction of the cost of uuid4() per record.
        random_id = str(uuid.uuid4())
        self._id_prefix = random_id[:24]
        self._id_next = int(random_id[24:], 16)

    def line(self, item: Captured) -> str:
        """One record and its newline."""
        parts = []
        if item.input is not None:
            parts.append('"endpointInput":' + self._body(item.input, item.input_type, "INPUT"))
        if item.output is not None:
            output = self._body(item.output, item.output_type, "OUTPUT")
            parts.append('"endpointOutput":' + output)
        self._id_next = (self._id_next + 1) & 0xFFFFFFFFFFFF
        meta = f'"eventId":"{self._id_prefix}{self._id_next:012x}"'
        if item.inference_id is not None:
            meta += ',"inferenceId":' + _string(item.inference_id)
        second = int(item.at)
        if second != self._second:  # records come in time order: one strftime a second
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        meta += ',"inferenceTime":"' + self._stamp + '"'
        return (
            '{"captureData":{' + ",".join(parts) + '},"eventMetadata":{' + meta + "},"
            '"eventVersion":"0"}\n'
        )

    def _body(self, body: bytes, content_type: str, mode: str) -> str:
        known = self._types.get(content_type)
        if known is None:
            kind = content_type.split(";", 1)[0].strip().lower()
            encoding = "CSV" if kind in self._csv else "JSON" if kind in self._json else "BASE64"
            known = self._types[content_type] = (encoding, _string(content_type))
        encoding, observed = known
        if encoding != "BASE64":
            try:
                data = _string(body.decode("utf-8"))
            except UnicodeDecodeError:
                encoding = "BASE64"
        if encoding == "BASE64":
            data = '"' + base64.b64encode(body).decode("ascii") + '"'
        return (
            '{"observedContentType":' + observed + ',"mode":"' + mode + '",'
            '"data":' + data + ',"encoding":"' + encoding + '"}'
        )


_string: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""A str as a JSON string literal, quotes included: json's own (C) escaper."""


def file_key(endpoint: str, variant: str, at: float) -> str:
    """Where a file whose first record is from ``at`` goes, under the destination."""
    stamp = time.gmtime(at)
    millis = int(at * 1000) % 1000
    hour = time.strftime("%Y/%m/%d/%H", stamp)
    name = f"{time.strftime('%M-%S', stamp)}-{millis:03d}-{uuid.uuid4()}.jsonl"
    return f"{endpoint}/{variant}/{hour}/{name}"


def hour_of(at: float) -> int:
    """The hour (since the epoch) a record's file belongs to."""
    return int(at // 3600)
