"""The gateway's doors by path: one router in front of all of them.

The data path's doors are raw ASGI handlers reached without a framework in between: the
runtime doors by ``POST /endpoints/{name}/{action}`` (one dict lookup on the last
segment), the Open Inference Protocol's REST door by ``/v2``, the OpenAI-compatible door
by ``/v1``. Every other path goes to
the Starlette app of the control plane, the facade, the console and the operations
endpoints, which answers unknown paths in the shape of the door they look like.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from shipyard.http.server import Respond

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
EndpointDoor = Callable[[Scope, Any, Any, str], Awaitable[None]]
EndpointTaker = Callable[[Scope, str, bytes, Respond], bool]

_ENDPOINTS = "/endpoints/"


class PathRouter:
    """Sends each request to its door (see the module).

    ``endpoint_doors`` maps the last path segment of ``POST /endpoints/{name}/...``
    (``invocations``, ``async-invocations``, ``invocations-response-stream``) to the
    door that serves it, called with the endpoint's name.
    """

    __slots__ = ("endpoint_doors", "v2", "v1", "fallback", "_takers")

    def __init__(
        self,
        *,
        endpoint_doors: Mapping[str, EndpointDoor],
        v2: ASGIApp,
        v1: ASGIApp,
        fallback: ASGIApp,
    ) -> None:
        self.endpoint_doors = dict(endpoint_doors)
        self.v2 = v2
        self.v1 = v1
        self.fallback = fallback
        self._takers: dict[str, EndpointTaker] = {
            action: door.take
            for action, door in self.endpoint_doors.items()
            if hasattr(door, "take")
        }

    def __repr__(self) -> str:
        return f"PathRouter(endpoint_doors={sorted(self.endpoint_doors)})"

    def __call__(self, scope: Scope, receive: Any, send: Any) -> Awaitable[None]:
        # The door's own awaitable, returned: no frame of the router's stays around the
        # request while it runs (an ASGI app all the same: calling it gives an awaitable).
        if scope["type"] == "http":
            path: str = scope["path"]
            if path.startswith(_ENDPOINTS) and scope["method"] == "POST":
                name, action = _endpoint(path)
                door = self.endpoint_doors.get(action)
                if door is not None and name and "/" not in name:
                    return door(scope, receive, send, name)
            elif path == "/v2" or path.startswith("/v2/"):
                return self.v2(scope, receive, send)
            elif path.startswith("/v1/") or path == "/v1":
                return self.v1(scope, receive, send)
        return self.fallback(scope, receive, send)

    def take(self, scope: Scope, body: bytes, respond: Respond) -> bool:
        """Hand a request whose whole ``body`` is in hand to its door's ``take``
        (RuntimeDoor.take: served on callbacks, with no task); False when its door has
        none or does not take it: nothing was done, and ``__call__`` routes it."""
        path: str = scope["path"]
        if path.startswith(_ENDPOINTS) and scope["method"] == "POST":
            name, action = _endpoint(path)
            take = self._takers.get(action)
            if take is not None and name and "/" not in name:
                return take(scope, name, body, respond)
        return False


def _endpoint(path: str) -> tuple[str, str]:
    """The endpoint's name and the action of a path under ``/endpoints/``."""
    name, _, action = path[len(_ENDPOINTS) :].rpartition("/")
    return name.strip("/"), action
