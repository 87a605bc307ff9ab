"""Input objects into records, streaming: CompressionType and SplitType.

An object arrives as chunks of any size, split anywhere (even inside a record header), and
may be many gigabytes, so nothing here reads it whole: ``decompress`` inflates chunk by
chunk and ``records`` holds at most one record plus one chunk. The n-th record yielded is
record n of its object (0-based); errors carry that index and say it counting from 1, as
the job's FailureReason does.

What a record is, per SplitType (https://docs.aws.amazon.com/sagemaker/latest/APIReference/
API_TransformInput.html):

- ``Line``: a line without its ``\\n`` (and without a ``\\r`` before it); a last line with no
  newline is a record too. Empty lines are skipped: the docs are silent, an empty request
  body is nothing a model can answer, and with ``AssembleWith: Line`` it would shift every
  later output line.
- ``RecordIO`` (MXNet/dmlc): each part is a little-endian magic 0xced7230a, a little-endian
  ``lrecord`` (lower 29 bits the length, upper 3 bits ``cflag``), the data and padding to 4
  bytes. A record is one part with cflag 0, or parts with cflag 1, 2…, 3 (the writer splits
  data where it contains the magic number). The record keeps its framing, headers included,
  as SageMaker's built-in algorithms expect ``application/x-recordio-protobuf`` requests;
  its trailing padding is dropped because the API reference says padding is removed with
  ``BatchStrategy: SingleRecord`` (``batching`` puts it back for ``MultiRecord``).
- ``TFRecord``: a little-endian uint64 length, the masked CRC32C of those 8 bytes, the
  data and the masked CRC32C of the data. Both CRCs are checked; the record keeps its
  framing.
- ``None`` is not a split: the runner sends the object whole as one request body, so
  ``records`` refuses it.

Errors (in shipyard.errors; the runner turns each into the job's FailureReason)::

    SplitError                  the object cannot be made into records; names the byte offset
      RecordTooLarge            a record over max_record_bytes or the payload limit
      FilterError               a record that DataProcessing cannot filter or join (jsonpath.py)
      AnswerMismatch            a MultiRecord answer without one line per record (batching.py)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import AsyncIterator

import google_crc32c

from shipyard.errors import RecordTooLarge, SplitError

SPLIT_TYPES = ("Line", "RecordIO", "TFRecord")
COMPRESSION_TYPES = ("None", "Gzip")

DEFAULT_MAX_RECORD_BYTES = 100 * 1024 * 1024
"""MaxPayloadInMB's maximum: a longer record can never be sent, so reading stops there."""

RECORDIO_MAGIC = 0xCED7230A
_RECORDIO_LENGTH_MASK = (1 << 29) - 1
_RECORDIO_HEADER = struct.Struct("<II")
_TFRECORD_HEADER = struct.Struct("<QI")
_TFRECORD_FOOTER = struct.Struct("<I")
_INFLATE_STEP_BYTES = 256 * 1024
"""At most this much inflated output per step, so a small chunk of a zip bomb stays small."""


def decompress(chunks: AsyncIterator[bytes], compression: str) -> AsyncIterator[bytes]:
    """The object's bytes under its CompressionType (``None`` or ``Gzip``), as chunks.

    Gzip may hold several concatenated members (``cat a.gz b.gz``) and zero padding after
    them, as ``gzip`` accepts. A corrupt or truncated stream raises ``SplitError``; an
    unknown CompressionType raises ``ValueError`` at once."""
    if compression == "None":
        return chunks
    if compression == "Gzip":
        return _gunzip(chunks)
    raise ValueError(f"CompressionType must be one of {', '.join(COMPRESSION_TYPES)}.")


async def _gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    # wbits=31: gzip framing only; a zlib or raw stream is an error, not a guess.
    inflater: zlib._Decompress | None = None
    fed = 0
    async for chunk in chunks:
        data = chunk
        while True:
            if inflater is None:
                rest = data.lstrip(b"\0")
                fed += len(data) - len(rest)
                data = rest
                if not data:
                    break
                inflater = zlib.decompressobj(wbits=31)
            try:
                out = inflater.decompress(data, _INFLATE_STEP_BYTES)
            except zlib.error as exc:
                raise SplitError(
                    f"The Gzip stream is corrupt near compressed byte {fed}: {exc}."
                ) from exc
            if out:
                yield out
            if inflater.eof:
                rest = inflater.unused_data
                inflater = None
            else:
                rest = inflater.unconsumed_tail
                # All input taken, yet a full step out: the inflater may hold more output,
                # so go round again with no new input.
                if not rest and len(out) < _INFLATE_STEP_BYTES:
                    fed += len(data)
                    break
            fed += len(data) - len(rest)
            data = rest
    if inflater is not None:
        raise SplitError(f"The Gzip stream ends in the middle of a member (byte {fed}).")


def records(
    chunks: AsyncIterator[bytes],
    split_type: str,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> AsyncIterator[bytes]:
    """The object's records under its SplitType, in order (see the module docstring).

    A record longer than ``max_record_bytes`` raises ``RecordTooLarge`` once that many bytes
    are seen, having held no more than the limit plus one chunk; a truncated or corrupt
    record raises ``SplitError`` with its byte offset. ``None`` and unknown SplitTypes
    raise ``ValueError`` at once: SplitType ``None`` means the object is streamed whole."""
    return _each(record_batches(chunks, split_type, max_record_bytes=max_record_bytes))


def record_batches(
    chunks: AsyncIterator[bytes],
    split_type: str,
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> AsyncIterator[list[bytes]]:
    """``records`` a list at a time, the same records in the same order with the same
    errors: the lines a chunk completes together for ``Line``, one record a list for
    ``RecordIO`` and ``TFRecord`` (a record of those may be as large as the limit).

    What the runner reads. An async generator's step costs about a microsecond, and a
    record went through three of them (split, filter, pack), so for lines of a few hundred
    bytes the steps were most of the gateway's CPU in a job: one step per chunk instead
    (bench/results/transform_throughput.md)."""
    if split_type == "None":
        raise ValueError(
            "SplitType None does not split: send the object whole as one request body."
        )
    if max_record_bytes < 1:
        raise ValueError("max_record_bytes must be positive.")
    if split_type == "Line":
        return _lines(chunks, max_record_bytes)
    if split_type == "RecordIO":
        return _recordio(_Reader(chunks), max_record_bytes)
    if split_type == "TFRecord":
        return _tfrecords(_Reader(chunks), max_record_bytes)
    raise ValueError(f"SplitType must be one of None, {', '.join(SPLIT_TYPES)}.")


async def _each(batches: AsyncIterator[list[bytes]]) -> AsyncIterator[bytes]:
    async for batch in batches:
        for record in batch:
            yield record


async def _lines(chunks: AsyncIterator[bytes], cap: int) -> AsyncIterator[list[bytes]]:
    carry = bytearray()
    index = 0
    async for chunk in chunks:
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            carry += chunk
            # +1: the line's "\r" may still be in the carry, waiting for its "\n".
            if len(carry) > cap + 1:
                raise RecordTooLarge(index, len(carry), cap, at_least=True)
            continue
        carry += pieces[0]
        pieces[0] = bytes(carry)
        carry = bytearray(pieces.pop())
        # Whole-list steps in C where the chunk allows (no "\r", no empty line, none too
        # long); the same per line otherwise.
        if b"\r" in chunk or pieces[0].endswith(b"\r"):
            pieces = [line[:-1] if line.endswith(b"\r") else line for line in pieces]
        if not all(pieces):
            pieces = [line for line in pieces if line]
        if pieces:
            if max(map(len, pieces)) > cap:
                at = next(n for n, line in enumerate(pieces) if len(line) > cap)
                if at:
                    yield pieces[:at]
                raise RecordTooLarge(index + at, len(pieces[at]), cap)
            index += len(pieces)
            yield pieces
        if len(carry) > cap + 1:
            raise RecordTooLarge(index, len(carry), cap, at_least=True)
    last = bytes(carry[:-1] if carry.endswith(b"\r") else carry)
    if len(last) > cap:
        raise RecordTooLarge(index, len(last), cap)
    if last:
        yield [last]


class _Reader:
    """Exact-size reads over a chunk stream, holding only what was asked for plus one chunk."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = aiter(chunks)
        self._buffer = bytearray()
        self._at = 0
        self.offset = 0
        """Offset in the object of the next byte ``read`` returns."""

    async def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer where the object ends."""
        while len(self._buffer) - self._at < size:
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                break
            del self._buffer[: self._at]
            self._at = 0
            self._buffer += chunk
        data = bytes(self._buffer[self._at : self._at + size])
        self._at += len(data)
        self.offset += len(data)
        return data


async def _recordio(reader: _Reader, cap: int) -> AsyncIterator[list[bytes]]:
    index = 0
    while True:
        start = reader.offset
        parts: list[bytes] = []
        size = 0
        cflag = -1
        while cflag not in (0, 3):
            at = reader.offset
            header = await reader.read(_RECORDIO_HEADER.size)
            if not header and not parts:
                return
            if len(header) < _RECORDIO_HEADER.size:
                raise SplitError(f"RecordIO record {index + 1} is truncated at byte {at}.")
            magic, lrecord = _RECORDIO_HEADER.unpack(header)
            if magic != RECORDIO_MAGIC:
                raise SplitError(
                    f"RecordIO record {index + 1} has no magic number at byte {at}: "
                    "the object is not RecordIO, or is corrupt."
                )
            cflag, length = lrecord >> 29, lrecord & _RECORDIO_LENGTH_MASK
            if (cflag in (0, 1)) != (not parts):
                raise SplitError(
                    f"RecordIO record {index + 1} has a part with cflag {cflag} at byte {at}, "
                    "out of sequence (a record is cflag 0, or cflag 1, 2…, 3)."
                )
            padding = -length % 4
            size += _RECORDIO_HEADER.size + length + (padding if cflag in (1, 2) else 0)
            if size > cap:
                raise RecordTooLarge(index, size, cap, at_least=cflag in (1, 2))
            data = await reader.read(length)
            if len(data) < length:
                raise SplitError(
                    f"RecordIO record {index + 1} at byte {start} is truncated: its part at "
                    f"byte {at} says {length} bytes and the object ends after {len(data)}."
                )
            # The last record's padding may be missing at the very end: nothing is lost.
            pad = await reader.read(padding)
            parts += (header, data, pad) if cflag in (1, 2) else (header, data)
        yield [b"".join(parts)]  # one a list: a record may be as large as the limit
        index += 1


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C (the CRC rotated right by 15 bits plus a constant).

    google-crc32c computes the CRC in C with SSE4.2 at gigabytes a second; a pure-Python
    table would take about a minute per gigabyte of TFRecord, on the event loop."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


async def _tfrecords(reader: _Reader, cap: int) -> AsyncIterator[list[bytes]]:
    index = 0
    while True:
        start = reader.offset
        header = await reader.read(_TFRECORD_HEADER.size)
        if not header:
            return
        if len(header) < _TFRECORD_HEADER.size:
            raise SplitError(f"TFRecord record {index + 1} is truncated at byte {start}.")
        length, length_crc = _TFRECORD_HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise SplitError(
                f"TFRecord record {index + 1} at byte {start} has a corrupt length "
                "(its CRC does not match)."
            )
        size = _TFRECORD_HEADER.size + length + _TFRECORD_FOOTER.size
        if size > cap:
            raise RecordTooLarge(index, size, cap)
        rest = await reader.read(length + _TFRECORD_FOOTER.size)
        if len(rest) < length + _TFRECORD_FOOTER.size:
            raise SplitError(
                f"TFRecord record {index + 1} at byte {start} is truncated: it says {length} "
                f"bytes of data and the object ends {len(rest)} bytes after its header."
            )
        (data_crc,) = _TFRECORD_FOOTER.unpack(rest[length:])
        if masked_crc32c(rest[:length]) != data_crc:
            raise SplitError(
                f"TFRecord record {index + 1} at byte {start} is corrupt "
                "(its data CRC does not match)."
            )
        yield [header + rest]
        index += 1
