"""Shadow variants: copies of production requests, sent off the client's path.

A shadow variant (ShadowProductionVariants, DESIGN 2.7) is a fleet of its own that gets
a share of the production variant's requests, equal to its weight over the production
weight and capped at all of them. The client's answer never waits for a copy: the door
hands the copies over only once the production answer is sent (or has failed), and each
copy is a task of its own whose outcome goes to ``/metrics`` under the shadow's name
(``shipyard_invocations``, ``shipyard_invocation_{4xx,5xx}_errors``,
``shipyard_model_latency_seconds``) and nowhere else.

A slow or failing shadow must not take the gateway down with it, so copies are bounded
per shadow variant: past ``max_pending`` copies sent and not yet answered, new ones are
dropped and counted (``shipyard_shadow_copies_dropped``) rather than queued. A pending
copy holds its request body, so the bound also caps the memory copies take.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import Counter

from shipyard.errors import ModelError, RuntimeFailure

if TYPE_CHECKING:  # the router and the tables import this module
    from shipyard.routing.router import Call, Router
    from shipyard.routing.table import EndpointRoute, VariantRoute

log = logging.getLogger(__name__)

Copies = dict[str, tuple[tuple["VariantRoute", float], ...]]


def copy_shares(production: Sequence[VariantRoute], shadows: Sequence[VariantRoute]) -> Copies:
    """Per production variant, each shadow with the share of its requests to copy.

    The share is the shadow's weight over the production variant's, capped at 1, so
    equal weights copy every request; a shadow of weight 0 gets none, and a production
    variant of weight 0 (taking requests only by TargetVariant) has each of them copied.
    """
    if not shadows:
        return {}
    copies: Copies = {}
    for variant in production:
        shares = []
        for shadow in shadows:
            if shadow.weight <= 0:
                continue
            share = 1.0 if variant.weight <= 0 else min(shadow.weight / variant.weight, 1.0)
            shares.append((shadow, share))
        if shares:
            copies[variant.name] = tuple(shares)
    return copies


class ShadowCopier:
    """Sends copies of production requests to shadow variants and records their outcome.

    Guarantee: ``send`` never blocks and never raises; the copies run as tasks of their
    own. Fails soft: a copy that cannot be sent, fails or times out is an error in the
    shadow's metrics, and one over the ``max_pending`` bound is dropped and counted.
    """

    def __init__(
        self,
        *,
        router: Router,
        max_pending: int,
        dropped: Counter,
        rng: random.Random | None = None,
    ) -> None:
        self.router = router
        self.max_pending = max_pending
        self._dropped = dropped
        self._rng = rng or random.Random()
        self._pending: dict[tuple[str, str], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"ShadowCopier(max_pending={self.max_pending}, pending={len(self._tasks)})"

    def pick(self, route: EndpointRoute, variant: VariantRoute) -> list[VariantRoute]:
        """The shadows that get a copy of this request to ``variant``, drawn by share."""
        shares = route.copies.get(variant.name)
        if not shares:
            return []
        return [s for s, share in shares if share >= 1.0 or self._rng.random() < share]

    def send(self, route: EndpointRoute, shadows: Sequence[VariantRoute], call: Call) -> None:
        """Start one copy of ``call`` per shadow, or drop it when the shadow is full."""
        for shadow in shadows:
            key = (route.name, shadow.name)
            pending = self._pending.get(key, 0)
            if pending >= self.max_pending:
                self._dropped.labels(route.name, shadow.name).inc()
                continue
            self._pending[key] = pending + 1
            task = asyncio.create_task(self._copy(route, shadow, call, key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _copy(
        self, route: EndpointRoute, shadow: VariantRoute, call: Call, key: tuple[str, str]
    ) -> None:
        metrics = shadow.metrics
        # A copy of its own: the shadow's instance is not the production call's, nor is
        # its session's (a session lives on one production instance; the shadow gets the
        # id and may keep its own state under it).
        copy = call.copy_to(shadow)
        try:
            response, model_s = await self.router.invoke(route, shadow, copy)
        except RuntimeFailure as exc:
            # What the model (or the gateway, for it) answered, as CloudWatch counts it.
            status = exc.original_status_code if isinstance(exc, ModelError) else exc.status_code
        except Exception:
            log.exception("copy to shadow variant %s of %s failed", shadow.name, route.name)
            status = 500
        else:
            status = response.status
            metrics.latency.add(model_s, None)
        finally:
            left = self._pending[key] - 1
            if left:
                self._pending[key] = left
            else:
                del self._pending[key]
        metrics.invocations.inc()
        if status >= 500:
            metrics.errors_5xx.inc()
        elif status >= 400:
            metrics.errors_4xx.inc()

    async def close(self) -> None:
        """Cancel the copies still pending: they are best effort, and the gateway stops."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
