"""grpcio's two Python servers, empty: what a unary call costs the server before any of
the door's own work (bench/results/oip.md).

    .venv/bin/python bench/grpc_servers.py      # CONCS="1 8 32" ROUNDS=2 DURATION=5 THREADS="1 4"

Each server answers ``inference.GRPCInferenceService/ModelInfer`` with the request's own
bytes (no protobuf parsing, no handler work): grpc.aio on uvloop, as the gateway's OIP door
runs it, and the synchronous ``grpc.server`` with a thread pool of THREADS. Driven by
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

SERVICE = "inference.GRPCInferenceService"
PAYLOAD = bytes(64)


def serve(kind: str, port: int, threads: int) -> None:
    """The server process: ``kind`` aio or sync, answering each call with its request."""
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


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(kind: str, threads: int, conc: int, duration: float, body: Path) -> tuple[float, float]:
    """Calls/s and the server's CPU µs per call."""
    from harness import free_port

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
        before = cpu_s(server.pid)
        out = subprocess.run(
            [*args[:1], "-D", f"{duration:g}", *args[1:]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        used = cpu_s(server.pid) - before
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
        name = "grpc.aio on uvloop" if kind == "aio" else f"grpc.server, {threads} thread(s)"
        rates = " / ".join(f"{r:,.0f}" for r, _ in cells)
        costs = " / ".join(f"{c:.0f}" for _, c in cells)
        print(f"| {name} | {conc} | {rates} | {costs} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
