"""Operations doors: ``GET /healthz`` and ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from shipyard.metrics import Metrics


async def healthz(request: Request) -> Response:
    ready = getattr(request.app.state, "ready", False)
    return PlainTextResponse("ok" if ready else "starting", status_code=200 if ready else 503)


def metrics_endpoint(metrics: Metrics) -> object:
    async def endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return endpoint
