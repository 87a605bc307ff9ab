"""Adapters: models loaded into the process of the model they adapt (LoRA adapters).

An adapter inference component (BaseInferenceComponentName) runs in its base component's
copies. The gateway registers it in each copy, with the route SageMaker's LoRA container
standard gives:

- ``POST /adapters`` ``{"name": <adapter>, "src": <ArtifactUrl>}``: fetch the artifact
  (a folder, a ``.tar.gz``, ``file://`` or ``s3://``, as a ModelDataUrl) and load it; 200
  once done. Registering a name again with another ``src`` replaces it (an
  UpdateInferenceComponent).
- ``DELETE /adapters/<name>``: drop it; 404 when the name is not registered.
- both take the token the copy was handed on a pipe at its start
  (``--adapters-token-fd``) in ``X-Shipyard-Adapters-Token``, else 403: registering
  fetches and runs code, so only the gateway may. A process started without one (not a
  component's copy) has no ``/adapters`` at all, whatever its environment says.
- an invocation for the adapter carries ``X-Amzn-SageMaker-Adapter-Identifier: <name>``
  and is served by the adapter's model (handlers see the name in ``context.adapter``);
  an unregistered name is answered 404 with ``X-Shipyard-Error: AdapterNotFound`` (the
  gateway registers it again).

How an adapter is loaded (the built-in runtime's side of the contract): a program whose
``model_fn`` takes a second argument is called as ``model_fn(model_dir, adapter_dir)``,
and the model it returns serves the adapter's requests through the program's handlers
(the base model with the adapter applied). Otherwise the adapter's folder is loaded as a
model of its own, as a multi-model instance loads one: its own ``code/inference.py``, or
the default handlers.

Loading runs on a thread of its own, so ``/ping`` and requests for the base model go on
meanwhile; registrations are serialised among themselves.
"""

from __future__ import annotations

import hmac
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from shipyard import launch
from shipyard.contract import ADAPTERS_TOKEN
from shipyard.runtime import handlers
from shipyard.runtime.handlers import Handlers

NOT_FOUND = "AdapterNotFound"
LOAD_FAILED = "AdapterLoadFailed"


class AdapterError(Exception):
    """A request refused: the HTTP status and the ``X-Shipyard-Error`` code to answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class Adapters:
    """The adapters registered in this process: name → (src, the Handlers serving it)."""

    def __init__(
        self,
        base: Handlers,
        model_dir: Path,
        cache: Path,
        *,
        token: str,
        s3_endpoint_url: str | None,
    ) -> None:
        self.token = token.encode()
        self.base = base
        self.model_dir = model_dir
        self.cache = cache
        self.s3_endpoint_url = s3_endpoint_url
        self.registered: dict[str, tuple[str, Handlers]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Adapters({sorted(self.registered)})"

    @staticmethod
    def request(body: bytes) -> tuple[str, str]:
        """The ``name`` and ``src`` of a ``POST /adapters`` body; AdapterError if unusable."""
        try:
            payload: Any = json.loads(body)
        except (ValueError, RecursionError):
            raise AdapterError(400, "InvalidRequest", "The body is not JSON.") from None
        if not isinstance(payload, dict):
            raise AdapterError(400, "InvalidRequest", 'The body must be {"name", "src"}.')
        name, src = payload.get("name"), payload.get("src")
        if not isinstance(name, str) or not name or not isinstance(src, str) or not src:
            raise AdapterError(400, "InvalidRequest", '"name" and "src" must be non-empty strings.')
        return name, src

    def check(self, headers: list[tuple[bytes, bytes]]) -> None:
        """AdapterError unless ``headers`` carry this process's token."""
        sent = next((v for k, v in headers if k == ADAPTERS_TOKEN), b"")
        if not hmac.compare_digest(sent, self.token):
            raise AdapterError(403, "Forbidden", "Adapters are registered by the gateway only.")

    def register(self, name: str, src: str) -> None:
        """Fetch ``src`` and load it as adapter ``name`` (blocking: run it on a thread)."""
        with self._lock:
            held = self.registered.get(name)
            if held is not None and held[0] == src:
                return
            try:
                folder = launch.model_folder(src, self.cache, s3_endpoint_url=self.s3_endpoint_url)
                served = self._load(folder)
            except Exception as exc:
                raise AdapterError(
                    424, LOAD_FAILED, f"Adapter {name} failed to load: {type(exc).__name__}: {exc}"
                ) from exc
            self.registered[name] = (src, served)

    def _load(self, folder: Path) -> Handlers:
        module = self.base.module
        if handlers.takes_adapter_dir(module):
            model = handlers.call_model_fn(module, self.model_dir, str(folder))
            return Handlers(model=model, module=module)
        return _load_apart(folder, self.base)

    def unregister(self, name: str) -> None:
        """Drop ``name``; AdapterError when it is not registered."""
        with self._lock:
            if self.registered.pop(name, None) is None:
                raise AdapterError(404, NOT_FOUND, f"Adapter {name} is not registered.")


def _load_apart(folder: Path, base: Handlers) -> Handlers:
    """``handlers.load`` of an adapter's own folder, leaving ``sys.modules`` and
    ``sys.path`` as they were for the base model: its ``inference`` module must not
    replace the base's, nor its code folder shadow the base's imports, and while it
    loads the base's own modules (its code folder's) are out of sight, so the adapter's
    ``import helpers`` finds its own. (Imports its handlers make later, per request,
    resolve against the base's path: an adapter's code imports what it needs at load.)"""
    modules = dict(sys.modules)
    path = list(sys.path)
    root = os.path.realpath(folder) + os.sep
    base_file = getattr(base.module, "__file__", None)
    if base_file:
        base_root = os.path.dirname(os.path.realpath(base_file)) + os.sep
        for name, module in modules.items():
            file = getattr(module, "__file__", None)
            if file and os.path.realpath(file).startswith(base_root):
                del sys.modules[name]
        sys.path[:] = [p for p in path if os.path.realpath(p) + os.sep != base_root]
    try:
        return handlers.load(folder)
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - set(modules):
            file = getattr(sys.modules.get(name), "__file__", None)
            if file and os.path.realpath(file).startswith(root):
                del sys.modules[name]
        for name, module in modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
