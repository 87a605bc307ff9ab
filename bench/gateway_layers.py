"""The gateway's CPU per invocation, layer by layer, in one process with no sockets.

    .venv/bin/python bench/gateway_layers.py        # N=50000 ROUNDS=3

Two measures, each the process's CPU time over N requests, ROUNDS times:

- ``protocol``: the gateway's HTTP protocol (uvicorn's httptools protocol with the
  edge's limits, http/server.py) parsing an InvokeEndpoint request fed to it as
  bytes and running uvicorn's ASGI cycle around an app that reads the body and answers
  it, written to a transport that keeps nothing;
- ``layers``: what runs between the protocol and the instance's connection pool: the
  edge (gateway/edge/signatures.py ReadOnce), the path router, the runtime door, the
  invocation (routing/invocation.py) and the router, with an instance whose pool answers
  at once.

What neither covers is the rest of a real request's cost: the system calls and the
event loop's turns for the client's and the instance's connections, the connection pool
(http/client.py), and caches no longer warm between requests (bench/gateway_floor.sh
measures the whole). Compare trees with PYTHONPATH=TREE/src.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from shipyard.gateway.doors.endpoint import EndpointAccess
from shipyard.gateway.doors.runtime import RuntimeDoor
from shipyard.gateway.edge.browser import BrowserRules
from shipyard.gateway.edge.signatures import ReadOnce
from shipyard.http.client import Response
from shipyard.http.paths import PathRouter
from shipyard.http.server import limited_protocol
from shipyard.metrics import Metrics
from shipyard.routing.instance import Instance
from shipyard.routing.invocation import Invocations
from shipyard.routing.policies import Random
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute

BODY = b'{"instances": [[1.0, 2.0, 3.0, 4.0]]}'
REQUEST = (
    b"POST /endpoints/echo/invocations HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
    b"Content-Type: application/json\r\nContent-Length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)


class Transport:
    """A transport that drops what is written and says when something was."""

    def __init__(self) -> None:
        self.written: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if self.written is not None and not self.written.done():
            self.written.set_result(None)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def echo_app(scope: Any, receive: Any, send: Any) -> None:
    body = (await receive())["body"]
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def http_protocol(app: Any, take: Any = None) -> tuple[Any, Transport]:
    """The gateway's HTTP protocol around ``app``, as ``shipyard serve`` configures
    uvicorn, connected to a Transport."""
    config = Config(
        app, http="httptools", access_log=False, server_header=False, proxy_headers=False
    )
    config.load()
    cls = limited_protocol(
        max_headers=100, max_head_bytes=65536, head_timeout_s=10, serve_whole=take
    )
    proto = cls(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    proto.connection_made(transport)
    return proto, transport


async def feed(proto: Any, transport: Transport, n: int) -> float:
    """Process CPU seconds for ``n`` requests fed one at a time, each answered."""
    loop = asyncio.get_running_loop()
    started = time.process_time()
    for _ in range(n):
        transport.written = loop.create_future()
        proto.data_received(REQUEST)
        await transport.written
    return time.process_time() - started


async def protocol(n: int) -> float:
    proto, transport = http_protocol(echo_app)
    return await feed(proto, transport, n)


class AtOnce:
    """An instance's connection pool that answers every request with its body at once."""

    async def request(self, method: bytes, path: bytes, headers: Any, body: bytes, **_: Any) -> Any:
        return Response(200, [(b"content-type", b"application/json")], body)

    def start(
        self,
        method: bytes,
        path: bytes,
        headers: Any,
        body: bytes,
        max_body: Any,
        on_answer: Any,
        **_: Any,
    ) -> Any:
        response = Response(200, [(b"content-type", b"application/json")], body)
        asyncio.get_running_loop().call_soon(on_answer, response, None)
        return _nothing


def _nothing() -> None:
    pass


class Edge:
    """What the HTTP protocol leaves in the scope for the doors (http/server.py):
    the body is whole, and a disconnect is never reported."""

    completed_messages = 1

    @staticmethod
    def watch_lost(callback: Any) -> Any:
        return lambda: None


def _edge() -> ReadOnce:
    instance = Instance("i-1", "AllTraffic", "http://127.0.0.1:9", concurrency=1)
    instance.pool = AtOnce()  # type: ignore[assignment]
    variant = VariantRoute(
        "AllTraffic",
        weight=1.0,
        policy=Random(max_in_flight=100),
        instances=[instance],
        metrics=Metrics().for_variant("echo", "AllTraffic"),
    )
    router = Router(timeout_s=60)
    router.publish(EndpointRoute("echo", [variant]))
    door = RuntimeDoor(
        access=EndpointAccess(invocations=Invocations(router), max_payload_bytes=6 << 20)
    )

    async def nowhere(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(scope["path"])

    return ReadOnce(
        PathRouter(endpoint_doors={"invocations": door}, v2=nowhere, v1=nowhere, fallback=nowhere),
        browser=BrowserRules(8080),  # a gateway without auth:, as `shipyard serve` starts it
    )


HEADERS = [
    (b"host", b"127.0.0.1:8080"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
]


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/endpoints/echo/invocations",
        "headers": HEADERS,
        "client": ("127.0.0.1", 50000),
        "shipyard.edge": (Edge, 1),
    }


async def layers(n: int) -> float:
    edge = _edge()
    message = {"type": "http.request", "body": BODY, "more_body": False}
    answers: list[int] = []

    async def receive() -> Any:
        return message

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            answers.append(message["status"])

    started = time.process_time()
    for _ in range(n):
        scope = _scope()
        await edge(scope, receive, send)
    spent = time.process_time() - started
    if answers != [200] * n:
        raise RuntimeError(f"the door answered {sorted(set(answers))}")
    return spent


async def taken(n: int) -> float:
    edge = _edge()
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[int] | None = None

    def respond(status: int, headers: Any, body: bytes) -> None:
        assert answered is not None
        answered.set_result(status)

    started = time.process_time()
    for _ in range(n):
        answered = loop.create_future()
        if not edge.serve_whole(_scope(), BODY, respond):
            raise RuntimeError("the edge did not serve the request whole")
        if await answered != 200:
            raise RuntimeError(f"the door answered {answered.result()}")
    return time.process_time() - started


async def whole(n: int, *, take: bool) -> float:
    """The protocol and the layers together: request bytes in, answer bytes out, through
    the ASGI app (``take`` False) or on the callback path (``serve_whole``)."""
    edge = _edge()
    proto, transport = http_protocol(edge, edge.serve_whole if take else None)
    return await feed(proto, transport, n)


async def gateway(n: int) -> float:
    return await whole(n, take=False)


async def gateway_taken(n: int) -> float:
    return await whole(n, take=True)


async def main() -> None:
    n = int(os.environ.get("N", "50000"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    measures = {
        "protocol": protocol,
        "layers": layers,
        "taken": taken,
        "gateway": gateway,
        "gateway_taken": gateway_taken,
    }
    for name, measure in measures.items():
        spent = [await measure(n) for _ in range(rounds)]
        print(f"{name}: " + " / ".join(f"{s / n * 1e6:.2f}" for s in spent) + " µs per request")


if __name__ == "__main__":
    uvloop.run(main())
