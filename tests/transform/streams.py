"""Helpers for the transform tests: chunk streams and RecordIO/TFRecord writers."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import AsyncIterator, Iterable
from typing import Any

import google_crc32c

MAGIC = 0xCED7230A


async def chunked(data: bytes, sizes: Iterable[int]) -> AsyncIterator[bytes]:
    """``data`` cut into chunks of the given sizes (the last takes the rest)."""
    at = 0
    for size in sizes:
        if at >= len(data):
            return
        yield data[at : at + size]
        at += size
    if at < len(data):
        yield data[at:]


def split_at(data: bytes, offset: int) -> AsyncIterator[bytes]:
    """Two chunks, cut at ``offset``."""
    return chunked(data, [offset])


def random_chunks(data: bytes, seed: int, largest: int = 17) -> AsyncIterator[bytes]:
    rng = random.Random(seed)
    return chunked(data, iter(lambda: rng.randint(1, largest), None))


def collect(stream: AsyncIterator[Any]) -> list[Any]:
    async def run() -> list[Any]:
        return [item async for item in stream]

    return asyncio.run(run())


def recordio_parts(data: bytes) -> list[bytes]:
    """dmlc's RecordIOWriter: the data split where it holds the magic at 4-byte offsets."""
    magic = struct.pack("<I", MAGIC)
    parts, start = [], 0
    for at in range(0, len(data) - 3, 4):
        if data[at : at + 4] == magic:
            parts.append(data[start:at])
            start = at + 4
    parts.append(data[start:])
    return parts


def recordio(data: bytes) -> bytes:
    """One RecordIO record as written to a file, padding included."""
    parts = recordio_parts(data)
    out = b""
    for n, part in enumerate(parts):
        if len(parts) == 1:
            cflag = 0
        else:
            cflag = 1 if n == 0 else 3 if n == len(parts) - 1 else 2
        out += struct.pack("<II", MAGIC, cflag << 29 | len(part)) + part
        out += b"\0" * (-len(part) % 4)
    return out


def recordio_data(record: bytes) -> bytes:
    """dmlc's RecordIOReader: a framed record's data, parts joined by the magic."""
    data, at = [], 0
    while at < len(record):
        _, lrecord = struct.unpack_from("<II", record, at)
        length = lrecord & ((1 << 29) - 1)
        data.append(record[at + 8 : at + 8 + length])
        at += 8 + length + (-length % 4)
    return struct.pack("<I", MAGIC).join(data)


def masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))
