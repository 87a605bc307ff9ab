"""Operations doors: ``GET /healthz`` and ``GET /metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from shipyard.gateway.edge.auth import Admitted, admitted, resource_arn
from shipyard.gateway.ops.worker_metrics import WorkerMetrics
from shipyard.metrics import Metrics


async def healthz(request: Request) -> Response:
    ready = getattr(request.app.state, "ready", False)
    return PlainTextResponse("ok" if ready else "starting", status_code=200 if ready else 503)


def metrics_endpoint(
    metrics: Metrics, *, region: str, account_id: str, workers: WorkerMetrics | None = None
) -> object:
    """``GET /metrics``: every series for a key that reaches every resource; for a key
    scoped by ``resources``, the gateway's own series and those of the endpoints and
    transform jobs it reaches (a series names its endpoint in its ``endpoint`` label, a
    transform job in ``job``), as the console's and CloudWatch's views of the same
    numbers are scoped. Under ``--workers``, every worker's series, labelled by worker
    (gateway/ops/worker_metrics.py)."""

    async def endpoint(request: Request) -> Response:
        edge = admitted(request.scope)
        keep = None if edge.reaches_all else _visible(edge, region, account_id)
        if workers is not None:
            text = await workers.exposition()
            if keep is not None:  # parsed off the loop: every worker's text, not just ours
                text = await asyncio.to_thread(scoped, _Text(text.decode()), keep)
        elif keep is None:
            text = generate_latest(metrics.registry)
        else:
            text = scoped(metrics.registry, keep)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return endpoint


_SCOPED = (("endpoint", "endpoint"), ("job", "transform-job"))
"""The labels that name a resource a key may not reach, and the resource's kind."""


def _visible(edge: Admitted, region: str, account_id: str) -> Callable[[dict[str, str]], bool]:
    """Whether a sample's labels name only resources ``edge``'s key reaches."""
    reached: dict[tuple[str, str], bool] = {}

    def visible(labels: dict[str, str]) -> bool:
        for label, kind in _SCOPED:
            name = labels.get(label)
            if name is None:
                continue
            if (kind, name) not in reached:
                arn = resource_arn(region, account_id, kind, name)
                reached[kind, name] = edge.reaches(arn)
            if not reached[kind, name]:
                return False
        return True

    return visible


def scoped(source: Collector, visible: Callable[[dict[str, str]], bool]) -> bytes:
    """``source``'s series, less the samples ``visible`` refuses, as an exposition."""
    view = CollectorRegistry(auto_describe=False)
    view.register(_Reached(source, visible))
    return generate_latest(view)


class _Reached(Collector):
    """``source``'s series, less the samples ``visible`` refuses."""

    def __init__(self, source: Collector, visible: Callable[[dict[str, str]], bool]) -> None:
        self.source = source
        self.visible = visible

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            family.samples = [s for s in family.samples if self.visible(s.labels)]
            yield family


class _Text(Collector):
    """The families of an exposition's text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def collect(self) -> Iterator[Metric]:
        yield from text_string_to_metric_families(self.text)
