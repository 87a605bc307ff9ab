"""Handlers that return iterators, in process: what a streamed answer's chunks are, and
what InvokeEndpoint (the answer joined) gets from the same handlers."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from shipyard.runtime import streaming
from shipyard.runtime.handlers import Handlers


def handlers_with(**functions: Any) -> Handlers:
    module = ModuleType("user_inference")
    for name, function in functions.items():
        setattr(module, name, function)
    return Handlers(model=None, module=module)


def chunks_of(handlers: Handlers, accept: str = "application/json") -> tuple[list[bytes], str]:
    payload, media_type = handlers.answer(b"{}", "application/json", accept, None)
    assert not isinstance(payload, bytes), "an iterator comes back as chunks"
    return list(payload), media_type


def test_predict_fn_items_are_encoded_one_by_one_by_the_default_output_fn() -> None:
    def predict_fn(data: Any, model: Any) -> Iterator[Any]:
        yield "text "
        yield b"bytes "
        yield {"n": 1}
        yield np.arange(3)

    chunks, media_type = chunks_of(handlers_with(predict_fn=predict_fn))
    assert chunks == [b"text ", b"bytes ", b'{"n": 1}', b"[0, 1, 2]"]
    assert media_type == "application/json"


def test_output_fn_and_transform_fn_may_return_iterators_with_a_content_type() -> None:
    def output_fn(prediction: Any, accept: str) -> Any:
        return (f"token {n}" for n in range(3)), "text/event-stream"

    chunks, media_type = chunks_of(handlers_with(output_fn=output_fn))
    assert chunks == [b"token 0", b"token 1", b"token 2"]
    assert media_type == "text/event-stream"

    def transform_fn(model: Any, body: bytes, content_type: str, accept: str) -> Any:
        return iter([b"a", bytearray(b"b")])

    assert chunks_of(handlers_with(transform_fn=transform_fn), "text/plain") == (
        [b"a", b"b"],
        "text/plain",
    )


@pytest.mark.parametrize("result", [[b"a", b"b"], (b"a", "text/plain"), "text", b"bytes"])
def test_lists_tuples_and_bodies_are_not_streams(result: Any) -> None:
    assert not streaming.is_stream(result)
    assert streaming.is_stream(iter([result]))


def test_an_output_fn_item_that_is_no_body_fails_when_it_is_reached() -> None:
    def output_fn(prediction: Any, accept: str) -> Iterator[Any]:
        yield b"fine"
        yield 42

    chunks = handlers_with(output_fn=output_fn).answer(b"{}", "application/json", "x", None)[0]
    assert not isinstance(chunks, bytes)
    assert next(chunks) == b"fine"
    with pytest.raises(TypeError, match="output_fn yielded int"):
        next(chunks)


def test_invoke_joins_a_stream_whole_and_raises_what_the_generator_raises() -> None:
    def predict_fn(data: Any, model: Any) -> Iterator[str]:
        yield "one "
        yield "two"
        if data.get("fail"):
            raise RuntimeError("broke")

    handlers = handlers_with(predict_fn=predict_fn)
    assert handlers.invoke(b"{}", "application/json", "text/plain", None) == (
        b"one two",
        "text/plain",
    )
    with pytest.raises(RuntimeError, match="broke"):
        handlers.invoke(b'{"fail": true}', "application/json", "text/plain", None)


def test_closing_the_chunks_closes_the_user_s_generator() -> None:
    closed: list[bool] = []

    def predict_fn(data: Any, model: Any) -> Iterator[str]:
        try:
            while True:
                yield "more"
        finally:
            closed.append(True)

    chunks = handlers_with(predict_fn=predict_fn).answer(b"{}", "application/json", "x", None)[0]
    assert not isinstance(chunks, bytes)
    assert next(chunks) == b"more"
    chunks.close()  # type: ignore[attr-defined]
    assert closed == [True]
