"""The least a Python gateway can cost: a reverse proxy with nothing but the hop.

    python bench/floor_proxy.py LISTEN_PORT INSTANCE_PORT

uvloop and httptools, as the gateway; each client connection gets one connection of its
own to the instance, opened when the client connects, and each request is sent there
whole once its body is in, the answer written back whole (status 200 and its
Content-Type; the instance's own status is not passed on). No routing, no limits, no
metrics, no deadlines, no authentication: bench/gateway_floor.sh puts it beside the
gateway in front of the same instance to show what the gateway's own work costs per
request. Not a server to use: it trusts its client and its instance entirely.
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    """The connection to the instance: parses its answers, hands each to the client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.content_type = b"application/octet-stream"
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.body = []
        self.client.answer(self.content_type, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class Client(asyncio.Protocol):
    """One client connection: parses its requests, sends each to the instance."""

    def __init__(self, instance_port: int) -> None:
        self.instance_port = instance_port
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.body: list[bytes] = []
        self.waiting: list[bytes] = []  # requests whole before the upstream connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: Upstream(self), "127.0.0.1", self.instance_port
            )
        except OSError:
            self.close()
            return
        self.upstream = upstream
        for body in self.waiting:
            self._send(body)
        self.waiting = []

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.body = []
        if self.upstream is None:
            self.waiting.append(body)
        else:
            self._send(body)

    def _send(self, body: bytes) -> None:
        assert self.upstream is not None and self.upstream.transport is not None
        self.upstream.transport.write(
            b"POST /invocations HTTP/1.1\r\nHost: instance\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )

    def answer(self, content_type: bytes, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: "
                + content_type
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def main(listen_port: int, instance_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(instance_port), "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
