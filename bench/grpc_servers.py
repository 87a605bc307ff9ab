"""gRPC servers in Python, empty: what a unary call costs the server before any of the
door's own work (bench/results/oip.md).

    .venv/bin/python bench/grpc_servers.py      # CONCS="1 8 32" ROUNDS=2 DURATION=5 THREADS="1 4"

Each server answers ``inference.GRPCInferenceService/ModelInfer`` with the request's own
bytes (no protobuf parsing, no handler work): grpc.aio on uvloop, as the gateway's OIP door
runs it; the synchronous ``grpc.server`` with a thread pool of THREADS; ``grpclib``, the
pure-Python gRPC server for asyncio (on hyper-h2), with a codec that passes bytes through;
and ``h2``, hyper-h2 alone on a uvloop protocol, the least a gRPC server of our own
beside the HTTP/1.1 doors would run per call (it trusts everyone: framing, flow control
and errors beyond the happy path are left out, which only flatters it). Driven by
h2load (nghttp2, C: ``apt-get install nghttp2-client``) on one HTTP/2 connection with C
streams in flight, as tritonclient's one channel; the server's CPU (user + system,
/proc/PID/stat) per call over DURATION seconds after 2 s of warm-up, rounds alternating.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

SERVICE = "inference.GRPCInferenceService"
PAYLOAD = bytes(64)


def serve(kind: str, port: int, threads: int) -> None:
    """The server process: ``kind`` aio, sync, grpclib or h2, answering each call with its
    request."""
    if kind == "h2":
        serve_h2(port)
        return
    if kind == "grpclib":
        serve_grpclib(port)
        return
    import grpc

    def handlers(fn: object) -> object:
        return grpc.method_handlers_generic_handler(
            SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(fn)}
        )

    options = [("grpc.so_reuseport", 0)]
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(threads), options=options)
        server.add_generic_rpc_handlers((handlers(lambda request, context: request),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    async def answer(request: bytes, context: object) -> bytes:
        return request

    async def main() -> None:
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((handlers(answer),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def serve_grpclib(port: int) -> None:
    """A unary echo on grpclib, the request's bytes passed through by a codec of no-ops."""
    import uvloop
    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.base import CodecBase
    from grpclib.server import Server, Stream

    class Bytes(CodecBase):
        __content_subtype__ = "proto"

        def encode(self, message: Any, message_type: Any) -> bytes:
            return bytes(message)

        def decode(self, data: bytes, message_type: Any) -> Any:
            return data

    async def answer(stream: Stream[bytes, bytes]) -> None:
        await stream.send_message(await stream.recv_message())

    class Echo:
        def __mapping__(self) -> dict[str, Handler]:
            path = f"/{SERVICE}/ModelInfer"
            return {path: Handler(answer, Cardinality.UNARY_UNARY, bytes, bytes)}

    async def main() -> None:
        server = Server([Echo()], codec=Bytes())
        await server.start("127.0.0.1", port)
        print("ready", flush=True)
        await server.wait_closed()

    uvloop.run(main())


def serve_h2(port: int) -> None:
    """A unary gRPC echo on hyper-h2: each stream's DATA gathered, answered at its end with
    headers, the same bytes (already gRPC-framed) and a ``grpc-status`` trailer."""
    import asyncio

    import uvloop
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from h2.events import DataReceived, StreamEnded

    config = H2Configuration(client_side=False, header_encoding=None)
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
            self.h2 = H2Connection(config)
            self.h2.initiate_connection()
            self.transport.write(self.h2.data_to_send())
            self.bodies: dict[int, bytes] = {}

        def data_received(self, data: bytes) -> None:
            h2 = self.h2
            for event in h2.receive_data(data):
                if isinstance(event, DataReceived):
                    sid = event.stream_id
                    self.bodies[sid] = self.bodies.get(sid, b"") + event.data
                    h2.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, StreamEnded):
                    sid = event.stream_id
                    h2.send_headers(sid, head)
                    h2.send_data(sid, self.bodies.pop(sid, b""))
                    h2.send_headers(sid, trailers, end_stream=True)
            out = h2.data_to_send()
            if out:
                self.transport.write(out)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def measure(kind: str, threads: int, conc: int, duration: float, body: Path) -> tuple[float, float]:
    """Calls/s and the server's CPU µs per call."""
    from harness import cpu_seconds, free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, str(port), str(threads)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/{SERVICE}/ModelInfer"
        args = ["h2load", "-c", "1", "-m", str(conc), "-H", "content-type: application/grpc",
                "-H", "te: trailers", "-d", str(body), url]  # fmt: skip
        subprocess.run([*args[:1], "-D", "2", *args[1:]], capture_output=True, check=True)
        before = cpu_seconds(server.pid)
        out = subprocess.run(
            [*args[:1], "-D", f"{duration:g}", *args[1:]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        used = cpu_seconds(server.pid) - before
        done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", out).group(1))  # type: ignore[union-attr]
        ok = int(re.search(r"(\d+) succeeded", out).group(1))  # type: ignore[union-attr]
        assert ok == done > 0, out
        return done / duration, used / done * 1e6
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    from harness import cpu_probe_ms

    if shutil.which("h2load") is None:
        sys.exit("h2load not found: apt-get install nghttp2-client")
    concs = [int(c) for c in os.environ.get("CONCS", "1 8 32").split()]
    rounds = int(os.environ.get("ROUNDS", "2"))
    duration = float(os.environ.get("DURATION", "5"))
    kinds = [("aio", 0)] + [("sync", int(t)) for t in os.environ.get("THREADS", "1 4").split()]
    kinds += [("grpclib", 0), ("h2", 0)]
    probe_before = cpu_probe_ms()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "call.bin"
        body.write_bytes(b"\x00" + len(PAYLOAD).to_bytes(4, "big") + PAYLOAD)  # gRPC framing
        for _ in range(rounds):
            for conc in concs:
                for kind, threads in kinds:
                    cell = measure(kind, threads, conc, duration, body)
                    results.setdefault((kind, threads, conc), []).append(cell)
                    print(f"  {kind} threads={threads} c={conc}: {cell[0]:,.0f}/s "
                          f"{cell[1]:.0f} µs", file=sys.stderr)  # fmt: skip
    probe_after = cpu_probe_ms()
    print(f"{started}, CPU probe {probe_before} ms before, {probe_after} ms after; "
          f"h2load -c 1 -m C, {duration:g} s per cell, {rounds} rounds.\n")  # fmt: skip
    print("| server | c | calls/s (rounds) | server CPU µs per call (rounds) |")
    print("|---|---|---|---|")
    for (kind, threads, conc), cells in results.items():
        names = {
            "aio": "grpc.aio on uvloop",
            "grpclib": "grpclib on uvloop",
            "h2": "hyper-h2 on uvloop",
        }
        name = names.get(kind, f"grpc.server, {threads} thread(s)")
        rates = " / ".join(f"{r:,.0f}" for r, _ in cells)
        costs = " / ".join(f"{c:.0f}" for _, c in cells)
        print(f"| {name} | {conc} | {rates} | {costs} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
