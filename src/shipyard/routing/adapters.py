"""Adapter components on the data path: their base's copies, the adapter registered first.

An adapter inference component (``BaseInferenceComponentName``) has no copies of its own:
its requests go to the copies of its base component, under the base's routing policy,
with ``X-Amzn-SageMaker-Adapter-Identifier: <adapter>`` so the model applies it. Before a
copy's first request for an adapter the gateway registers it there (``POST /adapters``
``{"name", "src"}``, SageMaker's LoRA container contract; runtime/adapters.py serves it),
once per copy process and specification: a copy restarted is a new Instance, and so is
registered again; a copy that answers ``AdapterNotFound`` anyway is forgotten, so the
next request registers it again.

What each copy holds is kept on its Instance (``adapters``); the registrations under way
in one AdapterLoader (the route publisher's), not in the routes, which are rebuilt on
every change of the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from shipyard.contract import ADAPTER_IDENTIFIER, ERROR
from shipyard.errors import ModelError, UpstreamError
from shipyard.routing.client import Response, StreamedResponse
from shipyard.routing.instance import Instance
from shipyard.routing.policies import Policy

if TYPE_CHECKING:
    from shipyard.routing.router import Call

_JSON = [(b"Content-Type", b"application/json")]
_NOT_FOUND = b"AdapterNotFound"
_UNREGISTER_TIMEOUT_S = 10.0


class AdapterLoader:
    """Registers adapters in copies, once per copy and ``src``, one at a time per pair."""

    def __init__(self) -> None:
        self._loading: dict[tuple[int, str], asyncio.Task[Response | None]] = {}

    def __repr__(self) -> str:
        return f"AdapterLoader(loading={len(self._loading)})"

    async def ensure(self, instance: Instance, name: str, src: str) -> Response | None:
        """Register ``name`` from ``src`` in ``instance`` unless it holds it; None once it
        does, or the copy's refusal (an error answer)."""
        held = instance.adapters
        if held.get(name) == src:
            return None
        key = (id(instance), name)
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._register(instance, name, src), name=f"adapter {name}")
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        refusal = await asyncio.shield(task)
        if refusal is None and held.get(name) != src:
            # Another src was registered meanwhile (an update): register this one.
            return await self.ensure(instance, name, src)
        return refusal

    async def _register(self, instance: Instance, name: str, src: str) -> Response | None:
        payload = json.dumps({"name": name, "src": src}).encode()
        answer = await instance.pool.request(b"POST", b"/adapters", _JSON, payload)
        if answer.status == 200:
            instance.adapters[name] = src
            return None
        return answer

    async def load_all(self, instances: Sequence[Instance], name: str, src: str) -> str | None:
        """Register ``name`` in every copy of ``instances``; the first refusal's words, or
        None once each holds it (a copy that cannot be reached is left to load it at
        its next request)."""

        async def one(instance: Instance) -> Response | None:
            try:
                return await self.ensure(instance, name, src)
            except (UpstreamError, OSError):
                return None

        for refusal in await asyncio.gather(*(one(i) for i in instances)):
            if refusal is not None:
                return refusal.body.decode(errors="replace")[:1000]
        return None

    def forget(self, instance: Instance, name: str) -> None:
        """``instance`` does not hold ``name`` (it said so): register it again next time."""
        instance.adapters.pop(name, None)

    async def unregister(self, instances: Sequence[Instance], name: str) -> None:
        """Drop ``name`` from the copies that hold it (the adapter was deleted)."""
        for instance in instances:
            if instance.adapters.pop(name, None) is None:
                continue
            path = b"/adapters/" + quote(name, safe="").encode()
            # Best effort: a copy busy past the timeout keeps the adapter in memory, and
            # no request names it any more.
            with contextlib.suppress(UpstreamError, OSError, TimeoutError):
                async with asyncio.timeout(_UNREGISTER_TIMEOUT_S):
                    await instance.pool.request(b"DELETE", path, [])


class AdapterRoute:
    """Dispatch (routing/strategies.py) for the requests of one adapter component."""

    __slots__ = ("policy", "name", "src", "loader", "_header")

    def __init__(self, policy: Policy, *, name: str, src: str, loader: AdapterLoader) -> None:
        self.policy = policy
        self.name = name
        self.src = src
        self.loader = loader
        self._header = (ADAPTER_IDENTIFIER, name.encode())

    def __repr__(self) -> str:
        return f"AdapterRoute({self.name!r}, {self.policy!r})"

    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        return self.policy.choose(instances)

    async def send(self, instance: Instance, call: Call, max_body: int | None) -> Response:
        refusal = await self.loader.ensure(instance, self.name, self.src)
        if refusal is not None:
            return refusal
        return await instance.pool.request(
            b"POST",
            b"/invocations",
            [*call.headers, self._header],
            call.body,
            content_length=call.content_length,
            max_body=max_body,
        )

    @contextlib.asynccontextmanager
    async def open(self, instance: Instance, call: Call) -> AsyncIterator[StreamedResponse]:
        refusal = await self.loader.ensure(instance, self.name, self.src)
        if refusal is not None:
            raise self.failure(refusal)
        async with instance.pool.stream(
            b"POST",
            b"/invocations",
            [*call.headers, self._header],
            call.body,
            content_length=call.content_length,
        ) as response:
            if response.header(ERROR) == _NOT_FOUND:
                self.loader.forget(instance, self.name)
            yield response

    def learn(self, instance: Instance, call: Call, response: Response) -> bool:
        if response.header(ERROR) == _NOT_FOUND:
            self.loader.forget(instance, self.name)
        return False

    def unreachable(self, instance: Instance, call: Call) -> None:
        pass

    def failure(self, refusal: Response) -> ModelError:
        """The client's error for a copy that would not load the adapter."""
        text = refusal.body.decode(errors="replace")[:1000]
        return ModelError(
            f"Received client error ({refusal.status}) from primary while loading adapter "
            f'{self.name}: "{text}".',
            original_status_code=refusal.status,
            original_message=text,
        )
