"""docs/reference/api-coverage.md: every operation of the services shipyard speaks, as
botocore's own models list them, marked by what the gateway serves.

Served is computed, not written: the control plane's operations are those of the action
registry's families (gateway/actions), the runtime's those of the runtime doors below;
an operation with members the gateway refuses by name (gateway/api/unsupported.py) is
partly served, and its note lists them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import botocore
import botocore.session

from shipyard.gateway.api.actions import FAMILIES
from shipyard.gateway.api.unsupported import TABLE, refused_paths
from shipyard.reference.markdown import code, page, table

SERVICES = ("sagemaker", "sagemaker-runtime", "application-autoscaling", "cloudwatch", "logs")
"""botocore's names of the services covered, in the page's order."""

RUNTIME_DOORS = {
    "InvokeEndpoint": "/endpoints/{EndpointName}/invocations",
    "InvokeEndpointAsync": "/endpoints/{EndpointName}/async-invocations",
    "InvokeEndpointWithResponseStream": "/endpoints/{EndpointName}/invocations-response-stream",
}
"""sagemaker-runtime's operations and the path of the door that serves each (the runtime
doors, gateway/doors/runtime.py, async_invocations.py and streaming.py, routed in app.py)."""

SERVED, PARTLY, NOT_SERVED = "served", "partly", "not served"


def served() -> dict[str, set[str]]:
    """botocore's service name -> the operations the gateway serves."""
    out: dict[str, set[str]] = defaultdict(set)
    for service, family, _ in FAMILIES:
        out[service.botocore].update(family)
    out["sagemaker-runtime"].update(RUNTIME_DOORS)
    return out


def refused() -> dict[str, list[str]]:
    """Operation -> the members it refuses (paths of gateway/api/unsupported.py's table)."""
    return {row.operation: refused_paths(row.operation) for row in TABLE}


def statuses() -> dict[str, dict[str, tuple[str, str]]]:
    """Service -> operation -> (status, note as Markdown), for every operation of
    botocore's model of each service, and any the gateway serves beyond it."""
    session = botocore.session.get_session()
    doing, refusing = served(), refused()
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for name in SERVICES:
        model = session.get_service_model(name)
        known = set(model.operation_names)
        rows: dict[str, tuple[str, str]] = {}
        for operation in sorted(known | doing[name]):
            rows[operation] = _status(name, operation, doing[name], refusing, known)
        if name == "sagemaker-runtime":
            for operation, path in RUNTIME_DOORS.items():
                if operation in known:
                    uri = model.operation_model(operation).http["requestUri"]
                    if uri != path:
                        raise ValueError(f"{operation}: botocore sends it to {uri}, not {path}")
        out[name] = rows
    return out


def _status(
    service: str,
    operation: str,
    doing: set[str],
    refusing: Mapping[str, list[str]],
    known: set[str],
) -> tuple[str, str]:
    if operation not in doing:
        return NOT_SERVED, ""
    if operation not in known:
        return SERVED, "not in this botocore's model of the service"
    if operation in refusing:
        members = ", ".join(code(path) for path in refusing[operation])
        return PARTLY, f"refuses by name (InvalidParameter): {members}"
    if service == "sagemaker-runtime":
        return SERVED, "POST " + code(RUNTIME_DOORS[operation])
    return SERVED, ""


def render() -> str:
    every = statuses()
    summary = []
    for name, rows in every.items():
        counts = {s: sum(1 for status, _ in rows.values() if status == s) for s in _ORDER}
        summary.append((code(name), *(str(counts[s]) for s in _ORDER), str(len(rows))))
    sections = [
        "## Summary\n",
        table(("Service", "Served", "Partly", "Not served", "Operations"), summary),
    ]
    for name, rows in every.items():
        sections.append(f"## `{name}`\n")
        sections.append(
            table(
                ("Operation", "Status", "Note"),
                ((code(op), status, note) for op, (status, note) in rows.items()),
            )
        )
    intro = " ".join(_INTRO.format(version=botocore.__version__).split())
    return page("API coverage", intro, *sections)


_ORDER = (SERVED, PARTLY, NOT_SERVED)

_INTRO = """Every operation of the AWS services shipyard speaks, as botocore {version}'s
service models list them, and whether this gateway serves it: *served*, *partly* (served,
with members refused by name: a request that gives one is answered InvalidParameter
naming it, rather than accepted and not honoured) or *not served* (answered
UnknownOperationException). Served requests are checked against the same models. A
newer botocore may list operations this page does not; they are not served."""
