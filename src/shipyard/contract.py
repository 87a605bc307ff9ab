"""The gateway ↔ instance contract: the headers each side writes and the other reads.

Both sides import this module and nothing else of each other's, so a header cannot be
renamed on one side only. The SageMaker container contract (``POST /invocations``,
``GET /ping``) carries the client's request headers below; the built-in runtime adds
``X-Shipyard-*`` headers that tell the gateway what it did:

- every multi-model answer carries ``X-Shipyard-Loaded-Models``; a served model adds
  ``X-Shipyard-Model-Cache`` and, after a load or unload, ``X-Shipyard-Model-Timings``
  and ``X-Shipyard-Evicted``;
- a platform error (rather than the model's own) names itself in ``X-Shipyard-Error``,
  e.g. ``ModelNotFound`` (errors.py lists them, under MultiModelError);
- an answer that came out of a server-side batch says how big the batch was and how long
  the request waited for it in ``X-Shipyard-Batch``.

Beside the container contract, the built-in runtime takes a shadow variant's copies many
at a time on ``POST /copies`` (COPIES_PATH, below).

Only the standard library is imported: the data path pays nothing for these names.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from urllib.parse import quote, unquote

Headers = list[tuple[bytes, bytes]]

CONTENT_TYPE = b"Content-Type"
ACCEPT = b"Accept"
CUSTOM_ATTRIBUTES = b"X-Amzn-SageMaker-Custom-Attributes"
INFERENCE_ID = b"X-Amzn-SageMaker-Inference-Id"
TARGET_MODEL = b"X-Amzn-SageMaker-Target-Model"
SESSION_ID = b"X-Amzn-SageMaker-Session-Id"
TARGET_CONTAINER_HOSTNAME = b"X-Amzn-SageMaker-Target-Container-Hostname"
ADAPTER_IDENTIFIER = b"x-amzn-sagemaker-adapter-identifier"
"""Which adapter (an adapter inference component) a request is for, as SageMaker's LoRA
container standard names it; written by the gateway only, never forwarded from a client
(runtime/adapters.py)."""
ADAPTERS_TOKEN = b"x-shipyard-adapters-token"
"""On ``POST /adapters`` and ``DELETE /adapters/<name>``: the token a component's copy
was handed by the gateway on a pipe (``--adapters-token-fd``), so only the gateway
registers adapters in it."""
ADAPTERS_TOKEN_ENV = "SHIPYARD_ADAPTERS_TOKEN"
ADAPTERS_TOKEN_FD_ENV = "SHIPYARD_ADAPTERS_TOKEN_FD"
"""A ``cmd:`` server's copy of a component: the descriptor of the pipe its token is read
from (the number, not the token)."""
"""Where the token once travelled: one of the gateway's own variables, which no caller's
Environment may name (host_access.GATEWAY_VARIABLES) and which turns on nothing."""

FORWARDED: dict[bytes, bytes] = {
    name.lower(): name
    for name in (
        CONTENT_TYPE,
        ACCEPT,
        CUSTOM_ATTRIBUTES,
        INFERENCE_ID,
        TARGET_MODEL,
        SESSION_ID,
        TARGET_CONTAINER_HOSTNAME,
    )
}
"""Client request headers the gateway hands to the instance: lower-cased → as sent."""

TARGET_MODEL_HEADER = TARGET_MODEL.decode()
MODEL_CACHE_HEADER = "X-Shipyard-Model-Cache"
"""``hit``: the model was in memory; ``miss``: the request waited for it to load."""
EVICTED_HEADER = "X-Shipyard-Evicted"
"""Models unloaded while serving this request: URL-quoted names, comma-separated."""
MODEL_TIMINGS_HEADER = "X-Shipyard-Model-Timings"
"""``wait=<s>;download=<s>;load=<s>;unload=<s>``, only the parts that happened."""
LOADED_MODELS_HEADER = "X-Shipyard-Loaded-Models"
"""How many models are in memory once the request is served."""
ERROR_HEADER = "X-Shipyard-Error"
"""On a platform error: the error's class name, e.g. ``ModelNotFound``."""
BATCH_HEADER = "X-Shipyard-Batch"
"""``size=<requests>;wait=<s>``: the batch that answered the request, and how long the
request waited in the instance's queue before that batch was cut."""

# Lower-cased, as both HTTP parsers hand header names over.
MODEL_CACHE = MODEL_CACHE_HEADER.lower().encode()
EVICTED = EVICTED_HEADER.lower().encode()
MODEL_TIMINGS = MODEL_TIMINGS_HEADER.lower().encode()
LOADED_MODELS = LOADED_MODELS_HEADER.lower().encode()
ERROR = ERROR_HEADER.lower().encode()
BATCH = BATCH_HEADER.lower().encode()

# Response streaming (InvokeEndpointWithResponseStream): the gateway asks for a streamed
# answer with RESPONSE_STREAM: true. The built-in runtime then answers chunked, one chunk
# per item its handlers yield, and names a random token in STREAM_ERROR; should the
# handlers raise once the answer has begun, its last chunk is that token followed by
# ``<ExcType>: <message>``, and the gateway ends the client's stream with ModelStreamError.
# (A truncated answer, the connection closed before its last chunk, means the same.)
RESPONSE_STREAM_HEADER = "X-Shipyard-Response-Stream"
STREAM_ERROR_HEADER = "X-Shipyard-Stream-Error"
RESPONSE_STREAM = RESPONSE_STREAM_HEADER.lower().encode()
STREAM_ERROR = STREAM_ERROR_HEADER.lower().encode()

MAX_MODEL_NAME_CHARS = 1024


def model_name_problem(name: str) -> str | None:
    """Why ``name`` is no safe TargetModel (a path relative to the prefix), or None."""
    if not name:
        return "it is empty"
    if len(name) > MAX_MODEL_NAME_CHARS:
        return f"it has {len(name)} characters, more than {MAX_MODEL_NAME_CHARS}"
    if name.startswith("/"):
        return "it is an absolute path; name a path relative to the model prefix"
    if "\\" in name:
        return "it contains a backslash"
    if not name.isprintable():
        return "it contains a control character"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "it has an empty, '.' or '..' path segment"
    return None


def model_url(prefix: str, name: str) -> str:
    """Where the artifact of ``name`` lives: ``<prefix>/<name>``, quoted in a file:// URI."""
    part = quote(name, safe="/") if prefix.startswith("file:") else name
    return f"{prefix.rstrip('/')}/{part}"


def format_timings(
    *,
    wait_s: float | None = None,
    download_s: float | None = None,
    load_s: float | None = None,
    unload_s: float | None = None,
) -> str:
    """The value of MODEL_TIMINGS_HEADER; empty when nothing happened."""
    parts = (("wait", wait_s), ("download", download_s), ("load", load_s), ("unload", unload_s))
    return ";".join(f"{key}={value:.6f}" for key, value in parts if value is not None)


def parse_timings(value: str) -> dict[str, float]:
    """MODEL_TIMINGS_HEADER back into seconds by part; unknown or broken parts are skipped."""
    timings: dict[str, float] = {}
    for part in value.split(";"):
        key, _, number = part.partition("=")
        try:
            timings[key.strip()] = float(number)
        except ValueError:
            continue
    return timings


def format_batch(size: int, wait_s: float) -> bytes:
    """The value of BATCH_HEADER."""
    return f"size={size};wait={wait_s:.6f}".encode()


def parse_batch(value: bytes) -> tuple[int, float] | None:
    """BATCH_HEADER back into (size, wait in seconds); None when it is not well formed."""
    size_part, _, wait_part = value.partition(b";")
    try:
        size = int(size_part.removeprefix(b"size="))
        wait_s = float(wait_part.removeprefix(b"wait="))
    except ValueError:
        return None
    return size, wait_s


def format_evicted(names: Sequence[str]) -> str:
    """The value of EVICTED_HEADER: each name URL-quoted, so commas in names survive."""
    return ",".join(quote(name, safe="") for name in names)


def parse_evicted(value: str) -> list[str]:
    """EVICTED_HEADER back into model names."""
    return [unquote(name) for name in value.split(",") if name]


# Shadow copies in bulk (routing/shadow.py → runtime/server.py). A copy's answer goes
# nowhere but the shadow's metrics, so the gateway sends the copies gathered while the
# last exchange ran in one request, and the instance answers each one's status and the
# seconds its invocation took: one exchange, not one per copy, in both processes.
#
# The request body is the copies one after another, each a COPY record (header count,
# body length), its headers (each a HEADER record, name length and value length, then
# the name and the value) and its body. The answer, 200 application/octet-stream, is one
# OUTCOME record (status, seconds) per copy, in order. An instance without the route
# answers 404; the gateway then sends that instance its copies one by one.
INVOCATIONS_PATH = b"/invocations"
COPIES_PATH = b"/copies"
COPIES_MEDIA_TYPE = b"application/x-shipyard-copies"
MAX_COPIES = 64
"""Most copies one ``POST /copies`` may carry; the instance refuses more."""
_COPY = struct.Struct(">HI")
_HEADER = struct.Struct(">HI")
_OUTCOME = struct.Struct(">Hd")


def pack_copies(copies: Sequence[tuple[Headers, bytes]]) -> bytes:
    """The body of a ``POST /copies``: each copy's headers and body."""
    parts: list[bytes] = []
    for headers, body in copies:
        parts.append(_COPY.pack(len(headers), len(body)))
        for name, value in headers:
            parts += (_HEADER.pack(len(name), len(value)), name, value)
        parts.append(body)
    return b"".join(parts)


def unpack_copies(data: bytes) -> list[tuple[Headers, bytes]]:
    """The copies in a ``POST /copies`` body, header names lower-cased as an HTTP
    parser hands them over; ValueError when the body is not such a sequence, or holds
    more than MAX_COPIES."""
    copies: list[tuple[Headers, bytes]] = []
    view = memoryview(data)
    at, end = 0, len(data)
    try:
        while at < end:
            if len(copies) == MAX_COPIES:
                raise ValueError(f"more than {MAX_COPIES} copies")
            count, length = _COPY.unpack_from(view, at)
            at += _COPY.size
            headers: Headers = []
            for _ in range(count):
                name_length, value_length = _HEADER.unpack_from(view, at)
                at += _HEADER.size
                name = bytes(view[at : at + name_length]).lower()
                at += name_length
                headers.append((name, bytes(view[at : at + value_length])))
                at += value_length
            if at + length > end:
                raise ValueError("a copy's body runs past the end")
            copies.append((headers, bytes(view[at : at + length])))
            at += length
    except struct.error as exc:
        raise ValueError(f"a copy is cut short: {exc}") from None
    if at != end:
        raise ValueError("a copy's headers run past the end")
    return copies


def pack_outcomes(outcomes: Sequence[tuple[int, float]]) -> bytes:
    """The answer to a ``POST /copies``: each copy's status and seconds, in order."""
    return b"".join(_OUTCOME.pack(status, seconds) for status, seconds in outcomes)


def unpack_outcomes(data: bytes, count: int) -> list[tuple[int, float]]:
    """``count`` copies' outcomes; ValueError when ``data`` holds another number."""
    if len(data) != count * _OUTCOME.size:
        raise ValueError(f"{len(data)} bytes are not the outcomes of {count} copies")
    return list(_OUTCOME.iter_unpack(data))
