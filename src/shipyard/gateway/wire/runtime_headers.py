"""The sagemaker-runtime request headers' limits, read from botocore's service model.

boto3 checks none of the maxima client-side, so the runtime doors enforce them the way
SageMaker's front end does: a header longer than its member's ``max`` (Custom-Attributes
over 1,024 characters, an Inference-Id over 64, ...) is a ``ValidationError`` worded as
AWS words it. The table is built once at import; a request pays a dict lookup per header.

Patterns are Java's and mostly beyond Python's ``re`` (``\\p{Print}``): what matters of
them is enforced by hand. Identifiers (``\\A\\S[\\p{Print}]*\\z``) must be printable
ASCII not starting with a space, and the ASCII-only members (``\\p{ASCII}*``) ASCII.
The names (TargetVariant, TargetContainerHostname, InferenceComponentName) have plain
patterns of ASCII letters, digits and hyphens, which ``re`` matches as they are, over the
whole value as AWS's validation does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shipyard.errors import RuntimeValidationError
from shipyard.gateway.wire.validation import service_model

_IDENTIFIER = r"\A\S[\p{Print}]*\z"
_ASCII = r"\p{ASCII}*"
_NAMES = frozenset({"TargetVariant", "TargetContainerHostname", "InferenceComponentName"})
"""SessionId is left to routing/sessions.py: the stream door's pattern has no NEW_SESSION,
which shipyard takes there too."""


@dataclass(frozen=True, slots=True)
class _Limit:
    member: str  # lowerCamelCase, as AWS names it in its messages
    min: int
    max: int
    identifier: bool
    ascii: bool
    pattern: re.Pattern[bytes] | None = None
    """A name's pattern, matched over the whole value."""


def _limits(operation: str) -> dict[bytes, _Limit]:
    model = service_model("sagemaker-runtime")
    shape = model.operation_model(operation).input_shape
    limits: dict[bytes, _Limit] = {}
    for name, member in shape.members.items():
        if member.serialization.get("location") != "header" or member.type_name != "string":
            continue
        meta = member.metadata
        wire = member.serialization["name"].lower().encode()
        pattern = meta.get("pattern", "")
        limits[wire] = _Limit(
            member=name[0].lower() + name[1:],
            min=int(meta.get("min", 0)),
            max=int(meta.get("max", 1 << 20)),
            identifier=pattern == _IDENTIFIER,
            ascii=pattern == _ASCII,
            pattern=re.compile(pattern.encode()) if name in _NAMES and pattern else None,
        )
    return limits


INVOKE_ENDPOINT = _limits("InvokeEndpoint")
INVOKE_ENDPOINT_ASYNC = _limits("InvokeEndpointAsync")
INVOKE_ENDPOINT_STREAM = _limits("InvokeEndpointWithResponseStream")


def check_header(limits: dict[bytes, _Limit], key: bytes, value: bytes) -> None:
    """Raise ValidationError when ``value`` breaks the limits of header ``key``."""
    limit = limits.get(key)
    if limit is None:
        return
    size = len(value)
    if size > limit.max:
        _refuse(limit, value, f"Member must have length less than or equal to {limit.max}")
    if size < limit.min:
        _refuse(limit, value, f"Member must have length greater than or equal to {limit.min}")
    if limit.identifier:
        if not (value.isascii() and value.decode("ascii").isprintable()) or value[:1] == b" ":
            _refuse(limit, value, f"Member must satisfy regular expression pattern: {_IDENTIFIER}")
    elif limit.ascii and not value.isascii():
        _refuse(limit, value, f"Member must satisfy regular expression pattern: {_ASCII}")
    elif limit.pattern is not None and limit.pattern.fullmatch(value) is None:
        pattern = limit.pattern.pattern.decode()
        _refuse(limit, value, f"Member must satisfy regular expression pattern: {pattern}")


def _refuse(limit: _Limit, value: bytes, constraint: str) -> None:
    shown = value[:64].decode("latin-1") + ("..." if len(value) > 64 else "")
    raise RuntimeValidationError(
        f"1 validation error detected: Value '{shown}' at '{limit.member}' failed to satisfy "
        f"constraint: {constraint}"
    )
