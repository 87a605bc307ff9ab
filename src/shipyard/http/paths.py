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
ServeWhole = Callable[[Scope, str, bytes, Respond], bool]
"""An endpoint door's ``serve_whole``: the callback path's driver, given the endpoint's
name (RuntimeDoor.serve_whole)."""

_ENDPOINTS = "/endpoints/"


class PathRouter:
    """Sends each request to its door (see the module).

    ``endpoint_doors`` maps the last path segment of ``POST /endpoints/{name}/...``
    (``invocations``, ``async-invocations``, ``invocations-response-stream``) to the
    door that serves it, called with the endpoint's name.

    Two drivers over one lookup (``_endpoint``): ``__call__``, the ASGI app, and
    ``serve_whole``, the callback path's, which hands a request whose body is whole to
    its door's ``serve_whole`` where the door has one.
    """

    __slots__ = ("endpoint_doors", "v2", "v1", "fallback", "_serve_whole")

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
        self._serve_whole: dict[str, ServeWhole] = {
            action: door.serve_whole
            for action, door in self.endpoint_doors.items()
            if hasattr(door, "serve_whole")
        }

    def __repr__(self) -> str:
        return f"PathRouter(endpoint_doors={sorted(self.endpoint_doors)})"

    def __call__(self, scope: Scope, receive: Any, send: Any) -> Awaitable[None]:
        # The door's own awaitable, returned: no frame of the router's stays around the
        # request while it runs (an ASGI app all the same: calling it gives an awaitable).
        if scope["type"] == "http":
            path: str = scope["path"]
            endpoint = self._endpoint(scope)
            if endpoint is not None:
                action, name = endpoint
                door = self.endpoint_doors.get(action)
                if door is not None:
                    return door(scope, receive, send, name)
            if path == "/v2" or path.startswith("/v2/"):
                return self.v2(scope, receive, send)
            if path.startswith("/v1/") or path == "/v1":
                return self.v1(scope, receive, send)
        return self.fallback(scope, receive, send)

    def serve_whole(self, scope: Scope, body: bytes, respond: Respond) -> bool:
        """The callback path's driver: a request whose whole ``body`` is in hand, handed
        to its endpoint door's ``serve_whole``. False when it has no such door or the
        door declines: nothing was done, and ``__call__`` routes it."""
        endpoint = self._endpoint(scope)
        if endpoint is not None:
            action, name = endpoint
            serve = self._serve_whole.get(action)
            if serve is not None:
                return serve(scope, name, body, respond)
        return False

    def _endpoint(self, scope: Scope) -> tuple[str, str] | None:
        """The lookup both drivers share: for ``POST /endpoints/{name}/{action}``, the
        action (each driver's doors are keyed by it) and the endpoint's name; else None."""
        path: str = scope["path"]
        if path.startswith(_ENDPOINTS) and scope["method"] == "POST":
            name, _, action = path[len(_ENDPOINTS) :].rpartition("/")
            name = name.strip("/")
            if name and "/" not in name:
                return action, name
        return None
