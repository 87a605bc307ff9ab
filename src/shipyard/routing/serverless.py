"""Serverless variants on the data path: admission against MaxConcurrency, and demand.

A serverless variant (DESIGN 3.2) has instances only while it has work. The router asks
this object two things per request: may it enter (at most ``MaxConcurrency`` requests in
flight across the variant, counting those waiting for a cold start; past that,
ThrottlingException), and, when no instance can take it now, to ask for more instances
(``want``). Starting them is the control plane's business (control/serverless.py); the
request waits in the variant's queue meanwhile, and publishing the new instance gives it
its turn.

One object lives as long as the fleet it belongs to, across every routing table
published for it, so the count of requests admitted stays true while instances come and
go.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from shipyard.errors import Throttling
from shipyard.records import ServerlessConfig


class ServerlessRoute:
    """Admission and demand of one serverless variant."""

    __slots__ = ("variant", "config", "slots", "max_instances", "active", "_demand")

    def __init__(
        self,
        variant: str,
        config: ServerlessConfig,
        *,
        slots: int,
        demand: Callable[[int], None],
    ) -> None:
        self.variant = variant
        self.config = config
        self.slots = slots
        """Requests one instance serves at a time."""
        self.max_instances = math.ceil(config.max_concurrency / slots)
        self.active = 0
        """Requests admitted and not finished: waiting for an instance or on one."""
        self._demand = demand

    def __repr__(self) -> str:
        return (
            f"ServerlessRoute({self.variant!r}, active={self.active}, "
            f"max_concurrency={self.config.max_concurrency})"
        )

    def admit(self) -> None:
        """Count one more request in, or refuse it past MaxConcurrency."""
        if self.active >= self.config.max_concurrency:
            raise Throttling(
                f"Production variant {self.variant} is serving its MaxConcurrency of "
                f"{self.config.max_concurrency} requests; retry later."
            )
        self.active += 1

    def leave(self) -> None:
        self.active -= 1

    def want(self, busy: int) -> None:
        """``busy`` requests need an instance slot (in flight or waiting): ask for the
        instances that takes, up to what MaxConcurrency can ever use."""
        self._demand(min(math.ceil(busy / self.slots), self.max_instances))
