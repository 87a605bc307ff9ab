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

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

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
    records: AsyncIterator[bytes], strategy: str, max_payload_bytes: int, split_type: str
) -> AsyncIterator[Payload]:
    """The records packed into payloads by BatchStrategy, in order, none over the limit.

    Raises ``RecordTooLarge`` for a record larger than the limit on its own, and
    ``ValueError`` at once for an unknown strategy or SplitType (``None`` is not split, so
    it has no payloads here: the runner sends the object whole)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"BatchStrategy must be one of {', '.join(STRATEGIES)}.")
    if split_type not in SPLIT_TYPES:
        raise ValueError(f"SplitType must be one of {', '.join(SPLIT_TYPES)}.")
    if max_payload_bytes < 1:
        raise ValueError("max_payload_bytes must be positive.")
    if strategy == "SingleRecord":
        return _single(records, max_payload_bytes)
    return _multi(records, max_payload_bytes, _FRAMES[split_type])


async def _single(records: AsyncIterator[bytes], limit: int) -> AsyncIterator[Payload]:
    index = 0
    async for record in records:
        if len(record) > limit:
            raise RecordTooLarge(index, len(record), limit)
        yield Payload(record, index, 1)
        index += 1


def _line(record: bytes) -> bytes:
    return record + b"\n"


def _padded(record: bytes) -> bytes:
    return record + b"\0" * (-len(record) % 4)


def _as_is(record: bytes) -> bytes:
    return record


_FRAMES: dict[str, Callable[[bytes], bytes]] = {
    "Line": _line,
    "RecordIO": _padded,
    "TFRecord": _as_is,
}


async def _multi(
    records: AsyncIterator[bytes], limit: int, frame: Callable[[bytes], bytes]
) -> AsyncIterator[Payload]:
    pieces: list[bytes] = []
    size = 0
    first = 0
    index = 0
    async for record in records:
        piece = frame(record)
        if size + len(piece) > limit:
            if pieces:
                yield Payload(b"".join(pieces), first, len(pieces))
                pieces, size, first = [], 0, index
            if len(piece) > limit:
                raise RecordTooLarge(index, len(piece), limit)
        pieces.append(piece)
        size += len(piece)
        index += 1
    if pieces:
        yield Payload(b"".join(pieces), first, len(pieces))


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
