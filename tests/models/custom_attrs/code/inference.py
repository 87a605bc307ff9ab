"""Echoes the request's custom attributes back, prefixed ``echo:``, through the context."""

from typing import Any


def predict_fn(data: Any, model: None, context: Any) -> Any:
    if context.request_custom_attributes is not None:
        context.response_custom_attributes = "echo:" + context.request_custom_attributes
    return data
