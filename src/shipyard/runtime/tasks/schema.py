"""Reading OpenAI request bodies: the checks both tasks make, with OpenAI's wording.

A request a task refuses raises :class:`InvalidRequest`, which the runtime answers with
400 (a CodecError: the client's mistake, logged without a traceback) and the
OpenAI-compatible door passes on as an ``invalid_request_error``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from shipyard.errors import CodecError


class InvalidRequest(CodecError):
    """A request body a task cannot serve: 400, naming the parameter.

    Its text is OpenAI's error object, so that the OpenAI-compatible door passes it on
    with its ``param`` (the name before the message's first colon), and an
    InvokeEndpoint client reads the same JSON in the ModelError's message.
    """

    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        head, colon, _ = message.partition(":")
        self.param = head if colon and " " not in head else None

    def __str__(self) -> str:
        error = {
            "message": self.message,
            "type": "invalid_request_error",
            "param": self.param,
            "code": None,
        }
        return json.dumps({"error": error})


def body(data: Any) -> dict[str, Any]:
    """The request as a JSON object (the handlers get the raw body)."""
    if isinstance(data, bytes | bytearray):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise InvalidRequest("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


def number(
    request: dict[str, Any],
    name: str,
    default: float,
    *,
    low: float,
    high: float,
) -> float:
    """``request[name]`` as a number within [low, high], ``default`` when absent or null."""
    value = request.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name}: expected a number, got {json.dumps(value)[:40]}.")
    if not low <= value <= high:
        raise InvalidRequest(f"{name}: {value} is not between {low:g} and {high:g}.")
    return float(value)


def integer(
    request: dict[str, Any], name: str, default: int | None, *, low: int, high: int
) -> int | None:
    """``request[name]`` as an integer within [low, high], ``default`` when absent."""
    value = request.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name}: expected an integer, got {json.dumps(value)[:40]}.")
    if not low <= value <= high:
        raise InvalidRequest(f"{name}: {value} is not between {low} and {high}.")
    return value


def unsupported(request: dict[str, Any], *names: str) -> None:
    """Refuse what shipyard's handlers do not do (tools, function calls), by name."""
    for name in names:
        value = request.get(name)
        if value not in (None, [], {}, "none", "auto"):
            raise InvalidRequest(
                f"{name}: not supported by shipyard's text generation handler (no tools or "
                "function calling)."
            )


def identifier(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"
