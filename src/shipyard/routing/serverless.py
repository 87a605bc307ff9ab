"""Serverless variants on the data path: admission against MaxConcurrency, and demand.

A serverless variant (ServerlessConfig) has instances only while it has work. This object is
its Admission strategy (routing/strategies.py); the router asks it two things per
request: may it enter (at most ``MaxConcurrency`` requests in flight across the variant,
counting those waiting for a cold start; past that, ThrottlingException), and, when no
instance can take it now, to ask for more instances (``waiting``). Starting them is the
control plane's business (control/serverless.py); the request waits in the variant's
queue meanwhile, and publishing the new instance gives it its turn.

One object lives as long as the fleet it belongs to, across every routing table
published for it, so the count of requests admitted stays true while instances come and
go. Where other gateways route to the same variant, the requests they said they had
admitted (``others``, control/serverless_use.py, at most a lease period old) count
against MaxConcurrency too: the limit is the variant's in all, not each gateway's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from shipyard.errors import Throttling
from shipyard.records import ServerlessConfig

if TYPE_CHECKING:  # the tables import this module
    from shipyard.routing.table import VariantRoute


class ServerlessAdmission:
    """Admission and demand of one serverless variant."""

    __slots__ = ("variant", "config", "slots", "max_instances", "active", "others", "_demand")

    starts_instances = True

    @property
    def bound(self) -> int:
        """Every request admitted may wait here for an instance, the first ones for a
        cold start: admission already bounds them."""
        return self.config.max_concurrency

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
        """Requests admitted here and not finished: waiting for an instance or on one."""
        self.others = 0
        """Requests the other gateways routing to the variant last said they had
        admitted."""
        self._demand = demand

    def __repr__(self) -> str:
        return (
            f"ServerlessAdmission({self.variant!r}, active={self.active}, others={self.others}, "
            f"max_concurrency={self.config.max_concurrency})"
        )

    def admit(self) -> None:
        """Count one more request in, or refuse it past MaxConcurrency (counting the
        other gateways' requests)."""
        if self.active + self.others >= self.config.max_concurrency:
            raise Throttling(
                f"Production variant {self.variant} is serving its MaxConcurrency of "
                f"{self.config.max_concurrency} requests; retry later."
            )
        self.active += 1

    def leave(self) -> None:
        self.active -= 1

    def waiting(self, variant: VariantRoute) -> None:
        """No instance can take a request now: ask for as many as the work at hand needs,
        this request included, and let it wait for one (a cold start, or an answer)."""
        busy = sum(i.in_flight for i in variant.instances) + len(variant.waiters) + 1
        self.want(busy)

    def want(self, busy: int) -> None:
        """``busy`` requests need an instance slot (in flight or waiting): ask for the
        instances that takes, up to what MaxConcurrency can ever use."""
        self._demand(min(math.ceil(busy / self.slots), self.max_instances))
