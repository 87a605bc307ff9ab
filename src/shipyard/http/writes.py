"""One system call for the writes of one turn of the event loop.

uvicorn writes a response's head when the app sends ``http.response.start`` and its body
at ``http.response.body``: two ``send`` system calls for every answer, in the gateway
(to its client) and in every instance (to the gateway). On the virtual machine where
this was measured a system call cost tens of microseconds, more than most of what the
gateway did for a request (bench/results/gateway_split.md: a third of the gateway's CPU
per request was those writes); where system calls are cheap the saving and the turn's
callback cost about the same (bench/results/gateway_floor.md).
:class:`CoalescingTransport` holds what is written until the loop's current turn ends,
then hands it to the transport in one ``writelines`` (one ``writev``): a head and its
body go out together, and nothing waits longer than the callbacks already due.

Written by hand because it sits between uvicorn's protocol and uvloop's transport,
neither of which offers it; :func:`coalescing` makes a protocol class use it.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

P = TypeVar("P", bound=asyncio.Protocol)


class CoalescingTransport:
    """A transport whose writes in one turn of the loop leave in one call.

    Guarantees: bytes leave in the order written; ``close`` sends what is held first;
    held bytes are dropped only when the connection is already closing (lost or
    aborted), as the transport itself would drop them. Everything but ``write`` and
    ``close`` is the wrapped transport's own.
    """

    __slots__ = ("_transport", "_loop", "_held", "is_closing")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        # Asked on every answer: the transport's own, with no frame of ours around it.
        self.is_closing = transport.is_closing

    def __repr__(self) -> str:
        return f"CoalescingTransport({self._transport!r})"

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = [data]
            self._loop.call_soon(self._flush)
        else:
            held.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        held = self._held
        if held is None:
            return
        self._held = None
        transport = self._transport
        if transport.is_closing():
            return
        if len(held) == 1:
            transport.write(held[0])
        else:
            transport.writelines(held)

    def get_write_buffer_size(self) -> int:
        """The bytes not yet sent: the transport's, and those held for this turn's end."""
        held = self._held
        size: int = self._transport.get_write_buffer_size()
        return size if held is None else size + sum(map(len, held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def coalescing(protocol: type[P]) -> type[P]:
    """``protocol`` with its transport's writes coalesced (see the module)."""

    class Coalescing(protocol):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))

    Coalescing.__name__ = Coalescing.__qualname__ = f"Coalescing{protocol.__name__}"
    return Coalescing
