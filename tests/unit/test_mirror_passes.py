"""FleetMirror: a pass that fails part way publishes what it could not on the next pass.
A real SQLite store and lease table, a gateway "other" holding the endpoint's lease and
recording its routes, and this gateway's mirror publishing them to its router."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shipyard.control.mirror import FleetMirror
from shipyard.control.publishing import RoutePublisher
from shipyard.metrics import Metrics
from shipyard.records import (
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    RoutingStrategy,
    VariantSpec,
)
from shipyard.routing.router import Router
from shipyard.storage.leases import ENDPOINT, LeaseStore
from shipyard.storage.metadata import MetadataStore


class Blip(MetadataStore):
    """The real store, whose reads of the configs in ``failing`` fail once each (the
    database gone for a moment)."""

    failing: set[str]

    def get_endpoint_config(self, name: str) -> EndpointConfig:
        if name in self.failing:
            self.failing.discard(name)
            raise ConnectionError(f"the database went away reading {name}")
        return super().get_endpoint_config(name)


def config(name: str) -> EndpointConfig:
    variant = VariantSpec("v1", "m", "ml.m5.large", 1, 1.0, RoutingStrategy.RANDOM)
    return EndpointConfig(name, f"arn:aws:sagemaker:::endpoint-config/{name}", (variant,), now())


def now() -> datetime:
    return datetime.now(UTC)


def routes(config_name: str, port: int) -> dict[str, Any]:
    """What gateway "other" records of its fleet: one instance of v1 on ``port``."""
    instance = {
        "id": f"i-{port}",
        "url": f"http://127.0.0.1:{port}",
        "healthy": True,
        "concurrency": 1,
        "ref": None,
    }
    variant = {"name": "v1", "weight": 1.0, "starting": 0, "prefix": None, "instances": [instance]}
    return {"config": config_name, "host": socket.gethostname(), "variants": [variant]}


def store_of(tmp_path: Path, endpoints: dict[str, str]) -> tuple[Blip, LeaseStore]:
    """A migrated store with ``endpoints`` (name: config, InService), each config in it,
    and gateway "other" holding every endpoint's lease."""
    store = Blip(f"sqlite:///{tmp_path / 'meta.db'}")
    store.failing = set()
    store.migrate()
    for name, config_name in endpoints.items():
        store.create_endpoint_config(config(config_name))
        endpoint = Endpoint(
            name, f"arn:aws:sagemaker:::endpoint/{name}", config_name,
            EndpointStatus.IN_SERVICE, None, now(), now(), (),
        )  # fmt: skip
        store.create_endpoint(endpoint, max_endpoints=10)
    other = LeaseStore(store.engine, holder="other")
    assert other.claim(ENDPOINT, list(endpoints), lease_s=60) == dict.fromkeys(endpoints, 1)
    return store, other


def mirror_of(store: Blip) -> tuple[Router, FleetMirror]:
    """This gateway ("me", holding nothing): its router and its mirror of the store."""
    router = Router(timeout_s=5)
    publisher = RoutePublisher(
        router=router, metrics=Metrics(), max_in_flight=4, model_routing="affinity"
    )
    mirror = FleetMirror(
        store=store,
        leases=LeaseStore(store.engine, holder="me"),
        publisher=publisher,
        holds=lambda name: False,
    )
    return router, mirror


def test_routes_whose_config_could_not_be_read_are_published_on_the_next_pass(
    tmp_path: Path,
) -> None:
    store, other = store_of(tmp_path, {"e": "c1"})
    store.create_endpoint_config(config("c2"))
    router, mirror = mirror_of(store)

    def urls() -> list[str]:
        return [i.url for i in router.routes["e"].instances()]

    async def main() -> None:
        assert other.record_routes("e", routes("c1", 9001))
        await mirror.refresh(store.list_endpoints)
        assert urls() == ["http://127.0.0.1:9001"]
        # The holder moves to a new config and instance; reading that config fails once.
        assert other.record_routes("e", routes("c2", 9002))
        store.failing.add("c2")
        await mirror.refresh(store.list_endpoints)  # logged, and the pass goes on
        assert urls() == ["http://127.0.0.1:9001"]  # the old routes serve meanwhile
        await mirror.refresh(store.list_endpoints)
        assert urls() == ["http://127.0.0.1:9002"]
        router.close()

    try:
        asyncio.run(main())
    finally:
        store.close()


def test_an_endpoint_whose_routes_cannot_be_mirrored_holds_up_no_other(tmp_path: Path) -> None:
    store, other = store_of(tmp_path, {"a": "c-a", "b": "c-b"})
    # Endpoint a's routes come from a holder that records them in a shape this gateway
    # cannot read (another version): b's are mirrored all the same, on every pass.
    broken = routes("c-a", 9001)
    del broken["variants"][0]["prefix"]
    assert other.record_routes("a", broken)
    assert other.record_routes("b", routes("c-b", 9002))
    router, mirror = mirror_of(store)

    async def main() -> None:
        for _ in range(2):
            await mirror.refresh(store.list_endpoints)
            assert [i.url for i in router.routes["b"].instances()] == ["http://127.0.0.1:9002"]
            assert "a" not in router.routes
        router.close()

    try:
        asyncio.run(main())
    finally:
        store.close()
