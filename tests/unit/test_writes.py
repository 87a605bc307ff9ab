"""CoalescingTransport: the writes of one turn of the loop leave in one call, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from shipyard.http.writes import CoalescingTransport


class Recording:
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, lines: list[bytes]) -> None:
        self.calls.append(("writelines", list(lines)))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


def test_writes_of_one_turn_leave_together_and_in_order() -> None:
    async def scenario() -> Recording:
        inner = Recording()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"head")
        transport.write(b"body")
        assert inner.calls == []  # held until the turn ends
        await asyncio.sleep(0)
        transport.write(b"alone")
        await asyncio.sleep(0)
        assert transport.get_extra_info("peername") == "extra:peername"
        return inner

    inner = asyncio.run(scenario())
    assert inner.calls == [("writelines", [b"head", b"body"]), ("write", b"alone")]


def test_close_sends_what_is_held_first_and_a_lost_connection_drops_it() -> None:
    async def scenario() -> tuple[Recording, Recording]:
        loop = asyncio.get_running_loop()
        closed = Recording()
        transport = CoalescingTransport(closed, loop)
        transport.write(b"last words")
        transport.close()
        await asyncio.sleep(0)
        lost = Recording()
        transport = CoalescingTransport(lost, loop)
        transport.write(b"nobody reads this")
        lost.closing = True  # the connection went away before the turn ended
        await asyncio.sleep(0)
        return closed, lost

    closed, lost = asyncio.run(scenario())
    assert closed.calls == [("write", b"last words"), ("close", None)]
    assert lost.calls == []
