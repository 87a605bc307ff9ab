"""Slow clients beside a normal one: what trickling bodies do to everyone else's requests.

    .venv/bin/python bench/slow_clients.py          # DURATION=10 SLOW="0 20 200"

One gateway with an endpoint of one instance (tests/models/sum). For each count N of
slow clients, N connections each send a request head with ``Content-Length: 1000`` and
then one body byte every 100 ms, while one normal client sends whole requests back to
back for DURATION seconds on a keep-alive connection. Prints the normal client's
success rate and latency (p50/p99) for each N side by side: the slow clients should
cost the normal one nothing, since a request takes no instance slot before its body is
in. Run it with ``PYTHONPATH=<other checkout>/src`` to measure another version.
"""

from __future__ import annotations

import http.client
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import Control, ServerProcess, entry, env_float, env_ints, start_gateway, table
from harness import time_budget as budget

MODEL = Path(__file__).resolve().parent.parent / "tests" / "models" / "sum"
BODY = b'{"instances": [[1, 2, 3, 4]]}'


def slow_clients(port: int, count: int, stop: threading.Event) -> list[threading.Thread]:
    """``count`` clients trickling their bodies until ``stop``; each reconnects when cut."""

    def trickle() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(
                        b"POST /endpoints/sums/invocations HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                    )
                    while not stop.wait(0.1):
                        s.sendall(b" ")
            except OSError:
                stop.wait(0.1)

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def normal_client(port: int, duration_s: float) -> tuple[int, int, list[float]]:
    """Requests sent, requests answered 200, and each request's latency in ms."""
    sent = ok = 0
    latencies: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        started = time.perf_counter()
        sent += 1
        try:
            conn.request(
                "POST", "/endpoints/sums/invocations", BODY, {"Content-Type": "application/json"}
            )
            response = conn.getresponse()
            response.read()
            ok += response.status == 200
        except OSError:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        latencies.append((time.perf_counter() - started) * 1000)
    conn.close()
    return sent, ok, latencies


def main() -> int:
    duration_s = env_float("DURATION", 10.0)
    counts = env_ints("SLOW", [0, 20, 200])
    rows = []
    with tempfile.TemporaryDirectory(prefix="shipyard-slow-") as tmp:
        gateway: ServerProcess | None = None
        with budget(len(counts) * (duration_s + 30) + 120):
            try:
                gateway, url = start_gateway(Path(tmp) / "home")
                Control(url).deploy("sums", MODEL.as_uri(), count=1)
                gateway.track()
                port = int(url.rsplit(":", 1)[1])
                for n in counts:
                    stop = threading.Event()
                    threads = slow_clients(port, n, stop)
                    time.sleep(1.0 if n else 0)  # let every slow client start its body
                    sent, ok, lat = normal_client(port, duration_s)
                    stop.set()
                    for t in threads:
                        t.join(5)
                    p99 = statistics.quantiles(lat, n=100)[98] if len(lat) > 1 else lat[0]
                    rows.append([n, sent, f"{100 * ok / sent:.1f}%", statistics.median(lat), p99])
                    print(f"  slow={n}: {ok}/{sent} ok, p99 {p99:.2f} ms", file=sys.stderr)
            finally:
                if gateway is not None:
                    gateway.stop()
    print(f"## Slow clients ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)\n")
    print(
        f"One instance of tests/models/sum; N clients send `Content-Length: 1000` and one "
        f"body byte per 100 ms; one normal client sends whole requests for {duration_s:g} s.\n"
    )
    headers = ["slow clients", "normal requests", "normal 200s", "p50 ms", "p99 ms"]
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    entry(main)
