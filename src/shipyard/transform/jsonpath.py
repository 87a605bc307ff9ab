"""DataProcessing for batch transform: InputFilter, JoinSource and OutputFilter per record.

Semantics, from https://docs.aws.amazon.com/sagemaker/latest/dg/batch-transform-data-processing.html
and the API reference's ``DataProcessing``:

1. ``InputFilter`` picks the part of each input record sent to the model.
2. ``JoinSource: Input`` joins each output record to its *original* input record, as read
   from the object, before InputFilter: a JSON object gets the output under a
   ``SageMakerOutput`` key (overwriting one it had, as the docs warn); any other JSON
   (array, string, number) becomes ``{"SageMakerInput": input, "SageMakerOutput":
   output}``; a CSV line gets the output's columns appended (``1,2,3`` and ``1`` give
   ``1,2,3,1``).
3. ``OutputFilter`` picks the part of the *joined* record (or of the output, without a
   join) that is written.

Records are JSON (``application/json``, ``application/jsonlines``) or CSV (``text/csv``);
without a content type, a record starting with ``{`` or ``[`` is JSON and any other is
CSV. A CSV line is taken as a JSON array of its columns (RFC 4180), so only index filters
apply to it, and a filtered CSV line is written back as CSV.

The JSONPath subset (the docs' table of operators) and how it reads:

- ``$`` the record; ``.name`` or ``['name']`` a key (its value); ``['a','b']`` an object
  of just those keys (keys a record lacks are left out); ``.*`` or ``[*]`` every value;
- ``[n]`` an element (``-1`` the last); ``[n,m,…]`` the elements, in that order;
  ``[start:end]`` a slice whose end is *included*: the docs say ``$[1:4]`` is "the second
  through fifth columns" and ``[:5]`` runs through the sixth (Jayway's JsonPath, which
  the docs link, would stop before ``end``); a missing start or end is the first or last
  element; one slice may sit in a union (``$[0,5:]``), two are refused as SageMaker
  refuses ``$[0:2,246:]``;
- after a union, slice or wildcard, later steps apply to each element selected.

A key or index that is not there is an error: the docs say so for indexes outside the
joined record, and a silent null would write a wrong output. Refused when compiling:
``..``, filters ``?()``, scripts, ``@``, slice steps, anything else not above. Unlike
SageMaker, names may hold ``_`` (SageMaker refuses ``$.account_id``, aws/aws-sdk#184).

A JSONPath library is more than this needs: the libraries implement the full language
(recursive descent, filters, exclusive slices), which we would have to refuse or undo.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from shipyard.errors import FilterError

_SUBSET = "$, .name, ['name'(,'name')], [n(,n)], [start:end], *"


@dataclass(frozen=True, slots=True)
class _Key:
    name: str


@dataclass(frozen=True, slots=True)
class _Keys:
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Index:
    index: int


@dataclass(frozen=True, slots=True)
class _Slice:
    start: int | None
    end: int | None


@dataclass(frozen=True, slots=True)
class _Union:
    items: tuple[int | _Slice, ...]


@dataclass(frozen=True, slots=True)
class _Wildcard:
    pass


_Segment = _Key | _Keys | _Index | _Union | _Wildcard


@dataclass(frozen=True, slots=True)
class Filter:
    """A compiled InputFilter or OutputFilter; ``select`` applies it to a parsed record."""

    expression: str
    segments: tuple[_Segment, ...]

    def __repr__(self) -> str:
        return f"Filter({self.expression!r})"

    @property
    def uses_names(self) -> bool:
        """Whether it selects keys, which a CSV line (an array) does not have."""
        return any(isinstance(s, _Key | _Keys) for s in self.segments)

    def select(self, value: Any) -> Any:
        """The part of ``value`` the expression selects; raises ``FilterError``."""
        many = False
        for segment in self.segments:
            if many:
                selected: list[Any] = []
                for item in value:
                    result, spread = self._step(segment, item)
                    if spread:
                        selected.extend(result)
                    else:
                        selected.append(result)
                value = selected
            else:
                value, many = self._step(segment, value)
        return value

    def _step(self, segment: _Segment, value: Any) -> tuple[Any, bool]:
        """One segment applied to one value; whether the result is several values."""
        if isinstance(segment, _Key):
            found = self._object(value)
            if segment.name not in found:
                raise self._fail(f"the record has no key {segment.name!r}")
            return found[segment.name], False
        if isinstance(segment, _Keys):
            found = self._object(value)
            return {name: found[name] for name in segment.names if name in found}, False
        if isinstance(segment, _Wildcard):
            if isinstance(value, dict):
                return list(value.values()), True
            return list(self._array(value)), True
        array = self._array(value)
        if isinstance(segment, _Index):
            return array[self._within(array, segment.index)], False
        selected: list[Any] = []
        for item in segment.items:
            if isinstance(item, _Slice):
                selected.extend(_sliced(array, item))
            else:
                selected.append(array[self._within(array, item)])
        return selected, True

    def _fail(self, problem: str) -> FilterError:
        return FilterError(f"JSONPath {self.expression}: {problem}.")

    def _object(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self._fail(f"a key is asked of a {_kind_of(value)}")
        return value

    def _array(self, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self._fail(f"an index is asked of a {_kind_of(value)}")
        return value

    def _within(self, array: list[Any], index: int) -> int:
        if not -len(array) <= index < len(array):
            raise self._fail(f"index {index} is outside an array of {len(array)}")
        return index


def _sliced(array: list[Any], part: _Slice) -> list[Any]:
    """SageMaker's slice: ``end`` included, both ends clamped to the array."""
    size = len(array)
    start = 0 if part.start is None else part.start + size if part.start < 0 else part.start
    end = size - 1 if part.end is None else part.end + size if part.end < 0 else part.end
    return array[max(start, 0) : max(end + 1, 0)]


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "JSON object"
    if isinstance(value, list):
        return "JSON array"
    return "JSON " + ("null" if value is None else type(value).__name__)


def compile_filter(expression: str, *, content_type: str | None = None) -> Filter:
    """An InputFilter or OutputFilter, checked against SageMaker's JSONPath subset.

    Raises ``ValueError`` saying what is outside the subset and where; CreateTransformJob
    answers it as a ValidationException. With ``content_type`` ``text/csv``, filters that
    select keys are refused too: a CSV line has only columns."""
    segments = tuple(_Parser(expression).parse())
    filt = Filter(expression, segments)
    if filt.uses_names and _media(content_type) == "text/csv":
        raise ValueError(
            f"JSONPath {expression!r} selects keys, but text/csv records are arrays of "
            "columns: use indexes such as $[0] or $[1:]."
        )
    return filt


class _Parser:
    """Recursive descent over the subset; every refusal names the character it stopped at."""

    def __init__(self, expression: str) -> None:
        self.text = expression
        self.at = 0

    def fail(self, problem: str) -> ValueError:
        return ValueError(
            f"JSONPath {self.text!r} is outside SageMaker's subset ({_SUBSET}): {problem} "
            f"at character {self.at + 1}."
        )

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def parse(self) -> list[_Segment]:
        if not self.text.startswith("$"):
            raise self.fail("it must start with $")
        self.at = 1
        segments: list[_Segment] = []
        while self.at < len(self.text):
            char = self.peek()
            if char == ".":
                if self.text.startswith("..", self.at):
                    raise self.fail("recursive descent (..) is not supported")
                self.at += 1
                if self.peek() == "[":
                    continue  # "$.a.['b','c']" is in the docs
                if self.peek() == "*":
                    self.at += 1
                    segments.append(_Wildcard())
                else:
                    segments.append(_Key(self.name()))
            elif char == "[":
                self.at += 1
                segments.append(self.bracket())
            else:
                raise self.fail(f"unexpected {char!r}")
        return segments

    def name(self) -> str:
        start = self.at
        while self.peek() and (self.peek().isalnum() or self.peek() in "_-"):
            self.at += 1
        if self.at == start:
            found = repr(self.peek()) if self.peek() else "the end"
            raise self.fail(f"a name is expected after '.', not {found}")
        return self.text[start : self.at]

    def spaces(self) -> None:
        while self.peek() == " ":
            self.at += 1

    def close(self) -> None:
        self.spaces()
        if self.peek() != "]":
            found = repr(self.peek()) if self.peek() else "the end"
            raise self.fail(f"']' is expected, not {found}")
        self.at += 1

    def bracket(self) -> _Segment:
        self.spaces()
        char = self.peek()
        if char == "*":
            self.at += 1
            self.close()
            return _Wildcard()
        if char in ("'", '"'):
            names = [self.quoted()]
            while self.comma():
                names.append(self.quoted())
            self.close()
            return _Key(names[0]) if len(names) == 1 else _Keys(tuple(names))
        if char in ("?", "(", "@"):
            raise self.fail("filter and script expressions are not supported")
        items = [self.item()]
        while self.comma():
            items.append(self.item())
        self.close()
        if sum(isinstance(item, _Slice) for item in items) > 1:
            raise self.fail("only one range [start:end] may be in a bracket")
        if len(items) == 1 and isinstance(items[0], int):
            return _Index(items[0])
        return _Union(tuple(items))

    def comma(self) -> bool:
        self.spaces()
        if self.peek() != ",":
            return False
        self.at += 1
        self.spaces()
        return True

    def quoted(self) -> str:
        quote = self.peek()
        if quote not in ("'", '"'):
            raise self.fail("a quoted name is expected")
        self.at += 1
        chars: list[str] = []
        while self.peek() != quote:
            if not self.peek():
                raise self.fail("a quoted name is not closed")
            if self.peek() == "\\":
                self.at += 1
                if not self.peek():
                    raise self.fail("a quoted name is not closed")
            chars.append(self.peek())
            self.at += 1
        self.at += 1
        return "".join(chars)

    def item(self) -> int | _Slice:
        start = self.integer()
        if self.peek() != ":":
            if start is None:
                found = repr(self.peek()) if self.peek() else "the end"
                raise self.fail(f"an index, a range or a quoted name is expected, not {found}")
            return start
        self.at += 1
        end = self.integer()
        if self.peek() == ":":
            raise self.fail("slice steps ([start:end:step]) are not supported")
        return _Slice(start, end)

    def integer(self) -> int | None:
        start = self.at
        if self.peek() == "-":
            self.at += 1
        while self.peek().isdigit() and self.peek().isascii():
            self.at += 1
        if self.at == start:
            return None
        if self.text[start : self.at] == "-":
            raise self.fail("a number is expected after '-'")
        return int(self.text[start : self.at])


# -- records -------------------------------------------------------------------------------


def apply_input_filter(record: bytes, filt: Filter, content_type: str | None) -> bytes:
    """The part of an input record InputFilter sends to the model, in the record's format."""
    return _apply(record, filt, content_type)


def apply_output_filter(joined: bytes, filt: Filter, content_type: str | None) -> bytes:
    """The part of a joined record (or of an output record, without a join) OutputFilter
    writes. ``content_type`` is the joined record's: the job's Accept, which the docs
    require to be of the same family (CSV or JSON) as its ContentType."""
    return _apply(joined, filt, content_type)


def _apply(record: bytes, filt: Filter, content_type: str | None) -> bytes:
    if not filt.segments:
        return record
    if _is_csv(content_type, record):
        if filt.uses_names:
            raise FilterError(
                f"JSONPath {filt.expression} selects keys, but a CSV record has only columns."
            )
        return _csv_line(filt.select(_csv_row(record)))
    return _json_text(filt.select(_json(record)))


def join_input(
    input_record: bytes, output_record: bytes, content_type: str | None, accept: str | None
) -> bytes:
    """JoinSource Input: the original input record joined with its output record.

    The result has the input's format (``content_type``). The output is read by ``accept``:
    joined to JSON, a JSON answer is its value and a CSV answer its columns (one column
    alone, a number when it reads as one); joined to CSV, a JSON array answer gives its
    items as columns and any other JSON answer one column."""
    output = output_record.rstrip(b"\r\n")
    if _is_csv(content_type, input_record):
        if not _is_csv(accept, output):
            value = _json(output)
            output = _csv_line(value if isinstance(value, list) else [value])
        return input_record + b"," + output if input_record else output
    source = _json(input_record)
    answer = _answer(output, accept)
    if isinstance(source, dict):
        return _json_text({**source, "SageMakerOutput": answer})
    return _json_text({"SageMakerInput": source, "SageMakerOutput": answer})


def _answer(output: bytes, accept: str | None) -> Any:
    if not _is_csv(accept, output):
        return _json(output)
    cells = [_scalar(cell) for cell in _csv_row(output)]
    return cells[0] if len(cells) == 1 else cells


def _scalar(cell: str) -> Any:
    try:
        number = json.loads(cell)
    except (ValueError, RecursionError):
        return cell
    return number if isinstance(number, int | float) and not isinstance(number, bool) else cell


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_csv(content_type: str | None, record: bytes) -> bool:
    media = _media(content_type)
    if media == "text/csv":
        return True
    if "json" in media:
        return False
    return record.lstrip()[:1] not in (b"{", b"[")


def _json(record: bytes) -> Any:
    try:
        return json.loads(record)
    except (ValueError, RecursionError) as exc:
        raise FilterError(f"A record is not JSON: {exc}.") from exc


def _json_text(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# A record is at most MaxPayloadInMB (the runner cuts it so): csv's own limit on a field,
# 128 KiB, would fail a valid record. The setting is the process's; this only raises it.
csv.field_size_limit(2**31 - 1)


def _csv_row(record: bytes) -> list[Any]:
    try:
        text = record.decode()
    except UnicodeDecodeError as exc:
        raise FilterError(f"A CSV record is not UTF-8: {exc}.") from exc
    try:
        rows = list(csv.reader([text]))
    except csv.Error as exc:
        raise FilterError(f"A CSV record does not parse: {exc}.") from exc
    return list(rows[0]) if rows else []


def _csv_line(value: Any) -> bytes:
    cells = value if isinstance(value, list) else [value]
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow(
        cell if isinstance(cell, str) else _json_text(cell).decode() for cell in cells
    )
    return line.getvalue().encode()
