"""Idle keep-alive connections closed by one timer per connection, not one per request.

uvicorn arms a timer when a response completes and cancels it when the next request's
first bytes arrive: two operations on the loop's timer heap for every request, on the
gateway and on every instance (bench/results/instance_direct.md measures them). Here a
connection notes when it fell idle; its one timer, armed when it first falls idle, closes
it once it has been idle for ``timeout_keep_alive``, and otherwise, when it fires early,
is armed again for what is left. Under load a connection's timer fires about once per
``timeout_keep_alive`` instead of being armed and cancelled per request.

Written by hand because it replaces a step inside uvicorn's protocol, which offers no
hook for it; everything else in that step (the request count, reading resumed, the next
pipelined request started) is uvicorn's, repeated here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class LazyKeepAlive(HttpToolsProtocol):
    """uvicorn's httptools protocol with the keep-alive timer of the module."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle_since: float | None = None
        """When the connection fell idle (its last response complete, nothing since);
        None while a request is arriving or being answered."""
        self._idle_timer: asyncio.TimerHandle | None = None

    def idle_from_now(self) -> None:
        """The connection is idle from now: closed ``timeout_keep_alive`` from now
        unless a request begins first."""
        now = self.loop.time()
        self._idle_since = now
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(now + self.timeout_keep_alive, self._idle_check)

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when data arrives and when the connection is lost.
        self._idle_since = None

    def on_message_begin(self) -> None:
        # A request that began in data already read (pipelined behind one answered
        # meanwhile) makes the connection busy too.
        self._idle_since = None
        super().on_message_begin()

    def on_response_complete(self) -> None:
        # uvicorn's, with idle_from_now in place of a new timer.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.idle_from_now()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)

    def _idle_check(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None or self.transport.is_closing():
            return  # busy: the request's answer makes it idle again
        left = since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self._idle_timer = self.loop.call_later(left, self._idle_check)
        else:
            self.timeout_keep_alive_handler()
