"""docs/reference/stack-file.md: every key of the stack file, from its models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from shipyard.reference.fields import _model_of, bounds, default, meaning, type_name
from shipyard.reference.markdown import code, first_paragraph, page, prose, table
from shipyard.stackfile import StackFile, StackResources

_KEYS = {"scaling": "{endpoint}/{variant}"}
"""What stands for a section's own key where it is not a resource's name."""

_TOP = ("Key", "Type", "Default", "Bounds", "Meaning")


def render() -> str:
    resources: list[str] = []
    others: list[str] = []
    for name, field in StackFile.model_fields.items():
        section = _section(name, field.annotation, meaning(StackFile, name, field))
        (resources if name in StackResources.model_fields else others).append(section)
    intro = (
        f"{first_paragraph(StackFile.__doc__)} Keys are given as paths: `{{name}}` stands "
        "for a name of your choosing, `[]` for each item of a list. "
        "`shipyard serve --config` reads the whole file at start; `shipyard apply` "
        "converges its resource sections on a running gateway."
    )
    return page(
        "Stack file",
        intro,
        "## Resource sections\n",
        first_paragraph(StackResources.__doc__) + " " + prose(_RESOURCES) + "\n",
        *resources,
        "## Gateway sections\n",
        "How the gateway serves: read at start; `topics:` and `jobs:` also change live "
        "with `PUT /stack`.\n",
        *others,
    )


_RESOURCES = (
    "Each entry is the body of its SageMaker Create call without the name, which is the "
    "key it is listed under. The keys below are those checked when the file is read; "
    "where a section says so, any other member of the Create call's request may be given "
    "too, and is checked against the service model when the gateway creates it."
)


def _section(name: str, annotation: Any, what: str) -> str:
    key = _KEYS.get(name, "{name}")
    model = _model_of(annotation)
    head = f"### `{name}`\n\n{what}\n"
    if model is None:
        return head
    path = f"{name}.{key}" if get_origin(annotation) is dict else name
    rows = list(_rows(model, path))
    extra = model.model_config.get("extra")
    if extra == "allow":
        head += f"\nAny other member of the {_call(model)} request is passed through.\n"
    elif extra == "forbid":
        head += "\nNo other key is taken.\n"
    return f"{head}\n{table(_TOP, rows)}"


def _call(model: type[BaseModel]) -> str:
    """The Create call a body model is (its docstring's first word)."""
    return code((model.__doc__ or model.__name__).split()[0].removesuffix("'s"))


def _rows(model: type[BaseModel], path: str) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        here = f"{path}.{name}"
        yield (
            code(here),
            code(type_name(field.annotation)),
            default(field),
            bounds(field),
            meaning(model, name, field),
        )
        nested = _model_of(field.annotation)
        if nested is not None:
            yield from _rows(nested, here + _step(field.annotation))


def _step(annotation: Any) -> str:
    """``[]`` for a list of models, ``.{name}`` for a mapping of them."""
    for candidate in (annotation, *get_args(annotation)):
        origin = get_origin(candidate)
        if origin is list:
            return "[]"
        if origin is dict:
            return ".{name}"
    return ""
