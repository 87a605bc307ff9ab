"""The gateway's Python work per invocation, counted rather than timed: bytecodes run and
functions called for one echo request, the same on every run.

    .venv/bin/python bench/gateway_opcodes.py             # N=1000 TOP=25

On this 2-core VM the same code's CPU per request moves by ±10% from one run to the next,
more than most changes to the data path. Bytecodes per request do not move; in the
running gateway they go with its CPU per request (bench/results/gateway_taken.md).

One process: the gateway's HTTP protocol (http/server.py) fed an InvokeEndpoint
request as bytes, the edge, the doors and the router of bench/gateway_layers.py, and an
instance connection pool (http/client.py) talking HTTP over loopback to a small echo
server in the same process (whose own work is left out of the counts). Two paths: the
ASGI app through uvicorn's request cycle, and the callback path (``serve_whole``),
its head and body in one read (boto3 writes them together) or in two (http.client,
urllib3, requests and httpx write them apart; before the edge held a request for the read
after its head, such a request went the ASGI way).
A tracer counts every bytecode and call in the gateway's code; TOP lists the functions
that run the most bytecodes. Compare trees with PYTHONPATH=TREE/src.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_layers import REQUEST, _edge, http_protocol

from shipyard.routing.instance import Instance

HERE = Path(__file__).resolve()
Counts = collections.Counter[tuple[str, str]]


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The instance: answers each request with its body, as the peers' echo model does."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        writer.close()


def _where(frame: FrameType) -> tuple[str, str]:
    return frame.f_code.co_filename, frame.f_code.co_name


async def count(n: int, *, take: bool, apart: bool = False) -> tuple[Counts, Counts]:
    """Bytecodes and calls of the gateway's code over ``n`` requests, by function."""
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    edge = _edge()
    route = edge.app.endpoint_doors["invocations"].router.routes["echo"]  # type: ignore[attr-defined]
    (instance,) = route.variants[0].instances
    instance.pool = Instance("i-1", "AllTraffic", f"http://127.0.0.1:{port}").pool
    proto, transport = http_protocol(edge, edge.serve_whole if take else None)
    loop = asyncio.get_running_loop()

    head, body = REQUEST.split(b"\r\n\r\n", 1)
    reads = [head + b"\r\n\r\n", body] if apart else [REQUEST]

    async def run(requests: int) -> None:
        for _ in range(requests):
            transport.written = loop.create_future()
            for data in reads:
                proto.data_received(data)
            await transport.written

    await run(500)  # connections open, the latency logs folded once
    opcodes: Counts = collections.Counter()
    calls: Counts = collections.Counter()
    ours = {echo.__code__, run.__code__}

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code in ours or code.co_filename.endswith("asyncio/streams.py"):
            return None  # the instance's side, and this loop
        if event == "call":
            frame.f_trace_opcodes = True
            calls[_where(frame)] += 1
        elif event == "opcode":
            opcodes[_where(frame)] += 1
        return trace

    sys.settrace(trace)
    try:
        await run(n)
    finally:
        sys.settrace(None)
        instance.pool.close()
        server.close()
        await server.wait_closed()
    return opcodes, calls


async def main() -> None:
    n = int(os.environ.get("N", "1000"))
    top = int(os.environ.get("TOP", "25"))
    for name, take, apart in (
        ("asgi", False, False),
        ("taken", True, False),
        ("head and body apart", True, True),
    ):
        opcodes, calls = await count(n, take=take, apart=apart)
        print(
            f"{name}: {sum(opcodes.values()) / n:,.0f} bytecodes and "
            f"{sum(calls.values()) / n:,.1f} calls per request"
        )
        for (path, function), ran in opcodes.most_common(top):
            short = path.split("site-packages/")[-1].split("src/")[-1]
            print(f"  {ran / n:7.1f}  {short}:{function}")


if __name__ == "__main__":
    uvloop.run(main())
