"""ModelAgent: SageMaker's multi-model container contract, driven from the gateway.

On SageMaker the platform, not a custom multi-model container, decides what is loaded
where. The built-in runtime takes those decisions itself (runtime/multimodel.py), so only
a user's own server (a ``cmd:`` or container image of a MultiModel model) is driven this way:

- before invoking a model the instance does not hold, fetch its artifact from the prefix
  into the instance's own folder (an archive is extracted) and ``POST /models``
  ``{"model_name": <TargetModel>, "url": <that folder>}``; 409 means it is loaded already;
- then ``POST /models/{name}/invoke`` with the request's headers and body;
- when a load is refused with 507 (no memory left), ``DELETE /models/{name}`` the least
  recently used other model and try again, until nothing else is left to unload.

Answers carry the headers the built-in runtime sends (``X-Shipyard-Model-Cache``,
``-Evicted``, ``-Model-Timings``, ``-Error``), so routing and metrics treat both alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from shipyard.contract import (
    ERROR,
    EVICTED,
    MODEL_CACHE,
    MODEL_TIMINGS,
    format_evicted,
    format_timings,
    model_url,
)
from shipyard.errors import ArtifactError
from shipyard.http.client import Response
from shipyard.routing.instance import Instance

Headers = list[tuple[bytes, bytes]]

_JSON = [(b"Content-Type", b"application/json")]
_MAX_PAGES = 1000

MODELS_FOLDER = ".models"
"""Where, in an instance's own folder, the agent fetches its models: written and deleted
by the gateway, so a sandboxed instance sees it read-only (backends/local.py), lest it
put a link there that the gateway would follow out of the folder."""


@dataclass(slots=True)
class _Load:
    """A finished load: an error answer, or its report for the first request that reads it."""

    error: Response | None = None
    download_s: float | None = None
    load_s: float | None = None
    unload_s: float | None = None
    evicted: tuple[str, ...] = ()
    claimed: bool = False


class ModelAgent:
    """Loads TargetModels into ``cmd:`` instances before invoking them; see the module.

    Guarantees: one load per model and instance at a time (single flight); a model is
    unloaded only to make room for another, least recently used first, and never while
    it is being loaded. Failure modes: the agent's view of what an instance holds is
    ``Instance.models``; a server that unloads models by itself answers 404 to the next
    invoke, which reloads the model once. A load that outlives its request goes on.

    Args:
        prefix: where TargetModels are found, as ``<prefix>/<name>``.
        fetch: makes a folder hold a model's files, named by its URL, and returns the
            folder (``ArtifactStore.fetch_model``); raises ArtifactError.
        folder: an instance's own folder, by instance id; artifacts go under it.
    """

    def __init__(
        self,
        *,
        prefix: str,
        fetch: Callable[[str, Path], Path],
        folder: Callable[[str], Path],
        models_at: str | None = None,
    ) -> None:
        self.prefix = prefix
        self._fetch = fetch
        self._folder = folder
        self._models_at = models_at
        """Where the instance sees its ``MODELS_FOLDER`` (a container's mount); None: at
        the gateway's own path (a process on this host)."""
        self._loading: dict[tuple[str, str], asyncio.Task[_Load]] = {}

    def __repr__(self) -> str:
        return f"ModelAgent(prefix={self.prefix!r})"

    async def invoke(
        self, instance: Instance, model: str, headers: Headers, body: bytes
    ) -> Response:
        """Invoke ``model`` on ``instance``, loading it first when it is not there."""
        started = time.perf_counter()
        report: _Load | None = None
        if model not in instance.models or (instance.instance_id, model) in self._loading:
            report = await self._ensure(instance, model)
            if report.error is not None:
                return report.error
        else:
            instance.models[model] = instance.models.pop(model)  # most recently used
        path = b"/models/" + quote(model, safe="").encode() + b"/invoke"
        response = await instance.pool.request(b"POST", path, headers, body)
        if response.status == 404 and report is None:
            instance.models.pop(model, None)  # the server dropped it: load it once more
            report = await self._ensure(instance, model)
            if report.error is not None:
                return report.error
            response = await instance.pool.request(b"POST", path, headers, body)
        return _with_report(response, report, time.perf_counter() - started)

    async def _ensure(self, instance: Instance, model: str) -> _Load:
        key = (instance.instance_id, model)
        task = self._loading.get(key)
        if task is None:
            instance.models[model] = None  # held from now on: later requests wait here
            task = asyncio.create_task(self._load(instance, model), name=f"load {model}")
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        report = await asyncio.shield(task)
        if report.error is not None:
            instance.models.pop(model, None)
        return report

    async def _load(self, instance: Instance, model: str) -> _Load:
        url = model_url(self.prefix, model)
        dest = self._artifact_dir(instance, model)
        started = time.perf_counter()
        try:
            local = await asyncio.to_thread(self._fetch, url, dest)
        except ArtifactError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return _Load(_refusal(404, "ModelNotFound", f"Could not find model '{model}'."))
            return _Load(_refusal(500, "ModelLoadFailed", f"Model '{model}': {exc}"))
        report = _Load(download_s=time.perf_counter() - started, unload_s=0.0)
        evicted: list[str] = []
        payload = json.dumps({"model_name": model, "url": self._seen_at(instance, local)})
        while True:
            started = time.perf_counter()
            answer = await instance.pool.request(b"POST", b"/models", _JSON, payload.encode())
            if answer.status in (200, 409):
                report.load_s = time.perf_counter() - started
                break
            victim = self._victim(instance, model) if answer.status == 507 else None
            if victim is None:
                report.error = _load_error(model, instance, answer)
                break
            report.unload_s = (report.unload_s or 0.0) + await self._unload(instance, victim)
            evicted.append(victim)
        report.evicted = tuple(evicted)
        report.unload_s = report.unload_s or None
        return report

    def _victim(self, instance: Instance, model: str) -> str | None:
        """The least recently used model that is neither ``model`` nor being loaded."""
        for name in instance.models:
            if name != model and (instance.instance_id, name) not in self._loading:
                return name
        return None

    async def _unload(self, instance: Instance, name: str) -> float:
        started = time.perf_counter()
        path = b"/models/" + quote(name, safe="").encode()
        await instance.pool.request(b"DELETE", path, [])
        instance.models.pop(name, None)
        await asyncio.to_thread(shutil.rmtree, self._artifact_dir(instance, name), True)
        return time.perf_counter() - started

    def _seen_at(self, instance: Instance, local: Path) -> str:
        """The ``url`` of a load: where the instance finds the folder ``local``."""
        if self._models_at is None:
            return str(local)
        inside = local.relative_to(self._folder(instance.instance_id) / MODELS_FOLDER)
        return f"{self._models_at.rstrip('/')}/{inside.as_posix()}"

    def _artifact_dir(self, instance: Instance, model: str) -> Path:
        key = hashlib.sha256(model.encode()).hexdigest()[:32]
        return self._folder(instance.instance_id) / MODELS_FOLDER / key


def _with_report(response: Response, report: _Load | None, waited_s: float) -> Response:
    """``response`` with the headers the built-in runtime would have added."""
    headers = list(response.headers)
    if report is None:
        headers.append((MODEL_CACHE, b"hit"))
        return Response(response.status, headers, response.body)
    headers.append((MODEL_CACHE, b"miss"))
    timings = format_timings(wait_s=waited_s)
    if not report.claimed:  # the load's own figures go to one request only
        report.claimed = True
        timings = format_timings(
            wait_s=waited_s,
            download_s=report.download_s,
            load_s=report.load_s,
            unload_s=report.unload_s,
        )
        if report.evicted:
            headers.append((EVICTED, format_evicted(report.evicted).encode()))
    headers.append((MODEL_TIMINGS, timings.encode()))
    return Response(response.status, headers, response.body)


def _load_error(model: str, instance: Instance, answer: Response) -> Response:
    text = answer.body.decode(errors="replace")[:500]
    if answer.status == 507:
        return _refusal(
            507,
            "ModelTooLarge",
            f"Model '{model}' does not fit in the memory of instance {instance.instance_id} "
            f"even with every other model unloaded: {text}",
        )
    if answer.status == 404:
        return _refusal(404, "ModelNotFound", f"Could not find model '{model}': {text}")
    return _refusal(
        500, "ModelLoadFailed", f"Model '{model}' failed to load ({answer.status}): {text}"
    )


def _refusal(status: int, code: str, message: str) -> Response:
    body = f"{code}: {message}".encode()
    return Response(status, [(ERROR, code.encode())], body)


async def loaded_models(instance: Instance, *, timeout_s: float) -> list[str] | None:
    """The models ``instance`` says it holds (``GET /models``, every page); None on failure."""
    names: list[str] = []
    token: str | None = None
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(_MAX_PAGES):
                path = "/models" + (f"?next_page_token={quote(token)}" if token else "")
                answer = await instance.pool.request(b"GET", path.encode(), [])
                if answer.status != 200:
                    return None
                page = json.loads(answer.body)
                names += [str(m["modelName"]) for m in page["models"]]
                token = page.get("nextPageToken")
                if not token:
                    return names
    except (TimeoutError, OSError, ValueError, KeyError, TypeError, Exception):
        return None
    return None
