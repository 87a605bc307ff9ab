"""Packing records into payloads, answers back into lines, and memory on a large object."""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from shipyard.errors import AnswerMismatch, RecordTooLarge, SplitError
from shipyard.transform.batching import Payload, payloads, split_answer
from shipyard.transform.splitting import record_batches, records

from .streams import collect, random_chunks, recordio, tfrecord


async def each(items: list[bytes], seed: int = 0, largest: int = 3) -> AsyncIterator[list[bytes]]:
    """``items`` in lists of one to ``largest``, as ``record_batches`` groups records: how
    they are grouped must change nothing."""
    rng = random.Random(seed)
    at = 0
    while at < len(items):
        size = rng.randint(1, largest)
        yield items[at : at + size]
        at += size


def pack(
    items: list[bytes], strategy: str, limit: int, split_type: str = "Line", largest: int = 3
) -> list:
    packed = [
        collect(payloads(each(items, seed, largest), strategy, limit, split_type))
        for seed in range(3)
    ]
    assert packed[0] == packed[1] == packed[2]
    return packed[0]


def test_single_record_sends_each_record_as_it_is():
    got = pack([b"a", b"bb", b"ccc"], "SingleRecord", 3)
    assert got == [Payload(b"a", 0, 1), Payload(b"bb", 1, 1), Payload(b"ccc", 2, 1)]
    assert repr(got[1]) == "Payload(first_record=1, count=1, bytes=2)"


def test_multi_record_lines_fill_the_limit_exactly():
    nine = [bytes([65 + n]) * 9 for n in range(7)]  # each 10 bytes with its newline
    got = pack(nine, "MultiRecord", 30)
    assert [(p.first_record, p.count) for p in got] == [(0, 3), (3, 3), (6, 1)]
    assert got[0].body == b"AAAAAAAAA\nBBBBBBBBB\nCCCCCCCCC\n"
    assert all(len(p.body) <= 30 for p in got)
    assert [(p.first_record, p.count) for p in pack(nine, "MultiRecord", 29)] == [
        (0, 2),
        (2, 2),
        (4, 2),
        (6, 1),
    ]


def test_multi_record_payloads_of_recordio_and_tfrecord_are_the_object_itself():
    io_object = b"".join(recordio(data) for data in [b"a", b"bcdef", b"", b"1234"])
    io_records = collect(records(random_chunks(io_object, 1), "RecordIO"))
    (payload,) = collect(payloads(each(io_records), "MultiRecord", 1 << 20, "RecordIO"))
    assert payload.body == io_object
    assert payload.count == 4

    tf_object = b"".join(tfrecord(data) for data in [b"a", b"bcdef", b""])
    tf_records = collect(records(random_chunks(tf_object, 2), "TFRecord"))
    (payload,) = collect(payloads(each(tf_records), "MultiRecord", len(tf_object), "TFRecord"))
    assert payload.body == tf_object


def test_recordio_padding_counts_toward_the_limit():
    framed = [recordio(b"abcde")[:-3]] * 3  # 13 bytes each, 16 padded
    got = pack(framed, "MultiRecord", 32, "RecordIO")
    assert [p.count for p in got] == [2, 1]
    assert [len(p.body) for p in got] == [32, 16]
    assert [len(p.body) for p in pack(framed, "SingleRecord", 13, "RecordIO")] == [13] * 3


def test_a_record_larger_than_the_limit_fails_after_the_payload_before_it():
    got: list[Payload] = []

    async def run() -> None:
        async for payload in payloads(
            each([b"ok", b"x" * 50, b"never"]), "MultiRecord", 10, "Line"
        ):
            got.append(payload)

    with pytest.raises(RecordTooLarge, match="Record 2 is 51 bytes") as caught:
        asyncio.run(run())
    assert caught.value.index == 1
    assert got == [Payload(b"ok\n", 0, 1)]
    with pytest.raises(RecordTooLarge, match="Record 3 is 6 bytes"):
        pack([b"a", b"b", b"cccccc"], "SingleRecord", 5)


def test_payloads_refuse_unknown_strategies_and_split_type_none():
    with pytest.raises(ValueError, match="BatchStrategy"):
        payloads(each([]), "AllAtOnce", 10, "Line")
    with pytest.raises(ValueError, match="SplitType"):
        payloads(each([]), "MultiRecord", 10, "None")
    with pytest.raises(ValueError, match="positive"):
        payloads(each([]), "MultiRecord", 0, "Line")


def test_split_answer_gives_one_line_per_record():
    assert split_answer(b"1\n2\n3\n", 3, "Line") == [b"1", b"2", b"3"]
    assert split_answer(b"1\r\n2\r\n3", 3, "RecordIO") == [b"1", b"2", b"3"]
    assert split_answer(b'{"a":\n1}\n', 1, "Line") == [b'{"a":\n1}']


@pytest.mark.parametrize("answer", [b"1\n2\n", b"1\n2\n3\n4\n", b"", b"1,2,3"])
def test_split_answer_with_another_number_of_lines_is_a_mismatch(answer):
    with pytest.raises(AnswerMismatch, match="for a payload of 3 records") as caught:
        split_answer(answer, 3, "Line")
    assert isinstance(caught.value, SplitError)


def test_split_answer_refuses_nonsense_arguments():
    with pytest.raises(ValueError):
        split_answer(b"1", 0, "Line")
    with pytest.raises(ValueError):
        split_answer(b"1", 1, "Lines")


async def _generated_lines(total_bytes: int, chunk_bytes: int) -> AsyncIterator[bytes]:
    """``total_bytes`` of CSV lines, made as they are read; line lengths vary, so records
    straddle chunks."""
    line = b",".join(b"%d.5" % n for n in range(200))  # about 1 KB
    block = bytearray()
    sent = 0
    n = 0
    while sent < total_bytes:
        while len(block) < chunk_bytes:
            block += line[: 700 + n % 300] + b"\n"
            n += 1
        yield bytes(block[:chunk_bytes])
        del block[:chunk_bytes]
        sent += chunk_bytes


def test_a_300_mb_object_streams_through_in_a_few_megabytes():
    """300 MB of lines, made as they are read, through records and 1 MiB MultiRecord
    payloads: the peak is a payload being joined and a chunk or two, about 4 MB."""
    total = 300 * 1024 * 1024

    async def run() -> tuple[int, int]:
        count = size = 0
        stream = record_batches(
            _generated_lines(total, 256 * 1024), "Line", max_record_bytes=1 << 20
        )
        async for payload in payloads(stream, "MultiRecord", 1 << 20, "Line"):
            count += payload.count
            size += len(payload.body)
        return count, size

    tracemalloc.start()
    started = time.monotonic()
    try:
        count, size = asyncio.run(run())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Every byte came out in a payload; the last line, cut short, gained its newline.
    assert size == total + 1
    assert count > 300_000
    assert peak < 6 * 1024 * 1024, f"peak {peak} bytes"
    assert time.monotonic() - started < 60  # a guard against a quadratic copy, not a benchmark


def _one_by_one(
    items: list[bytes], limit: int, split_type: str
) -> tuple[list[Payload], tuple[int, int] | None]:
    """MultiRecord packing written the plain way, a record at a time: what the packer,
    which takes as many records as fit in one slice, must match. The payloads, and the
    (index, size) of a record too large for any payload, which ends the packing after
    the payload before it."""
    end = b"\n" if split_type == "Line" else b""
    out: list[Payload] = []
    pieces: list[bytes] = []
    first = 0
    for index, record in enumerate(items):
        if split_type == "RecordIO":
            record += b"\0" * (-len(record) % 4)
        piece = record + end
        if pieces and sum(map(len, pieces)) + len(piece) > limit:
            out.append(Payload(b"".join(pieces), first, len(pieces)))
            pieces, first = [], index
        if len(piece) > limit:
            return out, (index, len(piece))
        pieces.append(piece)
    if pieces:
        out.append(Payload(b"".join(pieces), first, len(pieces)))
    return out, None


def _packed_until_refused(
    items: list[bytes], limit: int, split_type: str, seed: int
) -> tuple[list[Payload], tuple[int, int] | None]:
    got: list[Payload] = []

    async def run() -> None:
        async for payload in payloads(each(items, seed, 60), "MultiRecord", limit, split_type):
            got.append(payload)

    try:
        asyncio.run(run())
    except RecordTooLarge as exc:
        return got, (exc.index, exc.size)
    return got, None


def _case(seed: int) -> tuple[list[bytes], int, str]:
    rng = random.Random(seed)
    split_type = rng.choice(["Line", "RecordIO", "TFRecord"])
    items = [bytes(rng.randint(1, 40)) for _ in range(rng.randint(1, 200))]
    # A third of the cases with a limit some records do not fit in on their own.
    limit = rng.randint(8, 40) if seed % 3 == 0 else rng.randint(48, 400)
    return items, limit, split_type


@pytest.mark.parametrize("seed", range(60))
def test_multi_record_packing_matches_packing_one_record_at_a_time(seed):
    items, limit, split_type = _case(seed)
    expected = _one_by_one(items, limit, split_type)
    for grouping in range(3):
        assert _packed_until_refused(items, limit, split_type, grouping) == expected


def test_the_packing_cases_include_records_too_large_for_any_payload():
    refused = [s for s in range(60) if _one_by_one(*_case(s))[1] is not None]
    assert len(refused) >= 10, refused
