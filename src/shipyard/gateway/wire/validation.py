"""Validation of control-plane requests against botocore's service model.

boto3 checks only minimums client-side (and nothing at all with parameter validation
switched off), so a request SageMaker would refuse reaches us intact. Rather than
hand-write constraints, we read them from the model boto3 itself ships and enforce each
the way SageMaker's front end does:

- a value of the wrong JSON type fails deserialisation, before any constraint is
  looked at: ``SerializationException``, raised at the first one found;
- every constraint violation (required, length, range, pattern, enum) is collected into
  one ``InvalidParameter`` worded as AWS words it, e.g. ``1 validation error detected:
  Value 'x!' at 'productionVariants.1.member.variantName' failed to satisfy constraint:
  Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}``.

Paths use lowerCamelCase member names and 1-based ``N.member`` list steps, as AWS does.
Map keys and values are reported once per map, on the map, with every constraint of the
key or value shape listed (``Map value must satisfy constraint: [...]``), again as AWS
does. Unknown members are ignored, as AWS ignores them.

Java's Unicode classes (``\\p{L}``: tag keys and values, descriptions) are compiled with
the ``regex`` package, which has them. A SageMaker request's ``Tags`` are held to what
its Tag shape documents beyond the patterns: keys unique, none beginning ``aws:``.

Known gaps, all on the lenient side: patterns neither can compile (Java's surrogate
ranges, a quantifier after ``$``) are not enforced, only their lengths are; union
shapes are not checked for "exactly one member set"; lengths count code points.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import botocore.session
import regex

from shipyard.errors import InvalidParameter, SerializationException, UnknownOperation

logger = logging.getLogger(__name__)

_INTEGER_RANGES = {"integer": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_TARGET_NAMES = {
    "string": "a String",
    "blob": "a Blob",
    "integer": "an Integer",
    "long": "a Long",
    "float": "a Float",
    "double": "a Double",
    "boolean": "a Boolean",
    "timestamp": "a Timestamp",
    "structure": "a Structure",
    "list": "a List",
    "map": "a Map",
}
_CONTAINERS = frozenset({"structure", "list", "map"})
_EPOCH_SECONDS = (-62_135_596_800.0, 253_402_300_799.0)  # 0001-01-01 to 9999-12-31, UTC


class Matcher(Protocol):
    """A compiled pattern, of ``re`` or of ``regex``."""

    def fullmatch(self, string: str) -> object | None: ...


@dataclass(eq=False, repr=False, slots=True)
class _Rule:
    """The constraints of one shape, flattened out of botocore for a fast walk.

    Built once per shape; ``members``, ``item`` and ``key`` are filled after the rule
    is cached, so recursive shapes point back at themselves instead of looping.
    """

    kind: str
    min: float | None = None
    max: float | None = None
    pattern: Matcher | None = None
    pattern_text: str = ""
    enum: frozenset[str] = frozenset()
    enum_text: str = ""
    sensitive: bool = False
    # (wire name, lowerCamelCase path name, rule) in the model's order.
    members: tuple[tuple[str, str, _Rule], ...] = ()
    required: frozenset[str] = frozenset()
    item: _Rule | None = None  # a list's member or a map's value
    key: _Rule | None = None  # a map's key
    constraints: list[str] = field(default_factory=list)  # every phrase, for maps


class RequestValidator:
    """Validates control-plane requests against botocore's service model.

    The model is read once, at construction (a fraction of a second), and turned into
    plain rules; ``validate`` then only walks the request, so a typical request takes
    tens of microseconds. Safe to share between threads: nothing changes after
    ``__init__``.
    """

    def __init__(
        self, service_name: str = "sagemaker", *, unpatterned: frozenset[str] = frozenset()
    ) -> None:
        """``unpatterned`` names shapes whose pattern is not enforced (lengths still are):
        shipyard accepts ``file://`` URLs and ``cmd:`` images where AWS accepts only its own.
        """
        self._model = service_model(service_name)
        self._service_name = service_name
        self._unpatterned = unpatterned
        self._names = frozenset(str(name) for name in self._model.operation_names)
        self._rules: dict[str, _Rule] = {}
        self._operations: dict[str, _Rule | None] = {}
        """Each operation's rule, built on its first request (a gateway's start would
        otherwise walk every shape of the model); published only once complete."""
        self._building = threading.Lock()

    def __repr__(self) -> str:
        return f"RequestValidator(service={self._service_name!r}, operations={len(self._names)})"

    def has_operation(self, name: str) -> bool:
        """Whether ``name`` (an action such as ``CreateEndpoint``) is in the model."""
        return name in self._names

    def validate(self, operation: str, params: object) -> None:
        """Check ``params`` (the decoded JSON body) against ``operation``'s input shape.

        Raises:
            UnknownOperation: ``operation`` is not in the service model.
            SerializationException: ``params`` is not a JSON object, or a member has the
                wrong JSON type.
            InvalidParameter: one or more constraints are broken; all are listed.
        """
        if operation not in self._names:
            raise UnknownOperation(f"Unknown operation {operation!r}.")
        if not isinstance(params, dict):
            raise _type_error("structure", params, "")
        rule = self._operation_rule(operation)
        if rule is None:
            return
        errors: list[str] = []
        _check_structure(rule, params, "", errors)
        _check_tags(params.get("Tags"), errors)
        if errors:
            plural = "error" if len(errors) == 1 else "errors"
            raise InvalidParameter(
                f"{len(errors)} validation {plural} detected: " + "; ".join(errors)
            )

    def _operation_rule(self, operation: str) -> _Rule | None:
        try:
            return self._operations[operation]
        except KeyError:
            pass
        # Rules are cached before their members are filled (recursive shapes), so they
        # are built under a lock, and another thread sees an operation's rule only once
        # every rule under it is whole.
        with self._building:
            if operation not in self._operations:
                shape = self._model.operation_model(operation).input_shape
                self._operations[operation] = None if shape is None else self._rule_for(shape)
            return self._operations[operation]

    # botocore ships no type hints, so its shapes are Any here and nowhere else.
    def _rule_for(self, shape: Any) -> _Rule:
        cached = self._rules.get(shape.name)
        if cached is not None:
            return cached
        meta = shape.metadata
        rule = _Rule(kind=str(shape.type_name), min=meta.get("min"), max=meta.get("max"))
        self._rules[shape.name] = rule
        if "pattern" in meta and shape.name not in self._unpatterned:
            rule.pattern = _compile(meta["pattern"])
            # botocore strips the anchors; AWS's messages show the leading one.
            rule.pattern_text = "^" + meta["pattern"].removeprefix("^")
        if "enum" in meta:
            rule.enum = frozenset(meta["enum"])
            rule.enum_text = ", ".join(meta["enum"])
        rule.sensitive = bool(meta.get("sensitive", False))
        if rule.kind == "structure":
            rule.required = frozenset(shape.required_members)
            rule.members = tuple(
                (
                    str(member.serialization.get("name", name)),
                    name[:1].lower() + name[1:],
                    self._rule_for(member),
                )
                for name, member in shape.members.items()
            )
        elif rule.kind == "list":
            rule.item = self._rule_for(shape.member)
        elif rule.kind == "map":
            rule.key = self._rule_for(shape.key)
            rule.item = self._rule_for(shape.value)
            rule.sensitive = rule.sensitive or rule.key.sensitive or rule.item.sensitive
        rule.constraints = _constraints(rule)
        return rule


@functools.cache
def service_model(service: str) -> Any:
    """botocore's model of ``service`` (``sagemaker``, ``sagemaker-runtime``, ...), read
    once per process for every reader of it: each read parses the model's JSON anew."""
    return _session().get_service_model(service)


@functools.cache
def _session() -> botocore.session.Session:
    return botocore.session.get_session()


@functools.cache
def _compile(pattern: str) -> Matcher | None:
    """Compile one of the model's (Java) patterns, or None when neither Python's ``re``
    nor ``regex`` can.

    ASCII mode because Java's ``\\w``, ``\\d`` and ``\\s`` are ASCII-only by default;
    a pattern with Unicode property classes (``\\p{L}``, which ``re`` has not) is
    compiled by ``regex`` without it, since Java's property classes are Unicode's.
    """
    try:
        return re.compile(pattern, re.ASCII)
    except re.error as exc:
        if "\\p{" not in pattern:
            logger.debug("pattern %r not enforced: %s", pattern, exc)
            return None
    try:
        compiled: Matcher = regex.compile(pattern)
    except regex.error as exc:
        logger.debug("pattern %r not enforced: %s", pattern, exc)
        return None
    return compiled


def _check_tags(tags: object, errors: list[str]) -> None:
    """What botocore's Tag documents beyond its patterns: "Tag keys must be unique per
    resource", and ``aws:`` is AWS's own prefix."""
    if not isinstance(tags, list):
        return
    keys: list[str] = []
    for tag in tags:
        key = tag.get("Key") if isinstance(tag, dict) else None
        if isinstance(key, str):
            keys.append(key)
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        errors.append(f"Tag keys must be unique per resource: {', '.join(repeated)} repeated")
    reserved = sorted(k for k in set(keys) if k.lower().startswith("aws:"))
    if reserved:
        errors.append(f"Tag keys may not begin with the reserved prefix aws: {', '.join(reserved)}")


def _constraints(rule: _Rule) -> list[str]:
    """Every constraint of a scalar shape, worded as AWS lists them for map entries."""
    if rule.kind in _CONTAINERS:
        return []
    found = []
    noun = "length" if rule.kind in ("string", "blob") else "value"
    if rule.max is not None:
        found.append(f"Member must have {noun} less than or equal to {rule.max}")
    if rule.min is not None:
        found.append(f"Member must have {noun} greater than or equal to {rule.min}")
    if rule.pattern_text:
        found.append(f"Member must satisfy regular expression pattern: {rule.pattern_text}")
    if rule.enum:
        found.append(f"Member must satisfy enum value set: [{rule.enum_text}]")
    return found


def _check(rule: _Rule, value: object, path: str, errors: list[str]) -> None:
    if rule.kind == "structure":
        _check_structure(rule, value, path, errors)
    elif rule.kind == "list":
        _check_list(rule, value, path, errors)
    elif rule.kind == "map":
        _check_map(rule, value, path, errors)
    else:
        for phrase in _scalar_violations(rule, value, path):
            errors.append(_describe(rule, value, path, phrase))


def _check_structure(rule: _Rule, value: object, path: str, errors: list[str]) -> None:
    if not isinstance(value, dict):
        raise _type_error("structure", value, path)
    prefix = f"{path}." if path else ""
    for wire_name, path_name, member in rule.members:
        item = value.get(wire_name)
        if item is None:  # JSON null is absence, as in AWS's deserialiser
            if wire_name in rule.required:
                errors.append(_not_null(prefix + path_name))
            continue
        _check(member, item, prefix + path_name, errors)


def _check_list(rule: _Rule, value: object, path: str, errors: list[str]) -> None:
    if not isinstance(value, list):
        raise _type_error("list", value, path)
    for phrase in _length_violations(rule, len(value)):
        errors.append(_describe(rule, value, path, phrase))
    assert rule.item is not None  # every list shape has a member shape
    for index, item in enumerate(value, start=1):
        item_path = f"{path}.{index}.member"
        if item is None:
            errors.append(_not_null(item_path))
        else:
            _check(rule.item, item, item_path, errors)


def _check_map(rule: _Rule, value: object, path: str, errors: list[str]) -> None:
    if not isinstance(value, dict):
        raise _type_error("map", value, path)
    for phrase in _length_violations(rule, len(value)):
        errors.append(_describe(rule, value, path, phrase))
    assert rule.key is not None and rule.item is not None  # every map shape has both
    key_rule, value_rule = rule.key, rule.item
    if any(_scalar_violations(key_rule, key, path) for key in value):
        keys = ", ".join(key_rule.constraints)
        errors.append(_describe(rule, value, path, f"Map keys must satisfy constraint: [{keys}]"))
    if value_rule.kind in _CONTAINERS:
        for key, item in value.items():
            if item is None:
                errors.append(_not_null(f"{path}.{key}"))
            else:
                _check(value_rule, item, f"{path}.{key}", errors)
        return
    has_null = any(item is None for item in value.values())
    if has_null or any(_scalar_violations(value_rule, item, path) for item in value.values()):
        phrases = ["Member must not be null"] if has_null else []
        values = ", ".join(phrases + value_rule.constraints)
        errors.append(
            _describe(rule, value, path, f"Map value must satisfy constraint: [{values}]")
        )


def _scalar_violations(rule: _Rule, value: object, path: str) -> list[str]:
    """The broken constraints of one scalar, after its JSON type has been checked."""
    if value is None:  # only a null map value gets here; the caller reports it
        return []
    check = _SCALAR_CHECKS.get(rule.kind)
    return [] if check is None else check(rule, value, path)


def _string(rule: _Rule, value: object, path: str) -> list[str]:
    if not isinstance(value, str):
        raise _type_error(rule.kind, value, path)
    found = _length_violations(rule, len(value))
    if rule.pattern is not None and rule.pattern.fullmatch(value) is None:
        found.append(f"Member must satisfy regular expression pattern: {rule.pattern_text}")
    if rule.enum and value not in rule.enum:
        found.append(f"Member must satisfy enum value set: [{rule.enum_text}]")
    return found


def _blob(rule: _Rule, value: object, path: str) -> list[str]:
    if not isinstance(value, str):
        raise _type_error(rule.kind, value, path)
    try:
        data = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise SerializationException(f"Invalid Base64 data{_at(path)}") from None
    return _length_violations(rule, len(data))


def _integer(rule: _Rule, value: object, path: str) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(rule.kind, value, path)
    if isinstance(value, float):
        if not value.is_integer():  # 1.5, inf and nan alike
            raise _type_error(rule.kind, value, path)
        value = int(value)
    low, high = _INTEGER_RANGES[rule.kind]
    if not low <= value <= high:
        raise _type_error(rule.kind, value, path)
    return _range_violations(rule, value)


def _floating(rule: _Rule, value: object, path: str) -> list[str]:
    return _range_violations(rule, _finite(rule, value, path))


def _finite(rule: _Rule, value: object, path: str) -> float:
    """``value`` as a finite double, or the type error a Java deserialiser gives."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(rule.kind, value, path)
    try:
        number = float(value)  # an integer of 400 digits is no double
    except OverflowError:
        raise _type_error(rule.kind, value, path) from None
    if not math.isfinite(number):
        raise _type_error(rule.kind, value, path)
    return number


def _boolean(rule: _Rule, value: object, path: str) -> list[str]:
    if not isinstance(value, bool):
        raise _type_error(rule.kind, value, path)
    return []


def _timestamp(rule: _Rule, value: object, path: str) -> list[str]:
    # AWS JSON 1.1 sends timestamps as epoch seconds, fractional or not; a moment
    # outside the years 1 to 9999 is no timestamp anything downstream can hold.
    seconds = _finite(rule, value, path)
    if not _EPOCH_SECONDS[0] <= seconds <= _EPOCH_SECONDS[1]:
        raise _type_error(rule.kind, value, path)
    return []


_SCALAR_CHECKS: dict[str, Callable[[_Rule, object, str], list[str]]] = {
    "string": _string,
    "blob": _blob,
    "integer": _integer,
    "long": _integer,
    "float": _floating,
    "double": _floating,
    "boolean": _boolean,
    "timestamp": _timestamp,
}


def _length_violations(rule: _Rule, length: int) -> list[str]:
    found = []
    if rule.max is not None and length > rule.max:
        found.append(f"Member must have length less than or equal to {rule.max}")
    if rule.min is not None and length < rule.min:
        found.append(f"Member must have length greater than or equal to {rule.min}")
    return found


def _range_violations(rule: _Rule, number: float) -> list[str]:
    found = []
    if rule.max is not None and number > rule.max:
        found.append(f"Member must have value less than or equal to {rule.max}")
    if rule.min is not None and number < rule.min:
        found.append(f"Member must have value greater than or equal to {rule.min}")
    return found


def _describe(rule: _Rule, value: object, path: str, phrase: str) -> str:
    # Sensitive values (secrets) are left out of the message, as AWS leaves them out.
    shown = "Value" if rule.sensitive else f"Value '{_render(value)}'"
    return f"{shown} at '{path}' failed to satisfy constraint: {phrase}"


def _not_null(path: str) -> str:
    return f"Value null at '{path}' failed to satisfy constraint: Member must not be null"


def _render(value: object) -> str:
    """A value as AWS's (Java) messages print it: raw strings, ``[a, b]``, ``{k=v}``."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_render(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}={_render(item)}" for key, item in value.items()) + "}"
    return str(value)


def _type_error(kind: str, value: object, path: str) -> SerializationException:
    """AWS's deserialiser wording for a value of the wrong JSON type, plus where it was."""
    if isinstance(value, dict):
        text = "Start of structure or map found where not expected."
    elif isinstance(value, list):
        text = "Start of list found where not expected."
    else:
        text = f"{_token(value)} can not be converted to {_TARGET_NAMES.get(kind, kind)}"
    return SerializationException(text + _at(path))


def _token(value: object) -> str:
    if isinstance(value, bool):
        return "BOOLEAN_VALUE"
    if isinstance(value, str):
        return "STRING_VALUE"
    if isinstance(value, int | float):
        return "NUMBER_VALUE"
    return "NULL_VALUE" if value is None else f"{type(value).__name__.upper()}_VALUE"


def _at(path: str) -> str:
    return f" (at '{path}')" if path else ""
