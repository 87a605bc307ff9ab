"""docs/reference/errors.md: the exception tree of shipyard/errors.py, with each error's
wire code and HTTP status on the doors that answer it (gateway/wire/errors.py renders them)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

from shipyard import errors
from shipyard.errors import (
    AuthFailure,
    CodecError,
    FacadeRefusal,
    MetricsFault,
    ModelError,
    MultiModelError,
    RuntimeFailure,
    ShipyardError,
)
from shipyard.gateway.wire.errors import openai_error_body
from shipyard.reference.markdown import code, first_paragraph, page, table


def _classes() -> list[type[BaseException]]:
    """Every exception errors.py declares, in its order."""
    found = [
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    ]
    return sorted(found, key=lambda cls: inspect.getsourcelines(cls)[1])


def _tree(
    root: type[BaseException], every: list[type[BaseException]]
) -> Iterator[tuple[int, type[BaseException]]]:
    """``root`` and what derives from it, depth first, each with its depth."""
    yield 0, root
    for cls in every:
        if cls.__bases__[0] is root:
            for depth, below in _tree(cls, every):
                yield depth + 1, below


def _name(depth: int, cls: type[BaseException]) -> str:
    return "↳ " * depth + code(cls.__name__) if depth else code(cls.__name__)


def _door(cls: type[ShipyardError]) -> tuple[str, str]:
    """The doors that answer ``cls``, and its code there."""
    if issubclass(cls, MetricsFault):
        return "CloudWatch", f"{code(cls.shape)} (`x-amzn-query-error`: {code(cls.wire_type)})"
    if issubclass(cls, RuntimeFailure):
        return "runtime", code(cls.wire_type)
    if issubclass(cls, FacadeRefusal):
        return "`POST /inference`", ""
    if issubclass(cls, AuthFailure):
        return "every door", code(cls.wire_type)
    if cls.__bases__[0] is ShipyardError and not {"wire_type", "status_code"} & set(vars(cls)):
        return "none: raised inside the gateway", ""
    return "control plane", code(cls.wire_type)


def _openai(cls: type[ShipyardError]) -> str:
    """How the OpenAI-compatible door answers ``cls``: its status and ``code``."""
    if not issubclass(cls, RuntimeFailure | AuthFailure):
        return ""
    if issubclass(cls, ModelError):
        return "the model's 4xx status, else 500; `model_error`"
    status, body = openai_error_body(cls("message"))
    return f"{status} {code(body['error']['code'])}"


def _answered(every: list[type[BaseException]]) -> str:
    rows = []
    for depth, cls in _tree(ShipyardError, every):
        assert issubclass(cls, ShipyardError)
        door, wire = _door(cls)
        status = str(cls.status_code)
        rows.append(
            (_name(depth, cls), door, wire, status, _openai(cls), first_paragraph(cls.__doc__))
        )
    head = ("Error", "Door", "Code", "HTTP", "OpenAI door", "Meaning")
    return table(head, rows)


def _instance(every: list[type[BaseException]]) -> str:
    rows = []
    for root in (CodecError, MultiModelError):
        for depth, cls in _tree(root, every):
            status = cls.status_code  # type: ignore[attr-defined]
            rows.append((_name(depth, cls), str(status), first_paragraph(cls.__doc__)))
    return table(("Error", "HTTP", "Meaning"), rows)


def _internal(every: list[type[BaseException]]) -> str:
    shown = (ShipyardError, CodecError, MultiModelError)
    rows = []
    for cls in every:
        if issubclass(cls, shown):
            continue
        base = cls.__bases__[0]
        kind = code(base.__name__)
        rows.append((code(cls.__name__), kind, first_paragraph(cls.__doc__)))
    return table(("Error", "Is a", "Meaning"), rows)


def render() -> str:
    every = _classes()
    return page(
        "Errors",
        first_paragraph(errors.__doc__)
        + " Each door answers an error in its own shape: the control plane as AWS JSON "
        "(`__type` and `message`; CloudWatch also in CBOR), the runtime with its code in "
        '`x-amzn-ErrorType`, `POST /inference` as `{"status", "errMsg"}` and the '
        'OpenAI-compatible door as `{"error": {...}}`.',
        "## Errors answered to callers\n",
        "`↳` marks an error derived from the one above it at the level before; a code or "
        "status it does not set is its parent's.\n",
        _answered(every),
        "## Errors of the built-in model server\n",
        "What an instance of the built-in runtime answers; the runtime door passes its "
        "status on as a ModelError's `OriginalStatusCode`.\n",
        _instance(every),
        "## Failures inside the gateway\n",
        "Never sent as they are: the code that catches one turns it into an error above, a "
        "job's FailureReason, an instance's answer or an exit code.\n",
        _internal(every),
    )
