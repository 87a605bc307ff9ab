"""AddTags, ListTags, DeleteTags."""

from __future__ import annotations

from typing import Any

from shipyard.control.endpoints import EndpointService
from shipyard.errors import InvalidParameter
from shipyard.gateway.api.actions.listing import offset, token

_MAX_RESULTS = 50


def add_tags(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    svc.tagging.add(p["ResourceArn"], p["Tags"])
    return {"Tags": p["Tags"]}


def list_tags(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    tags = svc.tagging.get(p["ResourceArn"])
    size = int(p.get("MaxResults", _MAX_RESULTS))
    if size < 1:
        raise InvalidParameter("MaxResults must be at least 1.")
    start = offset(p.get("NextToken"))
    out: dict[str, Any] = {"Tags": tags[start : start + size]}
    if start + size < len(tags):
        out["NextToken"] = token(start + size)
    return out


def delete_tags(svc: EndpointService, p: dict[str, Any]) -> dict[str, Any]:
    svc.tagging.delete(p["ResourceArn"], p["TagKeys"])
    return {}


ACTIONS = {"AddTags": add_tags, "ListTags": list_tags, "DeleteTags": delete_tags}
