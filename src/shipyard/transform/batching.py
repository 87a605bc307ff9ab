"""Records into request payloads (BatchStrategy), and MultiRecord answers back into lines.

``SingleRecord`` sends each record as it is. ``MultiRecord`` sends as many consecutive
records as fit in MaxPayloadInMB, put back the way they sat in the object, so a payload is
a piece of a valid object of its SplitType (as the SageMaker Python SDK's local mode does
for lines, and as the API reference says for padding):

- ``Line``: each record followed by ``\\n`` (a ``\\r\\n`` object comes out as ``\\n``);
- ``RecordIO``: each record with its padding to 4 bytes, which ``SingleRecord`` leaves out
  ("padding is not removed if the value of BatchStrategy is set to MultiRecord",
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_TransformInput.html);
- ``TFRecord``: the framed records one after another.

The limit counts those separators and padding; a record that cannot fit in a payload of
its own fails the job with ``RecordTooLarge``. Memory: one payload.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add
from typing import NamedTuple

from shipyard.errors import AnswerMismatch, RecordTooLarge
from shipyard.transform.splitting import SPLIT_TYPES

STRATEGIES = ("SingleRecord", "MultiRecord")


@dataclass(frozen=True, slots=True)
class Payload:
    """One request body and the records it carries: ``first_record`` (0-based index in its
    object) and the ``count`` after it."""

    body: bytes
    first_record: int
    count: int

    def __repr__(self) -> str:
        return (
            f"Payload(first_record={self.first_record}, count={self.count}, bytes={len(self.body)})"
        )


def payloads(
    batches: AsyncIterator[list[bytes]], strategy: str, max_payload_bytes: int, split_type: str
) -> AsyncIterator[Payload]:
    """The records packed into payloads by BatchStrategy, in order, none over the limit.

    ``batches`` are the records a list at a time (``splitting.record_batches``): how they
    are grouped changes nothing here. Raises ``RecordTooLarge`` for a record larger than
    the limit on its own, and ``ValueError`` at once for an unknown strategy or SplitType
    (``None`` is not split, so it has no payloads here: the runner sends the object
    whole)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"BatchStrategy must be one of {', '.join(STRATEGIES)}.")
    if split_type not in SPLIT_TYPES:
        raise ValueError(f"SplitType must be one of {', '.join(SPLIT_TYPES)}.")
    if max_payload_bytes < 1:
        raise ValueError("max_payload_bytes must be positive.")
    if strategy == "SingleRecord":
        return _single(batches, max_payload_bytes)
    return _multi(batches, max_payload_bytes, _FRAMES[split_type])


async def _single(batches: AsyncIterator[list[bytes]], limit: int) -> AsyncIterator[Payload]:
    index = 0
    async for batch in batches:
        for record in batch:
            if len(record) > limit:
                raise RecordTooLarge(index, len(record), limit)
            yield Payload(record, index, 1)
            index += 1


class _Framing(NamedTuple):
    """How records sit one after another in a payload: each one ``pad``-ded (None: as it
    is) and followed by ``end``."""

    pad: Callable[[bytes], bytes] | None
    end: bytes


def _padded(record: bytes) -> bytes:
    return record + b"\0" * (-len(record) % 4)


_FRAMES: dict[str, _Framing] = {
    "Line": _Framing(None, b"\n"),
    "RecordIO": _Framing(_padded, b""),
    "TFRecord": _Framing(None, b""),
}


async def _multi(
    batches: AsyncIterator[list[bytes]], limit: int, framing: _Framing
) -> AsyncIterator[Payload]:
    pad, end = framing
    extra = len(end)
    pieces: list[bytes] = []
    size = 0
    first = 0
    index = 0
    async for batch in batches:
        framed = batch if pad is None else [pad(record) for record in batch]
        # cum[n]: the bytes the first n records of the batch take with their ends, summed
        # in C: the records that fit are found by bisection and taken as one slice, not
        # looked at one by one (a payload of short lines holds tens of thousands).
        cum = list(accumulate(map(add, map(len, framed), repeat(extra)), initial=0))
        at = 0
        while at < len(framed):
            fit = bisect_right(cum, cum[at] + limit - size, lo=at) - 1
            if fit > at:
                pieces += framed[at:fit]
                size += cum[fit] - cum[at]
                index += fit - at
                at = fit
                if at == len(framed):
                    break
            # framed[at] does not fit in what is left of this payload.
            if pieces:
                pieces.append(b"")  # the last record's end too, joined in one copy
                yield Payload(end.join(pieces), first, len(pieces) - 1)
                pieces, size, first = [], 0, index
            length = cum[at + 1] - cum[at]
            if length > limit:
                raise RecordTooLarge(index, length, limit)
    if pieces:
        pieces.append(b"")
        yield Payload(end.join(pieces), first, len(pieces) - 1)


def split_answer(body: bytes, count: int, split_type: str) -> list[bytes]:
    """One answer line per record of a payload, for ``AssembleWith: Line``.

    The runner needs one output record per input record to join and filter them. A
    MultiRecord answer must carry ``count`` lines (a final newline is optional, ``\\r\\n``
    is accepted); any other number raises ``AnswerMismatch``. A one-record answer is that
    record's output whole. The answer is read as lines whatever the input's SplitType:
    DataProcessing reads only JSON and CSV, which come back as lines."""
    if split_type not in (*SPLIT_TYPES, "None"):
        raise ValueError(f"SplitType must be one of None, {', '.join(SPLIT_TYPES)}.")
    if count < 1:
        raise ValueError("count must be positive.")
    text = body[:-1] if body.endswith(b"\n") else body
    if count == 1:
        return [text.removesuffix(b"\r")]
    lines = [line.removesuffix(b"\r") for line in text.split(b"\n")]
    if len(lines) != count:
        raise AnswerMismatch(
            f"The model answered {len(lines)} lines for a payload of {count} records; with "
            "BatchStrategy MultiRecord and AssembleWith Line it must answer one line per "
            "record."
        )
    return lines
