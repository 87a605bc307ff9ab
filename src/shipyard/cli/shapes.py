"""A stack file's resource bodies checked against the shapes of the calls ``apply`` makes.

Each body in ``models``, ``endpoint_configs``, ``endpoints``, ``inference_components``
and ``alarms`` is the input of one Create (or Put) call less its name; ``scaling`` becomes
a RegisterScalableTarget and a PutScalingPolicy. botocore's own validator checks every one
against its service model's input shape, as boto3 would when the call is made, so a field
that boto3 would refuse half-way through an apply (an unknown member, a wrong type, a
missing required member) is found before anything changes, and named by line; so is a
member the gateway refuses as not done here (gateway/api/unsupported.py), and a variable of an
``Environment`` (a model's or component's container, a job template) that is the
gateway's own, which it refuses to every caller (host_access.gateway_variable_refusal).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shipyard.cli.stack import resource_id, scaling_body, scaling_calls
from shipyard.gateway.api import unsupported
from shipyard.host_access import gateway_variable_refusal
from shipyard.stackfile import Loc, StackFile, dotted, line_of, read_yaml

_SECTIONS = {
    # section: (service, operation, the member that takes the section's key)
    "models": ("sagemaker", "CreateModel", "ModelName"),
    "endpoint_configs": ("sagemaker", "CreateEndpointConfig", "EndpointConfigName"),
    "endpoints": ("sagemaker", "CreateEndpoint", "EndpointName"),
    "inference_components": ("sagemaker", "CreateInferenceComponent", "InferenceComponentName"),
    "alarms": ("cloudwatch", "PutMetricAlarm", "AlarmName"),
}
_SCALING = "application-autoscaling"


def check(path: Path, stack: StackFile, stack_name: str) -> list[str]:
    """Every way ``path``'s bodies break their calls' shapes, one line each:
    ``<path>:<line>: <field>: <message>``; empty when there is none. ``stack_name`` is
    the stack the calls are made for (it names the scaling policy)."""
    data, lines = read_yaml(path)
    out = []
    for loc, message in _errors(data, stack, stack_name):
        line = line_of(loc, lines)
        where = f"{path}:{line}" if line else str(path)
        field = dotted(tuple(int(p) if p.isdigit() else p for p in loc))
        out.append(f"{where}: {field}: {message}")
    return out


def _errors(
    data: Mapping[str, Any], stack: StackFile, stack_name: str
) -> Iterator[tuple[Loc, str]]:
    for section, (service, operation, name_member) in _SECTIONS.items():
        bodies = data.get(section) or {}
        for name, body in bodies.items():
            params = {name_member: str(name), **(body or {})}
            for loc, message in _validate(service, operation, params):
                yield (section, str(name), *loc), message
            if service == "sagemaker":
                for where, why in unsupported.refusals(operation, params):
                    yield (section, str(name), *map(str, where)), f"not supported: {why}"
    for key, target in stack.scaling.items():
        # The very calls converge makes (cli/converge.py), from the checked section.
        rid = resource_id(key)
        for operation, params in scaling_calls(stack_name, rid, scaling_body(target)):
            for loc, message in _validate(_SCALING, operation, params):
                # The section flattens the policy: its members sit beside MinCapacity.
                field = (
                    loc[-1:] if loc[:1] == ("TargetTrackingScalingPolicyConfiguration",) else loc
                )
                yield ("scaling", key, *field), message
    yield from _gateway_variables(data, ())


def _gateway_variables(value: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Each variable of an ``Environment`` anywhere in the file (models' and components'
    containers, job templates) that the gateway refuses to any caller as its own."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if key == "Environment" and isinstance(inner, Mapping):
                for name in inner:
                    if (why := gateway_variable_refusal(str(name))) is not None:
                        yield (*loc, "Environment", str(name)), why
            else:
                yield from _gateway_variables(inner, (*loc, str(key)))
    elif isinstance(value, list):
        for n, inner in enumerate(value):
            yield from _gateway_variables(inner, (*loc, str(n)))


def _validate(service: str, operation: str, params: dict[str, Any]) -> list[tuple[Loc, str]]:
    """(where under ``params``, what is wrong) for each error botocore's validator finds."""
    from botocore.validate import ParamValidator, ValidationErrors

    from shipyard.gateway.wire.validation import service_model

    shape = service_model(service).operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    found: list[tuple[Loc, str]] = []
    for reason, name, extra in report._errors:  # botocore keeps them as (reason, name, extra)
        loc = _loc(name)
        if reason == "unknown field":
            loc = (*loc, str(extra["unknown_param"]))
            message = f"unknown field; valid here: {', '.join(extra['valid_names'])}"
        elif reason == "missing required field":
            loc = (*loc, str(extra["required_name"]))
            message = "required field missing"
        elif reason == "invalid type":
            wanted = ", ".join(re.sub(r"<class '(\w+)'>", r"\1", t) for t in extra["valid_types"])
            message = f"expected {wanted}, got {type(extra['param']).__name__} {extra['param']!r}"
        elif reason in ("invalid length", "invalid range"):
            what = "length" if reason == "invalid length" else "value"
            message = f"{what} below the minimum {extra['min_allowed']}"
        else:
            message = ValidationErrors()._format_error((reason, name, extra))
        found.append((loc, message))
    return found


def _loc(name: str) -> Loc:
    """botocore's ``.ProductionVariants[0].Foo`` (a map value ``.Environment.KEY``, a map
    key ``.Environment (key: KEY)``) as ``("ProductionVariants", "0", "Foo")``."""
    name = re.sub(r" \(key: (.*)\)$", r".\1", name)
    return tuple(part for part in re.split(r"[.\[\]]+", name) if part)
