"""Adapters: small models (LoRA adapters) loaded into the process of the model they adapt.

An adapter inference component (BaseInferenceComponentName) runs in its base component's
copies. The gateway registers it in each copy before that copy's first request for it,
with the route SageMaker's LoRA container standard gives:

- ``POST /adapters`` ``{"name": <adapter>, "src": <ArtifactUrl>}``: fetch the artifact
  (a folder, a ``.tar.gz``, ``file://`` or ``s3://``, as a ModelDataUrl) and hand it to the
  program's ``load_adapter_fn(model, name, adapter_dir)``; 200 once done. Registering a
  name again with another ``src`` replaces it (an UpdateInferenceComponent).
- ``DELETE /adapters/<name>``: ``unload_adapter_fn(model, name)`` when the program has
  one; 404 when the name is not registered.
- an invocation for the adapter carries ``X-Amzn-SageMaker-Adapter-Identifier: <name>``,
  which reaches the handlers as ``context.adapter``; an unregistered name is answered
  404 with ``X-Shipyard-Error: AdapterNotFound`` (the gateway registers it again).

A program without ``load_adapter_fn`` refuses registrations (400, ``AdaptersUnsupported``),
so an adapter component on such a base fails its requests with that reason rather than
being served by the base model as if it were the adapter.

Loading runs on a thread of its own, so ``/ping`` and requests for the base model go on
meanwhile; registrations are serialised among themselves.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from shipyard import launch
from shipyard.runtime.handlers import Handlers

NOT_FOUND = "AdapterNotFound"
UNSUPPORTED = "AdaptersUnsupported"
LOAD_FAILED = "AdapterLoadFailed"


class AdapterError(Exception):
    """A registration refused: the HTTP status and the ``X-Shipyard-Error`` code to answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class Adapters:
    """The adapters registered in this process, by name → the ``src`` they came from."""

    def __init__(self, handlers: Handlers, cache: Path, *, s3_endpoint_url: str | None) -> None:
        self.handlers = handlers
        self.cache = cache
        self.s3_endpoint_url = s3_endpoint_url
        self.registered: dict[str, str] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Adapters({sorted(self.registered)})"

    @staticmethod
    def request(body: bytes) -> tuple[str, str]:
        """The ``name`` and ``src`` of a ``POST /adapters`` body; AdapterError if unusable."""
        try:
            payload: Any = json.loads(body)
        except ValueError:
            raise AdapterError(400, "InvalidRequest", "The body is not JSON.") from None
        if not isinstance(payload, dict):
            raise AdapterError(400, "InvalidRequest", 'The body must be {"name", "src"}.')
        name, src = payload.get("name"), payload.get("src")
        if not isinstance(name, str) or not name or not isinstance(src, str) or not src:
            raise AdapterError(400, "InvalidRequest", '"name" and "src" must be non-empty strings.')
        return name, src

    def register(self, name: str, src: str) -> None:
        """Fetch ``src`` and load it as ``name`` (blocking: run it on a thread)."""
        load = self.handlers.load_adapter
        if load is None:
            raise AdapterError(
                400,
                UNSUPPORTED,
                f"The model's program ({self.handlers.program or 'none'}) defines no "
                "load_adapter_fn(model, name, adapter_dir), so it cannot load adapter "
                f"{name}.",
            )
        with self._lock:
            if self.registered.get(name) == src:
                return
            try:
                folder = launch.model_folder(src, self.cache, s3_endpoint_url=self.s3_endpoint_url)
                load(self.handlers.model, name, str(folder))
            except Exception as exc:
                raise AdapterError(
                    424, LOAD_FAILED, f"Adapter {name} failed to load: {type(exc).__name__}: {exc}"
                ) from exc
            self.registered[name] = src

    def unregister(self, name: str) -> None:
        """Drop ``name`` (blocking: run it on a thread); AdapterError when not registered."""
        with self._lock:
            if self.registered.pop(name, None) is None:
                raise AdapterError(404, NOT_FOUND, f"Adapter {name} is not registered.")
            unload = self.handlers.unload_adapter
            if unload is not None:
                unload(self.handlers.model, name)
