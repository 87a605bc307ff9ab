"""Splitting objects into records: every format cut at every byte, and how each fails."""

from __future__ import annotations

import asyncio
import gzip
import os
import struct
from collections.abc import AsyncIterator

import pytest

from shipyard.errors import RecordTooLarge, SplitError
from shipyard.transform.splitting import decompress, masked_crc32c, record_batches, records

from .streams import (
    MAGIC,
    chunked,
    collect,
    random_chunks,
    recordio,
    recordio_data,
    recordio_parts,
    split_at,
    tfrecord,
)

LINES = b"a,1\r\n\nbb,2\n\r\nccc,3\n\n\nlast,4"
LINE_RECORDS = [b"a,1", b"bb,2", b"ccc,3", b"last,4"]

MAGIC_BYTES = struct.pack("<I", MAGIC)
RECORDIO_DATA = [b"x", b"", b"abcd", MAGIC_BYTES + b"1234" + MAGIC_BYTES + b"tail!", b"\x00" * 7]
TFRECORD_DATA = [b"first", b"", b"\xff" * 13, b"last record"]


def split(data: bytes, split_type: str, stream: AsyncIterator[bytes] | None = None) -> list:
    return collect(records(stream or chunked(data, [len(data)]), split_type))


@pytest.mark.parametrize("offset", range(len(LINES) + 1))
def test_lines_cut_at_any_byte_are_the_same_records(offset):
    assert collect(records(split_at(LINES, offset), "Line")) == LINE_RECORDS


@pytest.mark.parametrize("seed", range(20))
def test_lines_in_random_chunks_are_the_same_records(seed):
    assert collect(records(random_chunks(LINES, seed, largest=5), "Line")) == LINE_RECORDS


def test_a_final_newline_adds_no_record_and_empty_objects_have_none():
    assert split(b"a\nb\n", "Line") == [b"a", b"b"]
    assert split(b"a\r\n", "Line") == [b"a"]
    assert split(b"", "Line") == []
    assert split(b"\n\r\n\n", "Line") == []


def test_whitespace_lines_are_records_only_empty_ones_are_skipped():
    assert split(b" \n\t\n", "Line") == [b" ", b"\t"]


def test_recordio_writer_splits_data_that_holds_the_magic_into_parts():
    assert len(recordio_parts(RECORDIO_DATA[3])) == 3


RECORDIO_OBJECT = b"".join(recordio(data) for data in RECORDIO_DATA)


@pytest.mark.parametrize("offset", range(len(RECORDIO_OBJECT) + 1))
def test_recordio_cut_at_any_byte_gives_framed_records_without_padding(offset):
    got = collect(records(split_at(RECORDIO_OBJECT, offset), "RecordIO"))
    assert [recordio_data(record) for record in got] == RECORDIO_DATA
    for record, data in zip(got, RECORDIO_DATA, strict=True):
        framed = recordio(data)
        assert record == framed[: len(framed) - (-len(recordio_parts(data)[-1]) % 4)]


@pytest.mark.parametrize("seed", range(20))
def test_recordio_in_random_chunks(seed):
    stream = random_chunks(RECORDIO_OBJECT, seed, largest=11)
    got = collect(records(stream, "RecordIO"))
    assert [recordio_data(record) for record in got] == RECORDIO_DATA


def test_recordio_multipart_record_keeps_every_part_with_its_header():
    (record,) = split(recordio(RECORDIO_DATA[3]), "RecordIO")
    flags = []
    at = 0
    while at < len(record):
        magic, lrecord = struct.unpack_from("<II", record, at)
        assert magic == MAGIC
        flags.append(lrecord >> 29)
        length = lrecord & ((1 << 29) - 1)
        at += 8 + length + (-length % 4)
    assert flags == [1, 2, 3]


def test_recordio_last_record_may_miss_its_padding():
    unpadded = recordio(b"abcde")[:-3]
    assert split(unpadded, "RecordIO") == [unpadded]


def test_recordio_without_magic_names_the_offset():
    broken = recordio(b"abcd") + b"\x01\x02\x03\x04" + recordio(b"x")[4:]
    with pytest.raises(SplitError, match="record 2 has no magic number at byte 12"):
        split(broken, "RecordIO")


def test_recordio_parts_out_of_sequence_are_corrupt():
    parts = recordio(MAGIC_BYTES + b"zz")  # cflag 1 then 3
    alone_end = parts[8:]  # starts at the cflag-3 part
    with pytest.raises(SplitError, match="cflag 3 at byte 0, out of sequence"):
        split(alone_end, "RecordIO")
    two_starts = parts[:8] + parts
    with pytest.raises(SplitError, match="cflag 1 at byte 8, out of sequence"):
        split(two_starts, "RecordIO")


@pytest.mark.parametrize("cut", [3, 8, 12, 15])
def test_truncated_recordio_names_the_offset(cut):
    whole = recordio(b"a" * 8) + recordio(b"b" * 8)
    with pytest.raises(SplitError, match=r"record 2 .*truncated.*byte 16"):
        split(whole[: 16 + cut], "RecordIO")


TFRECORD_OBJECT = b"".join(tfrecord(data) for data in TFRECORD_DATA)


@pytest.mark.parametrize("offset", range(len(TFRECORD_OBJECT) + 1))
def test_tfrecord_cut_at_any_byte_gives_framed_records(offset):
    got = collect(records(split_at(TFRECORD_OBJECT, offset), "TFRecord"))
    assert got == [tfrecord(data) for data in TFRECORD_DATA]


@pytest.mark.parametrize("seed", range(20))
def test_tfrecord_in_random_chunks(seed):
    got = collect(records(random_chunks(TFRECORD_OBJECT, seed), "TFRecord"))
    assert got == [tfrecord(data) for data in TFRECORD_DATA]


def _crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_masked_crc32c_matches_the_definition():
    assert _crc32c_bitwise(b"123456789") == 0xE3069283
    for data in (b"", b"123456789", os.urandom(100)):
        crc = _crc32c_bitwise(data)
        assert masked_crc32c(data) == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_tfrecord_with_a_wrong_data_crc_is_corrupt():
    bad = bytearray(TFRECORD_OBJECT)
    second = len(tfrecord(TFRECORD_DATA[0]))
    bad[second + len(tfrecord(b"")) - 1] ^= 0xFF  # the second record's data CRC
    with pytest.raises(SplitError, match=f"record 2 at byte {second} is corrupt"):
        split(bytes(bad), "TFRecord")


def test_tfrecord_with_a_wrong_length_crc_is_corrupt():
    bad = bytearray(TFRECORD_OBJECT)
    bad[0] ^= 0x01  # the length no longer matches its CRC
    with pytest.raises(SplitError, match="record 1 at byte 0 has a corrupt length"):
        split(bytes(bad), "TFRecord")


@pytest.mark.parametrize("cut", [1, 11, 12, 20])
def test_truncated_tfrecord_names_the_offset(cut):
    first = tfrecord(b"0123456789")
    with pytest.raises(SplitError, match="record 2 .*truncated") as caught:
        split(first + tfrecord(b"abcdefgh")[:cut], "TFRecord")
    assert f"byte {len(first)}" in str(caught.value)


class _Endless:
    """An object that never ends, counting the bytes handed out."""

    def __init__(self, chunk: bytes) -> None:
        self.chunk = chunk
        self.given = 0

    async def stream(self) -> AsyncIterator[bytes]:
        while True:
            self.given += len(self.chunk)
            yield self.chunk


def test_a_line_over_the_cap_fails_without_reading_much_past_it():
    source = _Endless(b"x" * 1000)
    with pytest.raises(RecordTooLarge, match="Record 1 is at least") as caught:
        collect(records(source.stream(), "Line", max_record_bytes=50_000))
    assert caught.value.index == 0
    assert source.given <= 50_000 + 2 * 1000


def test_a_line_at_the_cap_is_a_record_and_one_byte_more_is_not():
    body = b"a\n" + b"y" * 100
    assert split(body + b"\r\n", "Line") == [b"a", b"y" * 100]
    assert collect(records(split_at(body + b"\r\nz", 50), "Line", max_record_bytes=100))[1:] == [
        b"y" * 100,
        b"z",
    ]
    with pytest.raises(RecordTooLarge) as caught:
        collect(records(split_at(body + b"y\n", 50), "Line", max_record_bytes=100))
    assert (caught.value.index, caught.value.size) == (1, 101)


@pytest.mark.parametrize(
    ("split_type", "header"),
    [
        ("RecordIO", struct.pack("<II", MAGIC, 10_000_000)),
        ("TFRecord", tfrecord(b"x" * 10_000_000)[:12]),
    ],
)
def test_a_binary_record_over_the_cap_fails_on_its_header(split_type, header):
    source = _Endless(header + b"\0" * 52)
    with pytest.raises(RecordTooLarge, match="Record 1 is"):
        collect(records(source.stream(), split_type, max_record_bytes=1_000_000))
    assert source.given == len(header) + 52


def test_records_refuses_split_type_none_and_unknown_types_at_once():
    with pytest.raises(ValueError, match="whole as one request body"):
        records(chunked(b"", []), "None")
    with pytest.raises(ValueError, match="SplitType must be one of"):
        records(chunked(b"", []), "Json")


# -- decompression ----------------------------------------------------------------------------


def gunzip(data: bytes, chunk: int = 7) -> bytes:
    return b"".join(collect(decompress(chunked(data, iter(lambda: chunk, None)), "Gzip")))


@pytest.mark.parametrize("chunk", [1, 3, 64, 100_000])
def test_gzip_members_concatenated_are_one_stream(chunk):
    data = gzip.compress(LINES) + gzip.compress(b"") + gzip.compress(b"\nmore\n") + b"\0" * 9
    assert gunzip(data, chunk) == LINES + b"\nmore\n"


def test_gzip_then_lines_at_every_cut():
    data = gzip.compress(LINES)
    for offset in range(len(data) + 1):
        assert collect(records(decompress(split_at(data, offset), "Gzip"), "Line")) == LINE_RECORDS


def test_gzip_output_comes_in_bounded_steps():
    bomb = gzip.compress(b"\0" * 20_000_000)
    steps = collect(decompress(chunked(bomb, [len(bomb)]), "Gzip"))
    assert sum(map(len, steps)) == 20_000_000
    assert max(map(len, steps)) <= 256 * 1024


def test_corrupt_gzip_is_a_split_error():
    data = bytearray(gzip.compress(os.urandom(5000)))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(SplitError, match="Gzip stream is corrupt"):
        gunzip(bytes(data))


def test_a_stream_that_is_not_gzip_is_refused():
    with pytest.raises(SplitError, match="corrupt near compressed byte 0"):
        gunzip(b"plain text, not gzip")


def test_truncated_gzip_is_a_split_error():
    data = gzip.compress(LINES * 10)
    with pytest.raises(SplitError, match="ends in the middle of a member"):
        gunzip(data[:-5])


def test_no_compression_passes_chunks_through_and_unknown_is_refused():
    chunks = collect(decompress(chunked(b"abcdef", [2, 2]), "None"))
    assert chunks == [b"ab", b"cd", b"ef"]
    with pytest.raises(ValueError, match="CompressionType"):
        decompress(chunked(b"", []), "Zstd")


def test_records_run_on_a_running_event_loop():
    async def main() -> list[bytes]:
        return [r async for r in records(decompress(split_at(LINES, 3), "None"), "Line")]

    assert asyncio.run(main()) == LINE_RECORDS


def test_a_long_last_line_or_a_long_line_inside_one_chunk_is_too_large():
    with pytest.raises(RecordTooLarge, match="Record 2 is 11 bytes"):
        collect(records(chunked(b"a\n" + b"z" * 11, [2, 11]), "Line", max_record_bytes=10))
    with pytest.raises(RecordTooLarge, match="Record 2 is at least 20 bytes"):
        collect(records(chunked(b"a\n" + b"z" * 20, [22]), "Line", max_record_bytes=10))
    with pytest.raises(ValueError, match="positive"):
        records(chunked(b"", []), "Line", max_record_bytes=0)


def test_record_batches_are_the_lines_each_chunk_completes():
    got = collect(record_batches(chunked(b"a\nb\r\n\nc", [5, 3]), "Line"))
    assert got == [[b"a", b"b"], [b"c"]]
    for offset in range(len(LINES) + 1):
        batches = collect(record_batches(split_at(LINES, offset), "Line"))
        assert [record for batch in batches for record in batch] == LINE_RECORDS
        assert all(batches)
    (framed,) = collect(record_batches(chunked(tfrecord(b"x"), [100]), "TFRecord"))
    assert framed == [tfrecord(b"x")]


def test_the_lines_before_a_long_one_in_the_same_chunk_come_first():
    got: list[bytes] = []

    async def main() -> None:
        chunk = b"a\n\nb\r\n" + b"z" * 11 + b"\nnever\n"
        async for record in records(chunked(chunk, [len(chunk)]), "Line", max_record_bytes=10):
            got.append(record)

    with pytest.raises(RecordTooLarge, match="Record 3 is 11 bytes") as caught:
        asyncio.run(main())
    assert got == [b"a", b"b"]
    assert caught.value.index == 2
