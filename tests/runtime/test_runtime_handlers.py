"""Binding handlers to a model, in process: defaults, context and result shapes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shipyard.runtime.handlers import Context, Handlers, load


def module_with(**handlers: Any) -> ModuleType:
    module = ModuleType("user_inference")
    for name, handler in handlers.items():
        setattr(module, name, handler)
    return module


class Predictor:
    def predict(self, data: Any) -> Any:
        return {"predicted": data}


def test_predict_defaults_to_model_predict() -> None:
    handlers = Handlers(model=Predictor(), module=None)
    assert handlers.invoke(b"[1]", "application/json", "application/json", None) == (
        b'{"predicted": [1]}',
        "application/json",
    )


def test_predict_defaults_to_calling_the_model() -> None:
    handlers = Handlers(model=len, module=None)
    assert handlers.invoke(b"[1, 2]", "application/json", "application/json", None)[0] == b"2"


def test_without_a_model_the_input_is_echoed() -> None:
    handlers = Handlers(model=None, module=None)
    assert handlers.invoke(b"[1, 2]", "application/json", "application/json", None)[0] == (
        b"[1, 2]"
    )
    assert not handlers.uses_context


def test_context_is_passed_only_to_handlers_that_take_it() -> None:
    seen: list[Any] = []

    def input_fn(body: bytes, content_type: str) -> str:
        return body.decode()

    def predict_fn(data: str, model: Any, *, context: Context) -> str:
        seen.append(context.request_custom_attributes)
        context.response_custom_attributes = "done"
        return data

    handlers = Handlers(model=None, module=module_with(input_fn=input_fn, predict_fn=predict_fn))
    assert handlers.uses_context
    context = Context("a=1")
    assert handlers.invoke(b"hi", "text/plain", "application/json", context) == (
        b'"hi"',
        "application/json",
    )
    assert seen == ["a=1"]
    assert context.response_custom_attributes == "done"


def test_transform_fn_replaces_the_pipeline() -> None:
    def transform_fn(model: Any, body: bytes, content_type: str, accept: str) -> bytearray:
        return bytearray(body[::-1])

    def predict_fn(data: Any, model: Any, context: Context) -> Any:
        raise AssertionError("not called")

    handlers = Handlers(
        model=None, module=module_with(transform_fn=transform_fn, predict_fn=predict_fn)
    )
    assert not handlers.uses_context  # predict_fn wants it, but is never called
    assert handlers.invoke(b"abc", "x/y", "x/z", None) == (b"cba", "x/z")


@pytest.mark.parametrize(
    "result",
    [{"a": 1}, (b"x",), (b"x", 1), (None, "text/plain")],
)
def test_a_result_that_is_not_a_body_is_a_type_error(result: Any) -> None:
    handlers = Handlers(model=None, module=module_with(output_fn=lambda prediction, accept: result))
    with pytest.raises(TypeError, match="output_fn"):
        handlers.invoke(b"[]", "application/json", "application/json", None)


def test_a_handler_that_is_not_a_function_is_refused() -> None:
    with pytest.raises(TypeError, match="predict_fn in user_inference is not a function"):
        Handlers(model=None, module=module_with(predict_fn="nope"))


@pytest.fixture
def isolated_imports() -> Iterator[None]:
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


PROGRAM = """
import helper


def model_fn(model_dir, context):
    return (helper.NAME, model_dir, context.request_custom_attributes)
"""


@pytest.mark.usefixtures("isolated_imports")
def test_load_imports_the_program_with_its_siblings(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "shipyard_test_program.py").write_text(PROGRAM)
    (code / "helper.py").write_text("NAME = 'sibling'\n")
    handlers = load(tmp_path, program="shipyard_test_program.py")
    assert handlers.model == ("sibling", str(tmp_path), None)
    assert handlers.program == "shipyard_test_program"
    assert repr(handlers) == "Handlers(program='shipyard_test_program', model=tuple)"
