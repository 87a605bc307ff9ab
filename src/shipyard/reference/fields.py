"""A pydantic field as the reference pages show it: its type, default, bounds, meaning."""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import json
import textwrap
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shipyard.reference.markdown import code, prose


def type_name(annotation: Any) -> str:
    """``int | None``, ``list[str]``, ``"builtin" | "container"``: how a reader writes it."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        inner = ", ".join(type_name(arg) for arg in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def default(field: FieldInfo) -> str:
    """The default as Markdown: ``required`` when there is none; a path under the user's
    home written with ``~``, so that no page names the machine it was made on."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        return code("~" + text[len(home) :] if text.startswith(home) else text)
    return code(json.dumps(value) if isinstance(value, str | list | dict) else repr(value))


_BOUNDS = (
    (annotated_types.Ge, "ge", "≥ {}"),
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Le, "le", "≤ {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.MinLen, "min_length", "at least {} long"),
    (annotated_types.MaxLen, "max_length", "at most {} long"),
)


def bounds(field: FieldInfo) -> str:
    """The field's constraints, as Markdown: ``≥ 1``, ``at most 63 long``, its pattern."""
    out = []
    for item in field.metadata:
        for kind, attr, shown in _BOUNDS:
            if isinstance(kind, type) and isinstance(item, kind):
                out.append(shown.format(_number(getattr(item, attr))))
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            out.append("matches " + code(pattern))
    return ", ".join(out)


def _number(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def meaning(owner: type[BaseModel], name: str, field: FieldInfo) -> str:
    """The field's description (its attribute docstring), else, for a field that is a
    model, that model's docstring; a field with neither is an error, so that every
    field's meaning is written where it is declared."""
    text = field.description or next(
        (d[name] for d in map(_docstrings, _models(owner)) if name in d), None
    )
    if not text:
        nested = _model_of(field.annotation)
        text = nested.__doc__ if nested is not None else None
    if not text:
        raise ValueError(f"{owner.__name__}.{name} has no description: write its docstring")
    return prose(text)


def _models(owner: type[BaseModel]) -> list[type[BaseModel]]:
    """``owner`` and the models it inherits fields from, nearest first."""
    return [c for c in owner.__mro__ if isinstance(c, type) and issubclass(c, BaseModel)
            and c is not BaseModel]  # fmt: skip


@functools.cache
def _docstrings(owner: type[BaseModel]) -> dict[str, str]:
    """The attribute docstrings of ``owner``'s fields (the string that follows a field in
    its class body), read from its source here rather than by pydantic's
    ``use_attribute_docstrings``, which would parse the source at every import of the
    model: every gateway start and CLI command, for this page alone."""
    body = ast.parse(textwrap.dedent(inspect.getsource(owner))).body[0]
    assert isinstance(body, ast.ClassDef)
    found: dict[str, str] = {}
    for stmt, after in itertools.pairwise(body.body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[stmt.target.id] = inspect.cleandoc(after.value.value)
    return found


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model ``annotation`` is, or holds (in a list, a dict's values, an Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
