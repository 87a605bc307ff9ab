"""Adapter components on the data path: their base's copies, the adapter registered first.

An adapter inference component (``BaseInferenceComponentName``) has no copies of its own:
its requests go to the copies of its base component, under the base's routing policy and
in the base's queue (the routes share it: a copy freed by either serves the next request
of both), with ``X-Amzn-SageMaker-Adapter-Identifier: <adapter>`` so the copy serves it
with the adapter. Before a copy's first request for an adapter the gateway registers it
there (``POST /adapters`` ``{"name", "src"}``, SageMaker's LoRA container contract;
runtime/adapters.py serves it), once per copy process and adapter generation: a copy
restarted is a new Instance, and so is registered again; a copy that answers
``AdapterNotFound`` anyway is forgotten, so the next request registers it again. A route
of an older generation (a table not yet swapped) never registers over a newer one.

The registration routes are the gateway's alone: each copy of a component is handed a
token on a pipe at its start (InstanceSpec.adapters_token), never in its environment,
that ``/adapters`` requires, so another process on the host cannot make it fetch and run
code of its choosing; an instance of anything else has no such route.

What each copy holds is kept on its Instance (``adapters``); the registrations under way
in one AdapterLoader (the route publisher's), not in the routes, which are rebuilt on
every change of the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from shipyard.contract import ADAPTER_IDENTIFIER, ADAPTERS_TOKEN, ERROR
from shipyard.errors import ModelError, UpstreamError
from shipyard.http.client import OnAnswer, Response, StreamedResponse, in_task
from shipyard.routing.instance import Instance
from shipyard.routing.policies import Policy

if TYPE_CHECKING:
    from shipyard.routing.call import Call

_NOT_FOUND = b"AdapterNotFound"
_UNREGISTER_TIMEOUT_S = 10.0
LOAD_TIMEOUT_S = 600.0
"""How long a copy may take to fetch and load an adapter before the load counts as failed."""
RETRY_AFTER_S = 30.0
"""How long a copy's refusal to load an adapter answers that adapter's requests there
before the copy is asked again (an artifact fixed in place, a transient fetch error)."""


@dataclass(frozen=True, slots=True)
class Adapter:
    """One adapter as a route knows it: which artifact, of which specification, and the
    token its copies' ``/adapters`` take."""

    name: str
    src: str
    generation: int
    token: str


class AdapterLoader:
    """Registers adapters in copies, once per copy and generation, one at a time per pair."""

    def __init__(self, *, load_timeout_s: float = LOAD_TIMEOUT_S) -> None:
        self.load_timeout_s = load_timeout_s
        self._loading: dict[tuple[Instance, str], asyncio.Task[Response | None]] = {}

    def __repr__(self) -> str:
        return f"AdapterLoader(loading={len(self._loading)})"

    async def ensure(self, instance: Instance, adapter: Adapter) -> Response | None:
        """Register ``adapter`` in ``instance`` unless it holds it, or a newer one; None
        once it does, or the copy's refusal (an error answer)."""
        key = (instance, adapter.name)
        refused = instance.adapter_refusals.get(adapter.name)
        if (
            refused is not None
            and refused[0] == adapter.generation
            and time.monotonic() - refused[1] < RETRY_AFTER_S
        ):
            return refused[2]
        while True:
            held = instance.adapters.get(adapter.name)
            if held is not None and held >= adapter.generation:
                return None
            task = self._loading.get(key)
            if task is None:
                task = asyncio.create_task(
                    self._register(instance, adapter), name=f"adapter {adapter.name}"
                )
                self._loading[key] = task
            refusal = await asyncio.shield(task)
            if refusal is not None and self._loading.get(key) is None:
                held = instance.adapters.get(adapter.name)
                if held is None or held < adapter.generation:
                    return refusal
            # Another generation's registration ran meanwhile: look again.

    async def _register(self, instance: Instance, adapter: Adapter) -> Response | None:
        try:
            payload = json.dumps({"name": adapter.name, "src": adapter.src}).encode()
            headers = [
                (b"Content-Type", b"application/json"),
                (ADAPTERS_TOKEN, adapter.token.encode()),
            ]
            try:
                async with asyncio.timeout(self.load_timeout_s):
                    answer = await instance.pool.request(b"POST", b"/adapters", headers, payload)
            except TimeoutError:
                text = f"Adapter {adapter.name} did not load within {self.load_timeout_s:g} s."
                answer = Response(504, [(ERROR, b"AdapterLoadFailed")], text.encode())
            if answer.status == 200:
                instance.adapter_refusals.pop(adapter.name, None)
                held = instance.adapters.get(adapter.name)
                if held is None or held < adapter.generation:
                    instance.adapters[adapter.name] = adapter.generation
                return None
            refusal = Response(answer.status, answer.headers, answer.body)
            instance.adapter_refusals[adapter.name] = (
                adapter.generation,
                time.monotonic(),
                refusal,
            )
            return refusal
        finally:
            self._loading.pop((instance, adapter.name), None)

    async def load_all(self, instances: Sequence[Instance], adapter: Adapter) -> str | None:
        """Register ``adapter`` in every copy of ``instances``; the first refusal's words,
        or None once each holds it (a copy that cannot be reached is left to load it at
        its next request)."""

        async def one(instance: Instance) -> Response | None:
            try:
                return await self.ensure(instance, adapter)
            except (UpstreamError, OSError):
                return None

        for refusal in await asyncio.gather(*(one(i) for i in instances)):
            if refusal is not None:
                return refusal.body.decode(errors="replace")[:1000]
        return None

    @staticmethod
    def forget(instance: Instance, name: str) -> None:
        """``instance`` does not hold ``name`` (it said so): register it again next time."""
        instance.adapters.pop(name, None)

    async def unregister(self, instances: Sequence[Instance], adapter: Adapter) -> None:
        """Drop ``adapter`` from the copies (it was deleted), once any registration of it
        under way is over."""
        for instance in instances:
            task = self._loading.get((instance, adapter.name))
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
            # A component made again under the name starts afresh, refusals included.
            instance.adapter_refusals.pop(adapter.name, None)
            if instance.adapters.pop(adapter.name, None) is None:
                continue
            path = b"/adapters/" + quote(adapter.name, safe="").encode()
            # Best effort: a copy busy past the timeout keeps the adapter in memory, and
            # no request names it any more.
            with contextlib.suppress(UpstreamError, OSError, TimeoutError):
                async with asyncio.timeout(_UNREGISTER_TIMEOUT_S):
                    token = [(ADAPTERS_TOKEN, adapter.token.encode())]
                    await instance.pool.request(b"DELETE", path, token)


class AdapterDispatch:
    """Dispatch (routing/strategies.py) for the requests of one adapter component."""

    __slots__ = ("policy", "adapter", "loader", "_header")

    names_model = False
    queues = True

    def __init__(self, policy: Policy, *, adapter: Adapter, loader: AdapterLoader) -> None:
        self.policy = policy
        self.adapter = adapter
        self.loader = loader
        self._header = (ADAPTER_IDENTIFIER, adapter.name.encode())

    def __repr__(self) -> str:
        return f"AdapterDispatch({self.adapter.name!r}, {self.policy!r})"

    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        return self.policy.choose(instances)

    def send(
        self, instance: Instance, call: Call, max_body: int | None, on_answer: OnAnswer
    ) -> Callable[[], None]:
        """The adapter registered in the copy first (in a task), then the request."""
        return in_task(self._send(instance, call, max_body), on_answer)

    async def _send(self, instance: Instance, call: Call, max_body: int | None) -> Response:
        refusal = await self.loader.ensure(instance, self.adapter)
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
        refusal = await self.loader.ensure(instance, self.adapter)
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
                self.loader.forget(instance, self.adapter.name)
            yield response

    @staticmethod
    def prepare(endpoint: str, call: Call) -> None:
        pass

    @staticmethod
    def platform_error(response: Response, call: Call) -> Exception | None:
        return None

    def learn(self, instance: Instance, call: Call, response: Response) -> bool:
        if response.header(ERROR) == _NOT_FOUND:
            self.loader.forget(instance, self.adapter.name)
        return False

    def unreachable(self, instance: Instance, call: Call) -> None:
        pass

    def failure(self, refusal: Response) -> ModelError:
        """The client's error for a copy that would not load the adapter."""
        text = refusal.body.decode(errors="replace")[:1000]
        return ModelError(
            f"Received client error ({refusal.status}) from primary while loading adapter "
            f'{self.adapter.name}: "{text}".',
            original_status_code=refusal.status,
            original_message=text,
        )
