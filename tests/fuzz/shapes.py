"""Requests built from botocore's own service model: valid skeletons, then mutations.

``Skeletons`` walks an operation's input shape and fills every required member (and,
at random, optional ones) with values that satisfy the shape's type, length, range,
pattern and enum constraints, so a skeleton is what boto3 could send. ``mutate`` then
breaks one thing in it: a wrong type, a missing or extra member, a value over a
maximum, a huge number or list, deep nesting, hostile unicode. Everything is drawn from
one ``random.Random``, so a seed gives the same requests every run.

Values that would make the gateway start real processes (images, artifact and output
locations) come from ``override`` instead, so a fuzzed request never runs anything.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from re import _constants as sre_c  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from shipyard.gateway.wire.validation import Matcher, _compile

MISSING: Any = object()
"""What an override returns when it has no opinion on a member."""

Shapes = dict[tuple[Any, ...], Any]
"""Each path in a request (keys and list indexes) -> the botocore shape drawn for it."""

Override = Callable[[str, tuple[Any, ...], str, random.Random], Any]
"""(operation, path, member name, rng) -> a value, or MISSING to generate one."""

_SAFE_CHARS = string.ascii_letters + string.digits
_MAX_DEPTH = 7
_UNICODE = [
    "\ud800",  # a lone high surrogate (JSON allows the escape; UTF-8 cannot carry it)
    "\udfff",
    "\x00",
    "a\x00b",
    "\u202eevil\u202c",  # right-to-left override
    "\U0001f680\U0001f9e8",  # emoji (astral plane)
    "e\u0301\u0301\u0301",  # combining marks
    "\ufeff",
    "\uffff",
    "../../etc/passwd",
    "%00%2e%2e/",
    "\n\r\t",
    "${jndi:ldap://x}",
    "'\"; DROP TABLE models; --",
]


@dataclass
class Request:
    """One control-plane request: its operation, its JSON value and what was done to it."""

    operation: str
    params: Any
    mutation: str = "valid"
    raw: dict[str, str] = field(default_factory=dict)
    """Placeholders in the JSON text replaced by raw text (deep nesting, bad escapes)."""

    def body(self) -> bytes:
        text = json.dumps(self.params)  # ASCII: lone surrogates travel as \\ud800
        for placeholder, raw in self.raw.items():
            text = text.replace(json.dumps(placeholder), raw)
        return text.encode()


class Skeletons:
    """Valid requests for the operations of one botocore service model."""

    def __init__(
        self,
        model: Any,
        rng: random.Random,
        override: Override,
        *,
        always: frozenset[str] = frozenset(),
    ) -> None:
        """``always`` names optional members to include wherever their structure is."""
        self.model = model
        self.rng = rng
        self.override = override
        self.always = always
        self._compiled: dict[str, Matcher | None] = {}

    def build(self, operation: str, *, full: bool = False) -> tuple[Request, Shapes]:
        """A valid request and, for each path in it, the shape it was drawn from."""
        shape = self.model.operation_model(operation).input_shape
        shapes: Shapes = {}
        params = self._value(operation, shape, (), 0, full, shapes) if shape is not None else {}
        return Request(operation, params), shapes

    def _value(
        self,
        op: str,
        shape: Any,
        path: tuple[Any, ...],
        depth: int,
        full: bool,
        shapes: dict[Any, Any],
    ) -> Any:
        shapes[path] = shape
        kind = shape.type_name
        if kind == "structure":
            return self._structure(op, shape, path, depth, full, shapes)
        if kind == "list":
            count = self._count(shape, full, depth)
            return [
                self._value(op, shape.member, (*path, i), depth + 1, full, shapes)
                for i in range(count)
            ]
        if kind == "map":
            out = {}
            for _ in range(self._count(shape, full, depth)):
                key = self.scalar(shape.key)
                out[key] = self._value(op, shape.value, (*path, key), depth + 1, full, shapes)
            return out
        return self.scalar(shape)

    def _structure(
        self,
        op: str,
        shape: Any,
        path: tuple[Any, ...],
        depth: int,
        full: bool,
        shapes: dict[Any, Any],
    ) -> dict[str, Any]:
        required = set(shape.required_members)
        names = list(shape.members)
        if shape.metadata.get("union"):
            chosen = [self.rng.choice(names)]
        elif full and depth < _MAX_DEPTH:
            chosen = names
        else:
            chosen = [
                n
                for n in names
                if n in required or n in self.always or (depth < 4 and self.rng.random() < 0.25)
            ]
        out: dict[str, Any] = {}
        for name in chosen:
            member = shape.members[name]
            fixed = self.override(op, path, name, self.rng)
            if fixed is not MISSING:
                if fixed is not None:
                    out[name] = fixed
                    shapes[(*path, name)] = member
                continue
            out[name] = self._value(op, member, (*path, name), depth + 1, full, shapes)
        return out

    def _count(self, shape: Any, full: bool, depth: int) -> int:
        low = int(shape.metadata.get("min", 0))
        high = int(shape.metadata.get("max", low + 3))
        wanted = max(low, 1 if full or depth < 3 else 0) + self.rng.randint(0, 1)
        return min(wanted, high, low + 3)

    def scalar(self, shape: Any) -> Any:
        """A value of a scalar shape that meets its constraints."""
        meta = shape.metadata
        kind = shape.type_name
        if "enum" in meta:
            return self.rng.choice(meta["enum"])
        if kind == "string":
            return self.string(meta)
        if kind in ("integer", "long"):
            low = int(meta.get("min", 0))
            high = int(meta.get("max", low + 100))
            return self.rng.randint(low, min(high, low + 100))
        if kind in ("float", "double"):
            bottom = float(meta.get("min", 0.0))
            top = float(meta.get("max", bottom + 100.0))
            return round(self.rng.uniform(bottom, min(top, bottom + 100.0)), 3)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "timestamp":
            return 1_700_000_000 + self.rng.randint(0, 10_000_000)
        if kind == "blob":
            low = int(meta.get("min", 1))
            return base64.b64encode(self.rng.randbytes(max(low, 4))).decode()
        raise AssertionError(f"no generator for {kind}")  # a type botocore added

    def string(self, meta: dict[str, Any]) -> str:
        low = int(meta.get("min", 0))
        high = int(meta.get("max", max(low, 16)))
        pattern = meta.get("pattern")
        compiled = self._compile(pattern) if pattern else None
        if pattern and compiled is not None:
            for _ in range(30):
                try:
                    text = _from_pattern(_drawable(pattern), self.rng)
                except _Unsupported:
                    break
                if low <= len(text) <= high and compiled.fullmatch(text):
                    return text
        size = min(high, max(low, self.rng.randint(1, 12)))
        return "".join(self.rng.choice(_SAFE_CHARS) for _ in range(size))

    def _compile(self, pattern: str) -> Matcher | None:
        """The pattern as the gateway's validator enforces it (None: it does not)."""
        if pattern not in self._compiled:
            self._compiled[pattern] = _compile(pattern)
        return self._compiled[pattern]


# -- mutations --------------------------------------------------------------------------


def mutate(request: Request, shapes: Shapes, rng: random.Random) -> Request:
    """``request`` with one thing broken, at a random place; ``mutation`` says what."""
    paths = [p for p in shapes if p and _get(request.params, p) is not MISSING]
    kind = rng.choice(_MUTATIONS)
    if not paths and kind not in ("extra", "top_level"):
        kind = "extra"
    path = rng.choice(paths) if paths else ()
    params = json.loads(json.dumps(request.params))
    out = Request(request.operation, params)
    _APPLY[kind](out, path, shapes.get(path), rng)
    out.mutation = f"{kind} at {'.'.join(map(str, path)) or '(top)'}"
    return out


def _drop(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    parent = _get(req.params, path[:-1])
    if isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.pop(path[-1])


def _null(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    _set(req.params, path, None)


def _extra(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    target = _get(req.params, path) if path else req.params
    if not isinstance(target, dict):
        target = req.params
    target[rng.choice(["Extra", "__proto__", "constructor", "ModelNam", "", "\u202e"])] = _any_json(
        rng
    )


def _wrong_type(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    current = _get(req.params, path)
    choices = [v for v in _json_kinds(rng) if type(v) is not type(current)]
    _set(req.params, path, rng.choice(choices))


def _too_big(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    meta = shape.metadata if shape is not None else {}
    kind = shape.type_name if shape is not None else "string"
    if kind == "string" or kind == "blob":
        size = int(meta.get("max", 1000)) + rng.choice([1, 2, 1000, 100_000])
        value: Any = "a" * min(size, 400_000)
        if kind == "blob":
            value = base64.b64encode(b"a" * min(size, 300_000)).decode()
    elif kind in ("integer", "long", "float", "double", "timestamp"):
        value = rng.choice([2**31, 2**63, -(2**63) - 1, 10**300, 1e308, -1e308, 10**4000, 1.5, -1])
    elif kind == "list":
        item = _get(req.params, (*path, 0))
        item = "a" if item is MISSING else item
        value = [item] * rng.choice([int(meta.get("max", 10)) + 1, 20_000])
    elif kind == "map":
        value = {f"k{i}": "v" for i in range(rng.choice([int(meta.get("max", 10)) + 1, 20_000]))}
    else:
        value = {f"M{i}": i for i in range(5000)}
    _set(req.params, path, value)


def _too_small(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    kind = shape.type_name if shape is not None else "string"
    empty: dict[str, Any] = {"string": "", "blob": "", "list": [], "map": {}, "structure": {}}
    _set(req.params, path, empty.get(kind, rng.choice([-1, -(2**31), 0, -1e-9])))


def _bad_text(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    current = _get(req.params, path)
    text = rng.choice(_UNICODE)
    if isinstance(current, str) and rng.random() < 0.5:
        text = current[: len(current) // 2] + text + current[len(current) // 2 :]
    _set(req.params, path, text)


def _enum_other(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    current = _get(req.params, path)
    options = ["", "random", "PREFIX_AWARE", "ml.p5.48xlarge", "Pipe", "FastFile", "None"]
    if isinstance(current, str):
        options += [current.lower(), current.upper(), current + " ", " " + current]
    _set(req.params, path, rng.choice(options))


def _deep(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    depth = rng.choice([64, 500, 1000, 3000, 100_000])
    if rng.random() < 0.5:
        raw = "[" * depth + "]" * depth
    else:
        raw = '{"a":' * depth + "1" + "}" * depth
    placeholder = f"__raw_{len(req.raw)}__"
    req.raw[placeholder] = raw
    _set(req.params, path, placeholder)


def _top_level(req: Request, path: tuple[Any, ...], shape: Any, rng: random.Random) -> None:
    req.params = rng.choice([None, [], [req.params], "text", 1, True, 1e308])


_APPLY: dict[str, Callable[[Request, tuple[Any, ...], Any, random.Random], None]] = {
    "drop": _drop,
    "null": _null,
    "extra": _extra,
    "wrong_type": _wrong_type,
    "too_big": _too_big,
    "too_small": _too_small,
    "bad_text": _bad_text,
    "enum_other": _enum_other,
    "deep": _deep,
    "top_level": _top_level,
}
_MUTATIONS = list(_APPLY)


def _json_kinds(rng: random.Random) -> list[Any]:
    return [
        rng.choice(["", "x", "\ud800", "1"]),
        rng.choice([0, -1, 2**31, 1.5, 1e308]),
        rng.random() < 0.5,
        None,
        [rng.choice([1, "a", None])],
        {"a": rng.choice([1, "a", {}])},
    ]


def _any_json(rng: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rng.random() < 0.4:
        return rng.choice(_json_kinds(rng)[:4] + rng.sample(_UNICODE, 2))
    if rng.random() < 0.5:
        return [_any_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_UNICODE + ["k"]): _any_json(rng, depth + 1) for _ in range(2)}


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return value


def _set(value: Any, path: tuple[Any, ...], new: Any) -> None:
    parent = _get(value, path[:-1])
    parent[path[-1]] = new


# -- strings from patterns ----------------------------------------------------------------


class _Unsupported(Exception):
    """A pattern construct this generator does not draw from (back references)."""


_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: string.digits,
    sre_c.CATEGORY_NOT_DIGIT: string.ascii_letters,
    sre_c.CATEGORY_WORD: _SAFE_CHARS + "_",
    sre_c.CATEGORY_NOT_WORD: " -.",
    sre_c.CATEGORY_SPACE: " ",
    sre_c.CATEGORY_NOT_SPACE: _SAFE_CHARS,
}


_ASCII_CLASSES = {
    r"\p{Alnum}": "a-zA-Z0-9",
    r"\p{L}": "a-zA-Z",
    r"\p{N}": "0-9",
    r"\p{Z}": " ",
    r"\p{M}": "a",
    r"\p{P}": ".,!",
    r"\p{S}": "+=",
}
"""Java's Unicode classes as ASCII ones within them, which ``sre_parse`` can draw from."""


def _drawable(pattern: str) -> str:
    for java, ascii_class in _ASCII_CLASSES.items():
        pattern = pattern.replace(java, ascii_class)
    return pattern


def _from_pattern(pattern: str, rng: random.Random) -> str:
    out: list[str] = []
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:  # a Java class with no ASCII stand-in here
        raise _Unsupported(str(exc)) from None
    _draw(parsed, rng, out)
    return "".join(out)


def _draw(parsed: Any, rng: random.Random, out: list[str]) -> None:
    for op, arg in parsed:
        if op is sre_c.LITERAL:
            out.append(chr(arg))
        elif op is sre_c.NOT_LITERAL:
            out.append(rng.choice([c for c in _SAFE_CHARS if ord(c) != arg]))
        elif op is sre_c.ANY:
            out.append(rng.choice(_SAFE_CHARS))
        elif op is sre_c.IN:
            out.append(_draw_class(arg, rng))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT):
            low, high, sub = arg
            for _ in range(low + rng.randint(0, min(high - low, 3))):
                _draw(sub, rng, out)
        elif op in (sre_c.SUBPATTERN, sre_c.ATOMIC_GROUP):
            _draw(arg[-1], rng, out)
        elif op is sre_c.BRANCH:
            _draw(rng.choice(arg[1]), rng, out)
        elif op in (sre_c.AT, sre_c.ASSERT, sre_c.ASSERT_NOT):
            continue  # anchors and lookarounds: the full match checks them afterwards
        else:
            raise _Unsupported(str(op))


def _draw_class(items: list[Any], rng: random.Random) -> str:
    if items and items[0][0] is sre_c.NEGATE:
        excluded = re.compile(
            "[" + "".join(_class_text(op, arg) for op, arg in items[1:]) + "]", re.ASCII
        )
        allowed = [c for c in _SAFE_CHARS + " -_./" if not excluded.match(c)]
        return rng.choice(allowed or ["~"])
    op, arg = rng.choice(items)
    if op is sre_c.LITERAL:
        return chr(arg)
    if op is sre_c.RANGE:
        low, high = arg
        ascii_low, ascii_high = max(low, 0x21), min(high, 0x7E)
        if ascii_low <= ascii_high:
            return chr(rng.randint(ascii_low, ascii_high))
        return chr(low)
    if op is sre_c.CATEGORY:
        return rng.choice(_CATEGORIES.get(arg, _SAFE_CHARS))
    raise _Unsupported(str(op))


def _class_text(op: Any, arg: Any) -> str:
    if op is sre_c.LITERAL:
        return re.escape(chr(arg))
    if op is sre_c.RANGE:
        return f"{re.escape(chr(arg[0]))}-{re.escape(chr(arg[1]))}"
    if op is sre_c.CATEGORY:
        return {
            sre_c.CATEGORY_DIGIT: r"\d",
            sre_c.CATEGORY_WORD: r"\w",
            sre_c.CATEGORY_SPACE: r"\s",
            sre_c.CATEGORY_NOT_DIGIT: r"\D",
            sre_c.CATEGORY_NOT_WORD: r"\W",
            sre_c.CATEGORY_NOT_SPACE: r"\S",
        }[arg]
    raise _Unsupported(str(op))
