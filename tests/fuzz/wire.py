"""Plain-socket HTTP for fuzzing: any bytes out, a parsed answer back within a time bound.

boto3 and http.client refuse to send much of what a hostile client sends (bad header
bytes, lying Content-Lengths, bodies cut short), so requests are written by hand here and
only the answer is parsed, with http.client's parser over the same socket.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANSWER_TIMEOUT_S = 15.0
"""Longest any answer may take; a gateway slower than this counts as hanging."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)


def exchange(
    port: int,
    method: str,
    path: str,
    headers: list[tuple[bytes | str, bytes | str]],
    body: bytes = b"",
    *,
    length: int | None = None,
    chunked: bool = False,
    cut_after: int | None = None,
    timeout_s: float = ANSWER_TIMEOUT_S,
) -> Answer | None:
    """Send one request on a fresh connection and read the answer.

    ``length`` overrides Content-Length (a lie when it differs from the body);
    ``chunked`` sends the body in chunks; ``cut_after`` sends only that many bytes of the
    body and closes the connection, so there is no answer (None) to read.
    Raises ``TimeoutError`` when no answer arrives within ``timeout_s``: a hang.
    """
    host = f"Host: 127.0.0.1:{port}".encode()  # as SigV4 signs it
    lines = [f"{method} {path} HTTP/1.1".encode(), host, b"Connection: close"]
    for name, value in headers:
        lines.append(_bytes(name) + b": " + _bytes(value))
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        payload = _chunks(body)
    else:
        lines.append(b"Content-Length: %d" % (len(body) if length is None else length))
        payload = body
    data = b"\r\n".join(lines) + b"\r\n\r\n" + payload
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        if cut_after is not None:
            _send(sock, data[: len(data) - len(payload) + cut_after])
            with contextlib.suppress(OSError):  # the server may have closed first
                sock.shutdown(socket.SHUT_RDWR)
            return None
        _send(sock, data)
        response = http.client.HTTPResponse(sock, method=method)
        try:
            response.begin()
            content = response.read()
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {timeout_s} s") from exc
        return Answer(
            status=response.status,
            headers={k.lower(): v for k, v in response.getheaders()},
            body=content,
            seconds=time.monotonic() - started,
        )


def _send(sock: socket.socket, data: bytes) -> None:
    """Send what the server will take: it may answer (413) and close before the end."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _chunks(body: bytes, size: int = 65536) -> bytes:
    out = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
           for i in range(0, len(body), size)]  # fmt: skip
    return b"".join(out) + b"0\r\n\r\n"


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")
