"""``GET /stack`` and ``PUT /stack``: the stack file's topics and jobs sections, live.

``shipyard apply`` reads them to plan and puts what changed (stack_config.py
says who may change what). Answers are JSON; a refused change is 400 with
``{"message": ...}`` and changes nothing.

Notification URLs carry passwords and tokens (a mail server's, a webhook's). Only a
caller who may put them (``shipyard:PutStack``, the operator's power: ``apply`` compares
them with its file's) reads them whole; any other key allowed ``shipyard:GetStack`` (a
console's ``shipyard:Get*``) reads them masked, as the dispatcher logs them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shipyard.errors import ShipyardError
from shipyard.gateway.auth import admitted
from shipyard.gateway.control import read_body
from shipyard.stack_config import StackChange, StackConfig

MAX_BODY_BYTES = 1 << 20


class StackConfigDoor:
    """Translates ``/stack`` into StackConfig calls."""

    def __init__(self, config: StackConfig, *, redact: Callable[[str], str]) -> None:
        self.config = config
        self.redact = redact
        """A notification URL with its passwords and tokens masked (Notifier.redact)."""

    def __repr__(self) -> str:
        return f"StackConfigDoor({self.config!r})"

    async def get(self, request: Request) -> Response:
        snapshot = self.config.snapshot()
        if not admitted(request.scope).may("shipyard:PutStack"):
            # apprise parses each URL to mask it: off the event loop.
            snapshot = await asyncio.to_thread(_masked, snapshot, self.redact)
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


def _masked(snapshot: dict[str, Any], redact: Callable[[str], str]) -> dict[str, Any]:
    """``snapshot`` with every notification URL masked: the topics' and jobs.notify's."""
    jobs = dict(snapshot["jobs"])
    jobs["notify"] = {status: [redact(u) for u in urls] for status, urls in jobs["notify"].items()}
    topics = {name: [redact(u) for u in urls] for name, urls in snapshot["topics"].items()}
    return {**snapshot, "topics": topics, "jobs": jobs}


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
