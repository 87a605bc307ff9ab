"""Container groups on the data path: inference pipelines (Serial) and Direct invocation.

One instance of a multi-container model (a pipeline or Direct) is a group of container processes,
each on its own port. The router sees the group as one Instance (its policy, in-flight
count, draining and health are the group's) whose pool is a ContainerGroupPool, which
answers ``GET /ping`` for the whole group and ``POST /invocations`` by the model's mode:

- Serial (an inference pipeline): the request goes to the first container, its answer,
  with its Content-Type, to the next, and so on; every step keeps the client's other
  headers (Accept among them), and the last answer is the client's. A step that answers
  an error ends the pipeline there: its answer comes back tagged with the container's
  name (``FAILED_CONTAINER``), which the doors put in their ModelError.
- Direct: the container named by ``X-Amzn-SageMaker-Target-Container-Hostname`` serves
  the request alone (a pipeline of one step, so its error is tagged the same way); a
  missing or unknown name is ValidationError.

Why a pool rather than a branch in the router: the router's send path stays exactly what
it is for every single-container instance (bench/gateway_overhead.py), and pipelines
reach every way of sending (real-time, asynchronous, the transform runner) with no
change there. Any other path (``/execution-parameters``) goes to the first container.
bench/pipeline.py measures what each hop adds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from urllib.parse import urlsplit

from shipyard.contract import INVOCATIONS_PATH, TARGET_CONTAINER_HOSTNAME
from shipyard.errors import ResponseTooLarge, RuntimeValidationError, UpstreamError
from shipyard.http.client import ConnectionPool, OnAnswer, Response, StreamedResponse, in_task

Headers = list[tuple[bytes, bytes]]

FAILED_CONTAINER = b"x-shipyard-failed-container"
"""Set by the pool on the answer of the step that failed: the container's name."""

_CONTENT_TYPE = b"content-type"
_TARGET = TARGET_CONTAINER_HOSTNAME.lower()


class Container:
    """One container of a group: its name in errors, its hostname, its connections."""

    __slots__ = ("name", "hostname", "pool")

    def __init__(self, name: str, hostname: str | None, url: str) -> None:
        parts = urlsplit(url)
        self.name = name
        self.hostname = hostname
        self.pool = ConnectionPool(parts.hostname or "127.0.0.1", parts.port or 80)

    def __repr__(self) -> str:
        return f"Container({self.name!r}, {self.pool!r})"


def container_name(hostname: str | None, position: int) -> str:
    """How errors name a container: its ContainerHostname, else ``container <n>`` (1-based)."""
    return hostname or f"container {position}"


class ContainerGroupPool(ConnectionPool):
    """The connections of one container group, sending as its model's mode says.

    Its own (inherited) connections go to the first container, for paths other than
    ``/invocations``; its ``ping`` asks every container.
    """

    def __init__(self, containers: Sequence[Container], *, direct: bool) -> None:
        first = containers[0].pool
        super().__init__(first.host, first.port)
        self.containers = tuple(containers)
        self.direct = direct
        self.by_hostname = {c.hostname: c for c in containers if c.hostname}

    def __repr__(self) -> str:
        mode = "Direct" if self.direct else "Serial"
        return f"ContainerGroupPool({mode}, {[c.name for c in self.containers]})"

    def start(
        self,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes | AsyncIterator[bytes],
        max_body: int | None,
        on_answer: OnAnswer,
        *,
        content_length: int | None = None,
    ) -> Callable[[], None]:
        """As ConnectionPool.start. An invocation crosses the group's containers as its
        mode says, in a task (each step awaits the one before); any other path goes to
        the first container."""
        if path != INVOCATIONS_PATH:
            return super().start(
                method, path, headers, body, max_body, on_answer, content_length=content_length
            )
        return in_task(self._invoke(headers, body, content_length, max_body), on_answer)

    async def _invoke(
        self,
        headers: Headers,
        body: bytes | AsyncIterator[bytes],
        content_length: int | None,
        max_body: int | None,
    ) -> Response:
        if self.direct:
            return await self._serial(
                (self.target(headers),), headers, body, content_length, max_body
            )
        self._no_target(headers)
        return await self._serial(self.containers, headers, body, content_length, max_body)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes | AsyncIterator[bytes] = b"",
        *,
        content_length: int | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """As ConnectionPool.stream. In Serial mode every step but the last is sent and
        answered whole (its answer is the next request's body); the last one streams."""
        if path != INVOCATIONS_PATH:
            async with super().stream(
                method, path, headers, body, content_length=content_length
            ) as response:
                yield response
            return
        if self.direct:
            last, position = self.target(headers), 0
        else:
            self._no_target(headers)
            last, position = self.containers[-1], len(self.containers) - 1
            if position:
                answer = await self._serial(
                    self.containers[:-1], headers, body, content_length, None
                )
                if answer.status >= 300:
                    yield _Answered(answer)
                    return
                headers, body, content_length = _next_request(headers, answer), answer.body, None
        async with contextlib.AsyncExitStack() as stack:
            try:
                response = await stack.enter_async_context(
                    last.pool.stream(method, path, headers, body, content_length=content_length)
                )
            except ResponseTooLarge:
                raise
            except UpstreamError as exc:
                raise _reached(exc, last, after_first=position > 0) from exc
            if response.status >= 300:
                response.headers.append((FAILED_CONTAINER, last.name.encode()))
            yield response

    def target(self, headers: Headers) -> Container:
        """The container a Direct request names; ValidationError when it names none."""
        hostname = _header(headers, _TARGET)
        if hostname is None:
            raise RuntimeValidationError(
                "The model's containers are invoked directly (InferenceExecutionConfig.Mode "
                "Direct): name one with TargetContainerHostname (the "
                "X-Amzn-SageMaker-Target-Container-Hostname header). Its containers: "
                f"{', '.join(sorted(self.by_hostname))}."
            )
        container = self.by_hostname.get(hostname.decode(errors="replace"))
        if container is None:
            shown = hostname[:80].decode(errors="replace")
            raise RuntimeValidationError(
                f"TargetContainerHostname {shown!r} is not a container of the model; its "
                f"containers: {', '.join(sorted(self.by_hostname))}."
            )
        return container

    @staticmethod
    def _no_target(headers: Headers) -> None:
        if _header(headers, _TARGET) is not None:
            raise RuntimeValidationError(
                "TargetContainerHostname is only valid for a model whose containers are "
                "invoked directly (InferenceExecutionConfig.Mode Direct); this model is a "
                "Serial inference pipeline."
            )

    async def _serial(
        self,
        steps: Sequence[Container],
        headers: Headers,
        body: bytes | AsyncIterator[bytes],
        content_length: int | None,
        max_body: int | None,
    ) -> Response:
        """Send the request through ``steps`` in turn; the last answer, or the first error."""
        answer: Response | None = None
        for position, container in enumerate(steps):
            if answer is not None:
                headers, body, content_length = _next_request(headers, answer), answer.body, None
            try:
                answer = await container.pool.request(
                    b"POST",
                    INVOCATIONS_PATH,
                    headers,
                    body,
                    content_length=content_length,
                    max_body=max_body,
                )
            except ResponseTooLarge:
                raise
            except UpstreamError as exc:
                raise _reached(exc, container, after_first=position > 0) from exc
            if answer.status >= 300:
                answer.add_header(FAILED_CONTAINER, container.name.encode())
                return answer
        assert answer is not None, "a group has at least one container"
        return answer

    async def ping(self) -> Response:
        """Every container's ``/ping`` at once: the group is healthy when all are; the
        first failure is named."""
        answers = await asyncio.gather(*(c.pool.ping() for c in self.containers))
        for container, answer in zip(self.containers, answers, strict=True):
            if answer.status != 200:
                answer.add_header(FAILED_CONTAINER, container.name.encode())
                return answer
        return answers[-1]

    def close(self) -> None:
        super().close()
        for container in self.containers:
            container.pool.close()


class _Answered(StreamedResponse):
    """A whole answer handed over as a streamed one: a Serial step that failed before
    the last container was reached."""

    __slots__ = ("_body",)

    def __init__(self, response: Response) -> None:
        self.status = response.status
        self.headers = response.headers
        self._body = response.body

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body


def _header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _next_request(headers: Headers, answer: Response) -> Headers:
    """The client's headers with the Content-Type of the answer of the step before."""
    out = [(k, v) for k, v in headers if k.lower() != _CONTENT_TYPE]
    content_type = answer.header(_CONTENT_TYPE)
    if content_type is not None:
        out.append((b"Content-Type", content_type))
    return out


def _reached(exc: UpstreamError, container: Container, *, after_first: bool) -> UpstreamError:
    """The error of a step whose connection failed, naming its container.

    Past the first step the request has reached the group (the first container did its
    work), so it must not be sent to another group: ``sent`` is then True whatever this
    step's connection says.
    """
    return UpstreamError(f"{container.name}: {exc}", sent=exc.sent or after_first)
