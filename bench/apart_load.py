"""A load generator that writes each request's head and body apart, as http.client (and
urllib3, requests and httpx on it) does: ``bench/gateway_split.sh`` runs it for LOAD=apart
in place of wrk, which writes a request whole.

    python bench/apart_load.py URL BODY_FILE CONNECTIONS SECONDS

Each connection sends a request's head, then its body in a second write, reads the answer
and sends the next (keep-alive). Prints what gateway_split.sh reads of wrk's output:
``N requests in Ts`` and ``Requests/sec: R``, and the non-2xx count when there is one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from urllib.parse import urlsplit

import uvloop


async def connection(host: str, port: int, head: bytes, body: bytes, until: float) -> list[int]:
    reader, writer = await asyncio.open_connection(host, port)
    done = bad = 0
    try:
        while time.monotonic() < until:
            # Two system calls, as http.client makes them: with nothing buffered, the
            # transport writes each at once (and TCP_NODELAY is on).
            writer.write(head)
            writer.write(body)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            done += 1
            bad += not status_line.startswith(b"HTTP/1.1 2")
    finally:
        writer.close()
    return [done, bad]


async def main() -> None:
    url, body_file, conns, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    parts = urlsplit(url)
    body = open(body_file, "rb").read()
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    counts = await asyncio.gather(
        *(connection(parts.hostname or "", parts.port or 80, head, body, started + seconds)
          for _ in range(conns))
    )  # fmt: skip
    elapsed = time.monotonic() - started
    done, bad = sum(c[0] for c in counts), sum(c[1] for c in counts)
    print(f"  {done} requests in {elapsed:.2f}s")
    if bad:
        print(f"  Non-2xx or 3xx responses: {bad}")
    print(f"Requests/sec: {done / elapsed:.2f}")


if __name__ == "__main__":
    uvloop.run(main())
