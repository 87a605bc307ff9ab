"""Metric math: the common expressions of GetMetricData and of alarms on metric math.

An expression is parsed with Python's own parser (``ast``), whose grammar holds
CloudWatch's for what is supported here, and walked over a closed set of node types:
nothing is ever evaluated by Python itself. Supported: the ids of the request's other
queries, numbers, ``+ - * /`` and ``^`` (power), unary minus, ``[a, b]`` arrays,
``METRICS()`` / ``METRICS("label")``, and the functions ``SUM``, ``AVG``, ``MIN``,
``MAX``, ``STDDEV`` (of an array: a time series; of one series: a number), ``ABS``,
``CEIL``, ``FLOOR``, ``FILL(series, value)``, ``DIFF``, ``RATE`` and ``PERIOD``.
Arithmetic between series keeps the timestamps both have, as CloudWatch does.
"""

from __future__ import annotations

import ast
import io
import math
import statistics
import token
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shipyard.errors import InvalidParameterValue

Series = dict[int, float]
"""Timestamp (epoch seconds) -> value."""

Value = float | Series | list[Series]

MAX_LENGTH = 2048
"""CloudWatch's limit on an expression's length."""

MAX_POINTS = 1_000_000
"""The most datapoints one expression may touch (names and METRICS() each count their
series' points): a bound on the work and memory one request can ask for."""


@dataclass(frozen=True, slots=True)
class Context:
    """What an expression can name: the other queries' series (by id, with their
    labels for ``METRICS("label")``) and the period."""

    series: Mapping[str, Series]
    labels: Mapping[str, str]
    period: int


def evaluate(expression: str, context: Context) -> Series:
    """The time series ``expression`` yields; a number yields one point per timestamp of
    the series named in the context (none when there are none)."""
    if len(expression) > MAX_LENGTH:
        raise _bad(expression, f"it is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(_python(expression), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError):
        raise _bad(expression, "it does not parse") from None
    try:
        value = _Walker(expression, context).walk(tree.body, 0)
    except RecursionError:
        raise _bad(expression, "it nests too deeply") from None
    if isinstance(value, list):
        raise _bad(expression, "it yields several time series; combine them, e.g. SUM([...])")
    if isinstance(value, float):
        stamps = sorted({t for s in context.series.values() for t in s})
        return dict.fromkeys(stamps, value)
    return value


def _python(expression: str) -> str:
    """``expression`` in Python's spelling: CloudWatch's power ``^`` (which binds tighter
    than ``*``) is Python's ``**``; strings are left as they are."""
    tokens = tokenize.generate_tokens(io.StringIO(expression.strip()).readline)
    return tokenize.untokenize(
        (token.OP, "**") if t.type == token.OP and t.string == "^" else (t.type, t.string)
        for t in tokens
    ).strip()


def ids_in(expression: str) -> set[str]:
    """The query ids an expression names (for ordering queries by what they need)."""
    try:
        tree = ast.parse(_python(expression), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError):
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _bad(expression: str, why: str) -> InvalidParameterValue:
    return InvalidParameterValue(f"The expression '{expression[:200]}' is not valid: {why}.")


_MAX_DEPTH = 50


class _Walker:
    def __init__(self, expression: str, context: Context) -> None:
        self.expression = expression
        self.context = context
        self.spent = 0

    def walk(self, node: ast.AST, depth: int) -> Value:
        if depth > _MAX_DEPTH:
            raise _bad(self.expression, "it nests too deeply")
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return self._number(node.value)
        if isinstance(node, ast.Name):
            found = self.context.series.get(node.id)
            if found is None:
                raise _bad(self.expression, f"no query has the id {node.id}")
            self._spend(len(found))
            return found  # never changed in place: every operation makes a new series
        if isinstance(node, ast.List):
            items = [self.walk(item, depth + 1) for item in node.elts]
            out: list[Series] = []
            for item in items:
                if isinstance(item, float):
                    raise _bad(self.expression, "an array holds time series, not numbers")
                out.extend(item if isinstance(item, list) else [item])
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
            return _apply(lambda a, b: a * b, self.walk(node.operand, depth + 1), sign)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left = self.walk(node.left, depth + 1)
            right = self.walk(node.right, depth + 1)
            return _apply(_OPERATORS[type(node.op)], left, right)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return self._call(node.func.id, node.args, depth)
        raise _bad(self.expression, f"'{ast.unparse(node)[:100]}' is not supported")

    def _number(self, value: float) -> float:
        if isinstance(value, bool):
            raise _bad(self.expression, f"{value} is not a number")
        try:
            return float(value)
        except OverflowError:
            raise _bad(self.expression, "a number is too large") from None

    def _spend(self, points: int) -> None:
        """Count the points an expression touches; past MAX_POINTS it is refused."""
        self.spent += points
        if self.spent > MAX_POINTS:
            raise _bad(self.expression, f"it touches more than {MAX_POINTS} datapoints")

    def _call(self, name: str, args: list[ast.expr], depth: int) -> Value:
        if name == "METRICS":
            return self._metrics(args)
        if name == "PERIOD":
            return float(self.context.period)
        values = [self.walk(a, depth + 1) for a in args]
        if name in _REDUCE and len(values) == 1:
            return _reduce(_REDUCE[name], values[0])
        if name in _ELEMENTWISE and len(values) == 1:
            return _apply(lambda a, _: _ELEMENTWISE[name](a), values[0], 0.0)
        if name == "FILL" and len(values) == 2 and isinstance(values[1], float):
            stamps = self._stamps()
            self._spend(len(stamps) * (len(values[0]) if isinstance(values[0], list) else 1))
            return _fill(values[0], values[1], stamps)
        if name in ("DIFF", "RATE") and len(values) == 1 and isinstance(values[0], dict):
            return _diff(values[0], rate=name == "RATE")
        raise _bad(self.expression, f"{name} with {len(values)} argument(s) is not supported")

    def _metrics(self, args: list[ast.expr]) -> list[Series]:
        if len(args) > 1 or (
            args and not (isinstance(args[0], ast.Constant) and isinstance(args[0].value, str))
        ):
            raise _bad(self.expression, "METRICS takes nothing, or a label to look for")
        wanted = args[0].value if args else ""  # type: ignore[attr-defined]
        found = [
            s
            for key, s in self.context.series.items()
            if wanted in self.context.labels.get(key, key)
        ]
        self._spend(sum(len(s) for s in found))
        return found

    def _stamps(self) -> list[int]:
        return sorted({t for s in self.context.series.values() for t in s})


def _pow(a: float, b: float) -> float:
    try:
        result = math.pow(a, b)
    except (OverflowError, ValueError):
        return math.nan
    return result


def _div(a: float, b: float) -> float:
    if b == 0:
        return math.nan  # CloudWatch leaves such a point out; so does _apply
    return a / b


_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: _div,
    ast.Pow: _pow,  # CloudWatch's ^ (_python)
}

_REDUCE: dict[str, Callable[[list[float]], float]] = {
    "SUM": math.fsum,
    "AVG": statistics.fmean,
    "MIN": min,
    "MAX": max,
    "STDDEV": lambda xs: statistics.pstdev(xs) if len(xs) > 1 else 0.0,
}

_ELEMENTWISE: dict[str, Callable[[float], float]] = {
    "ABS": abs,
    "CEIL": lambda x: float(math.ceil(x)) if math.isfinite(x) else x,
    "FLOOR": lambda x: float(math.floor(x)) if math.isfinite(x) else x,
}


def _apply(op: Callable[[float, float], float], left: Value, right: Value) -> Value:
    if isinstance(left, list) or isinstance(right, list):
        if isinstance(left, list) and isinstance(right, list):
            raise InvalidParameterValue(
                "Arithmetic between two arrays of time series is not supported."
            )
        if isinstance(left, list):
            return [_finite(_apply(op, s, right)) for s in left]
        assert isinstance(right, list)
        return [_finite(_apply(op, left, s)) for s in right]
    if isinstance(left, float) and isinstance(right, float):
        return op(left, right)
    if isinstance(left, float):
        assert isinstance(right, dict)
        return _clean({t: op(left, v) for t, v in right.items()})
    if isinstance(right, float):
        return _clean({t: op(v, right) for t, v in left.items()})
    return _clean({t: op(v, right[t]) for t, v in left.items() if t in right})


def _finite(value: Value) -> Series:
    assert isinstance(value, dict)
    return value


def _clean(series: Series) -> Series:
    return {t: v for t, v in series.items() if math.isfinite(v)}


def _reduce(fn: Callable[[list[float]], float], value: Value) -> Value:
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return fn(list(value.values())) if value else math.nan
    stamps = sorted({t for s in value for t in s})
    return _clean({t: fn([s[t] for s in value if t in s]) for t in stamps})


def _fill(value: Value, filler: float, stamps: list[int]) -> Value:
    if isinstance(value, float):
        return value
    if isinstance(value, list):
        return [{t: s.get(t, filler) for t in stamps} for s in value]
    return {t: value.get(t, filler) for t in stamps}


def _diff(series: Series, *, rate: bool) -> Series:
    out: Series = {}
    stamps = sorted(series)
    for before, after in zip(stamps, stamps[1:], strict=False):
        change = series[after] - series[before]
        out[after] = change / (after - before) if rate else change
    return out
