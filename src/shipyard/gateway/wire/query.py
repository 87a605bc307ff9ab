"""The AWS query protocol: a form body in, XML out, as botocore sent CloudWatch's calls
before its JSON protocol (and older SDKs still do).

``params`` turns ``Action=PutMetricAlarm&Dimensions.member.1.Name=...`` into the JSON
object the actions take, walking botocore's input shape: lists are ``Name.member.N``,
maps ``Name.entry.N.key`` / ``.value``, structures ``Name.Member``, timestamps ISO 8601
or epoch seconds. ``render`` writes an answer as ``<ActionResponse><ActionResult>`` by
the output shape; ``error`` writes ``<ErrorResponse>``. Written by hand: botocore has a
query serialiser and an XML parser, the client halves; these are their server halves,
shape-driven so that every action of the service is covered at once.
"""

from __future__ import annotations

import urllib.parse
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

from shipyard.errors import SerializationException, ShipyardError

_MAX_FIELDS = 10_000
_MAX_INDEX = 10_000


def params(body: bytes, shape: Any) -> dict[str, Any]:
    """The request's members by ``shape`` (botocore's input shape); unknown fields are
    ignored, as AWS ignores them; malformed ones are SerializationException."""
    try:
        form = urllib.parse.parse_qs(
            body.decode("utf-8"), keep_blank_values=True, max_num_fields=_MAX_FIELDS
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise SerializationException(f"Request body is not a valid form: {exc}") from None
    flat = {k: v[-1] for k, v in form.items() if k not in ("Action", "Version")}
    if shape is None:
        return {}
    return _structure(shape, flat, "")


def _structure(shape: Any, flat: dict[str, str], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, member in shape.members.items():
        key = f"{prefix}{name}"
        value = _value(member, flat, key)
        if value is not None:
            out[name] = value
    return out


def _value(shape: Any, flat: dict[str, str], key: str) -> Any:
    kind = shape.type_name
    if kind == "structure":
        if not any(k.startswith(key + ".") for k in flat):
            return None
        return _structure(shape, flat, key + ".")
    if kind == "list":
        items = []
        for n in range(1, _MAX_INDEX):
            item = _value(shape.member, flat, f"{key}.member.{n}")
            if item is None:
                break
            items.append(item)
        if not items and flat.get(key) == "":
            return []  # an empty list is sent as "Name="
        return items or None
    if kind == "map":
        entries: dict[str, Any] = {}
        for n in range(1, _MAX_INDEX):
            name = flat.get(f"{key}.entry.{n}.key")
            if name is None:
                break
            entries[name] = _value(shape.value, flat, f"{key}.entry.{n}.value")
        return entries or None
    raw = flat.get(key)
    if raw is None:
        return None
    return _scalar(kind, raw, key)


def _scalar(kind: str, raw: str, key: str) -> Any:
    try:
        if kind in ("integer", "long"):
            return int(raw)
        if kind in ("float", "double"):
            return float(raw)
        if kind == "boolean":
            if raw not in ("true", "false"):
                raise ValueError("not true or false")
            return raw == "true"
        if kind == "timestamp":
            try:
                return float(raw)
            except ValueError:
                return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise SerializationException(f"{key}: {raw[:100]!r} is not a {kind}: {exc}") from None
    return raw


def render(action: str, result: dict[str, Any], shape: Any, xmlns: str, request_id: str) -> bytes:
    """``<{action}Response>`` with ``result`` written by ``shape`` (the output shape)."""
    inner = "" if shape is None else _members(shape, result)
    return (
        f'<{action}Response xmlns="{xmlns}"><{action}Result>{inner}</{action}Result>'
        f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
        f"</{action}Response>"
    ).encode()


def _members(shape: Any, value: dict[str, Any]) -> str:
    parts = []
    for name, member in shape.members.items():
        if name in value and value[name] is not None:
            parts.append(f"<{name}>{_xml(member, value[name])}</{name}>")
    return "".join(parts)


def _xml(shape: Any, value: Any) -> str:
    kind = shape.type_name
    if kind == "structure":
        return _members(shape, value) if isinstance(value, dict) else ""
    if kind == "list":
        return "".join(f"<member>{_xml(shape.member, item)}</member>" for item in value)
    if kind == "map":
        return "".join(
            f"<entry><key>{escape(str(k))}</key><value>{_xml(shape.value, v)}</value></entry>"
            for k, v in value.items()
        )
    if kind == "timestamp":
        when = value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)
        return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if kind == "boolean":
        return "true" if value else "false"
    return escape(str(value))


def error(exc: Exception, request_id: str) -> tuple[int, bytes]:
    """Status and ``<ErrorResponse>`` body of a failed call."""
    if not isinstance(exc, ShipyardError):
        status, code, message = 500, "InternalFailure", "An internal error occurred."
    else:
        status, code, message = exc.status_code, exc.wire_type, exc.message
    kind = "Receiver" if status >= 500 else "Sender"
    body = (
        f"<ErrorResponse><Error><Type>{kind}</Type><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error><RequestId>{request_id}</RequestId>"
        "</ErrorResponse>"
    )
    return status, body.encode()
