"""Operations doors: ``GET /healthz`` and ``GET /metrics``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from shipyard.gateway.auth import admitted, resource_arn
from shipyard.gateway.worker_metrics import WorkerMetrics
from shipyard.metrics import Metrics


async def healthz(request: Request) -> Response:
    ready = getattr(request.app.state, "ready", False)
    return PlainTextResponse("ok" if ready else "starting", status_code=200 if ready else 503)


def metrics_endpoint(
    metrics: Metrics, *, region: str, account_id: str, workers: WorkerMetrics | None = None
) -> object:
    """``GET /metrics``: every series for a key that reaches every resource; for a key
    scoped by ``resources``, the gateway's own series and those of the endpoints it
    reaches (a series names its endpoint, or transform job, in its ``endpoint`` label),
    as the console's and CloudWatch's views of the same numbers are scoped. Under
    ``--workers``, every worker's series, labelled by worker (gateway/worker_metrics.py)."""

    async def endpoint(request: Request) -> Response:
        edge = admitted(request.scope)
        registry = metrics.registry if workers is None else await workers.gathered()
        if edge.reaches_all:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        reached: dict[str, bool] = {}

        def keep(name: str) -> bool:
            if name not in reached:
                arn = resource_arn(region, account_id, "endpoint", name)
                reached[name] = edge.reaches(arn)
            return reached[name]

        view = CollectorRegistry(auto_describe=False)
        view.register(_Reached(registry, keep))
        return Response(generate_latest(view), media_type=CONTENT_TYPE_LATEST)

    return endpoint


class _Reached(Collector):
    """``registry``'s series, less the samples of endpoints ``keep`` refuses."""

    def __init__(self, registry: CollectorRegistry, keep: Callable[[str], bool]) -> None:
        self.registry = registry
        self.keep = keep

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [
                sample
                for sample in family.samples
                if "endpoint" not in sample.labels or self.keep(sample.labels["endpoint"])
            ]
            yield family
