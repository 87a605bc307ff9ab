"""The analyzer's input read into columns: a CSV or JSON Lines dataset, or an endpoint's
captured records (``sagemakerCaptureJson``), as Model Monitor's ``dataset_format``
names them.

Columns are a CSV's header (else ``_c0``, ``_c1``…) or JSON's keys, in the order first
seen. A cell is missing when it is empty, ``null`` (JSON's, or a CSV cell saying so) or
its key is absent. Captured CSV
bodies have no header: their cells map to the baseline's columns by position, the
output's cells first when the output was captured.
"""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

Value = int | float | str | None


@dataclass(slots=True)
class Column:
    """One feature's values, one per item (None where missing)."""

    name: str
    values: list[Value] = field(default_factory=list)
    _counts: tuple[int, int, int] | None = field(default=None, repr=False, compare=False)
    """present, integers, numbers: counted once, after the last value added
    (Dataset.add forgets them)."""

    def _counted(self) -> tuple[int, int, int]:
        if self._counts is None:
            kinds = [type(v) for v in self.values]
            integers = kinds.count(int)
            numbers = integers + kinds.count(float)
            self._counts = (len(kinds) - kinds.count(type(None)), integers, numbers)
        return self._counts

    @property
    def present(self) -> int:
        return self._counted()[0]

    @property
    def integers(self) -> int:
        return self._counted()[1]

    @property
    def numbers(self) -> int:
        return self._counted()[2]

    def floats(self) -> np.ndarray:
        """The present numbers, as one array."""
        return np.fromiter(
            (v for v in self.values if type(v) is int or type(v) is float), dtype=np.float64
        )

    def strings(self) -> list[str]:
        return [str(v) for v in self.values if v is not None]


@dataclass(slots=True)
class Dataset:
    """Columns of equal length ``items``."""

    items: int = 0
    columns: list[Column] = field(default_factory=list)

    def add(self, row: dict[str, Value]) -> None:
        """One item; a column first seen now is missing in every item before it."""
        known = {c.name: c for c in self.columns}
        for name in row:
            if name not in known:
                column = Column(name, [None] * self.items)
                self.columns.append(column)
                known[name] = column
        for column in self.columns:
            column.values.append(row.get(column.name))
            column._counts = None
        self.items += 1


def cell(text: str) -> Value:
    """A CSV cell: an integer, a number, text, or None when empty or ``null``."""
    text = text.strip()
    if not text or text == "null":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if np.isfinite(number) else text


def json_value(value: Any) -> Value:
    if value is None or isinstance(value, str | float):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return value
    return json.dumps(value)


def files(source: Path) -> list[Path]:
    """Every file under ``source`` (or ``source`` itself), in name order."""
    if source.is_file():
        return [source]
    return sorted(p for p in source.rglob("*") if p.is_file())


def read_csv(paths: Iterable[Path], *, header: bool) -> Dataset:
    dataset = Dataset()
    names: list[str] | None = None
    for path in paths:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f)
            if header:
                first = next(rows, None)
                if first is None:
                    continue
                names = names or [n.strip() for n in first]
            for row in rows:
                if not row:
                    continue
                dataset.add(dict(zip(_names(names, len(row)), map(cell, row), strict=True)))
    return dataset


def read_json_lines(paths: Iterable[Path]) -> Dataset:
    dataset = Dataset()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    dataset.add(_row(json.loads(line)))
    return dataset


def read_capture(
    paths: Iterable[Path],
    *,
    names: Sequence[str],
    start: datetime | None,
    end: datetime | None,
) -> Dataset:
    """Captured records whose ``inferenceTime`` lies in [start, end], ends included;
    cells named by ``names`` (the baseline's columns) by position."""
    dataset = Dataset()
    for record in _records(paths):
        if not _within(record, start, end):
            continue
        capture = record.get("captureData") or {}
        for cells in _cells(capture):
            if isinstance(cells, dict):
                dataset.add({str(k): json_value(v) for k, v in cells.items()})
            else:
                dataset.add(dict(zip(_names(names, len(cells)), cells, strict=True)))
    return dataset


def _records(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _within(record: dict[str, Any], start: datetime | None, end: datetime | None) -> bool:
    stamp = (record.get("eventMetadata") or {}).get("inferenceTime")
    if not stamp or (start is None and end is None):
        return start is None and end is None
    at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return (start is None or at >= start) and (end is None or at <= end)


def _cells(capture: dict[str, Any]) -> Iterator[list[Value] | dict[str, Any]]:
    """Each item of a record: its output's cells then its input's, row by row (an
    output of one row per input row), or a JSON object's keys as they are."""
    outputs = _body(capture.get("endpointOutput"))
    inputs = _body(capture.get("endpointInput"))
    if not inputs:
        yield from outputs
        return
    if isinstance(inputs[0], dict):
        yield from inputs
        return
    if len(outputs) != len(inputs):  # one answer for many rows: its cells go first once
        outputs = [[c for row in outputs for c in row]] if len(inputs) == 1 else []
    for i, row in enumerate(inputs):
        yield [*(outputs[i] if outputs else []), *row]


def _body(part: dict[str, Any] | None) -> list[Any]:
    """A captured body's rows: lists of cells (CSV, JSON arrays) or JSON objects."""
    if not part:
        return []
    data = str(part.get("data", ""))
    encoding = str(part.get("encoding", "")).upper()
    kind = str(part.get("observedContentType", "")).split(";", 1)[0].strip().lower()
    if encoding == "BASE64":
        data = base64.b64decode(data).decode("utf-8", errors="replace")
    if encoding == "JSON" or kind.endswith("json"):
        return _json_rows(json.loads(data))
    if '"' not in data:  # no quoting: the common case, split without the csv module
        return [[cell(c) for c in line.split(",")] for line in data.splitlines() if line]
    return [[cell(c) for c in row] for row in csv.reader(io.StringIO(data)) if row]


def _json_rows(value: Any) -> list[Any]:
    if isinstance(value, dict):
        for key in ("instances", "predictions", "outputs", "inputs"):
            if isinstance(value.get(key), list):
                return _json_rows(value[key])
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(v, list) for v in value):
            return [[json_value(c) for c in row] for row in value]
        if value and all(isinstance(v, dict) for v in value):
            return value
        return [[json_value(c) for c in value]]
    return [[json_value(value)]]


def _row(value: Any) -> dict[str, Value]:
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return {f"_c{i}": json_value(v) for i, v in enumerate(value)}
    return {"_c0": json_value(value)}


def _names(names: Sequence[str] | None, count: int) -> list[str]:
    known = list(names or [])[:count]
    return [*known, *(f"_c{i}" for i in range(len(known), count))]
