"""Routing put together: the router, the copier of shadow variants' requests, the
invocation under every door, and the exchange of closed sessions with the store."""

from __future__ import annotations

from dataclasses import dataclass

from shipyard.metrics import Metrics
from shipyard.routing.invocation import Invocations
from shipyard.routing.router import Router
from shipyard.routing.session_closes import SessionCloses
from shipyard.routing.sessions import Sessions
from shipyard.routing.shadow import PendingCopies, ShadowCopier
from shipyard.settings import Settings
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.sessions import ClosedSessions, SessionPins


@dataclass(frozen=True)
class Routing:
    router: Router
    shadows: ShadowCopier
    invocations: Invocations
    session_closes: SessionCloses


def build(settings: Settings, store: MetadataStore, metrics: Metrics) -> Routing:
    copies = PendingCopies()
    router = Router(
        timeout_s=settings.invocation_timeout_s,
        max_response_bytes=settings.max_response_bytes,
        copies_pending=copies.of,
    )
    metrics.watch_in_flight(router.in_flight)
    metrics.watch_queued(router.queued)
    shadows = ShadowCopier(
        router=router,
        max_pending=settings.shadow_max_pending_copies,
        dropped=metrics.shadow_copies_dropped,
        pending=copies,
    )
    sessions = Sessions(
        ttl_s=settings.session_ttl_s,
        max_ttl_s=settings.session_max_ttl_s,
        max_open=settings.max_sessions,
        pins=SessionPins(store.engine),
    )
    invocations = Invocations(
        router,
        shadows=shadows,
        sessions=sessions,
        region=settings.region,
        account_id=settings.account_id,
    )
    session_closes = SessionCloses(
        sessions,
        ClosedSessions(store.engine),
        # A close reaches the other gateways within a second or so; each reads the
        # store no more often, sessions or not.
        period_s=max(settings.routes_refresh_s, 1.0),
    )
    return Routing(
        router=router, shadows=shadows, invocations=invocations, session_closes=session_closes
    )
