"""``GET /stack`` and ``PUT /stack``: the stack file's topics and jobs sections, live.

``shipyard apply`` reads them to plan and puts what changed (stack_config.py
says who may change what). Answers are JSON; a refused change is 400 with
``{"message": ...}`` and changes nothing.

Notification URLs carry passwords and tokens (a mail server's, a webhook's: in its
user part, its path, its query or the headers apprise reads from it). Only a caller who
may put them (``shipyard:PutStack``, the operator's power: ``apply`` compares them with
its file's) reads them whole; any other key allowed ``shipyard:GetStack`` (a console's
``shipyard:Get*``) reads each as its scheme and host alone.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shipyard.errors import ShipyardError
from shipyard.gateway.api.control import read_body
from shipyard.gateway.edge.auth import admitted
from shipyard.stack_config import StackChange, StackConfig

MAX_BODY_BYTES = 1 << 20


class StackConfigDoor:
    """Translates ``/stack`` into StackConfig calls."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config

    def __repr__(self) -> str:
        return f"StackConfigDoor({self.config!r})"

    async def get(self, request: Request) -> Response:
        snapshot = self.config.snapshot()
        if not admitted(request.scope).may("shipyard:PutStack"):
            snapshot = _masked(snapshot)
        return JSONResponse(snapshot)

    async def put(self, request: Request) -> Response:
        try:
            body = json.loads(await read_body(request, max_bytes=MAX_BODY_BYTES))
            snapshot = self.config.change(_change(body))
        except ShipyardError as exc:
            return JSONResponse({"message": exc.message}, status_code=exc.status_code)
        except (ValueError, TypeError, KeyError) as exc:
            message = f"not a stack change: {exc}"
            return JSONResponse({"message": message}, status_code=400)
        return JSONResponse(snapshot)


def _masked(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` with every notification URL (the topics', jobs.notify's) shown as
    its scheme and host alone."""
    jobs = dict(snapshot["jobs"])
    jobs["notify"] = {status: [_shown(u) for u in urls] for status, urls in jobs["notify"].items()}
    topics = {name: [_shown(u) for u in urls] for name, urls in snapshot["topics"].items()}
    return {**snapshot, "topics": topics, "jobs": jobs}


_HOSTED = frozenset({"mailto", "mailtos", "json", "jsons", "xml", "xmls", "form", "forms"})
"""Schemes whose host part is a host. Elsewhere apprise may put a token there (Telegram's
``tgram://bottoken/...``, Discord's), so only the scheme is shown."""


def _shown(url: str) -> str:
    """A notification URL's scheme, and its host where that is one: where it goes, none
    of what it carries."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "(not a URL)"
    host = urllib.parse.urlsplit(f"x://{rest}").hostname if scheme.lower() in _HOSTED else None
    return f"{scheme}://{host}/..." if host else f"{scheme}://..."


def _change(body: Any) -> StackChange:
    if not isinstance(body, dict) or not isinstance(body.get("stack"), str):
        raise ValueError('a JSON object with "stack" is expected')
    put_topics = body.get("put_topics", {})
    remove_topics = body.get("remove_topics", [])
    jobs = body.get("jobs")
    if not isinstance(put_topics, dict) or not isinstance(remove_topics, list):
        raise ValueError("put_topics is an object and remove_topics a list")
    if jobs is not None and not isinstance(jobs, dict):
        raise ValueError("jobs is an object")
    return StackChange(
        stack=body["stack"],
        put_topics={str(k): v for k, v in put_topics.items()},
        remove_topics=[str(name) for name in remove_topics],
        jobs=jobs,
        remove_jobs=bool(body.get("remove_jobs", False)),
    )
