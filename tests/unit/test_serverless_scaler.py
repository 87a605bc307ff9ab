"""A serverless cold start that fails: the requests waiting for the variant are failed
and the other gateways told, unless UpdateEndpoint replaced the fleet it was started
for meanwhile (its requests moved to the new fleet's table, whose own cold start they
wait for). The provisioner stands in for one whose model fails to load when told."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from shipyard.backends.base import InstanceSpec
from shipyard.control.serverless import ServerlessScaler
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Fleet, FleetFailed, Slot
from shipyard.records import EndpointConfig, RoutingStrategy, ServerlessConfig, VariantSpec
from shipyard.routing.router import Router
from shipyard.routing.serverless import ServerlessAdmission
from tests.unit.test_serverless_waiting import _until


class _FailingStarts:
    """Each start waits until ``fail`` is set, then fails as a model that cannot load."""

    def __init__(self) -> None:
        self.fail = asyncio.Event()
        self.started = 0

    def new_slot(self, endpoint: str, fleet: Fleet, variant: str) -> Slot:
        self.started += 1
        return Slot(spec=InstanceSpec(f"{endpoint}-{variant}-{self.started}", ""), variant=variant)

    async def start_slot(self, slot: Slot) -> None:
        await self.fail.wait()
        raise FleetFailed("the weights are gone")


def _fleet() -> Fleet:
    serverless = ServerlessConfig(memory_mb=1024, max_concurrency=4)
    variant = VariantSpec(
        "v1", "m", "ml.m5.large", 0, 1.0, RoutingStrategy.RANDOM, serverless=serverless
    )
    return Fleet(
        endpoint="e",
        config=EndpointConfig("e", "arn:e", (variant,), datetime.now(UTC)),
        slots={"v1": []},
        weights={"v1": 1.0},
        serverless={"v1": ServerlessAdmission("v1", serverless, slots=1, demand=lambda n: None)},
    )


class _Router(Router):
    """A real router that notes which variants' waiting requests it was told to fail."""

    def __init__(self) -> None:
        super().__init__(timeout_s=5.0)
        self.failed: list[tuple[str, str]] = []

    def fail_waiting(self, endpoint, variant, error, began_by=None):  # type: ignore[no-untyped-def]
        self.failed.append((endpoint, variant))
        super().fail_waiting(endpoint, variant, error, began_by)


def _scaler(fleets: dict[str, Fleet]) -> tuple[ServerlessScaler, _FailingStarts, _Router, list]:
    provisioner, router, told = _FailingStarts(), _Router(), []
    scaler = ServerlessScaler(
        provisioner=provisioner,  # type: ignore[arg-type]
        router=router,
        metrics=Metrics(),
        fleets=fleets,
        publish=lambda fleet: None,
        idle_s=60.0,
        slots=1,
    )
    scaler.on_failed = lambda *failure: told.append(failure)
    return scaler, provisioner, router, told


def test_a_failed_cold_start_fails_the_waiting_requests_and_tells_the_others() -> None:
    async def main() -> None:
        fleet = _fleet()
        scaler, provisioner, router, told = _scaler({"e": fleet})
        scaler.demand(fleet, "v1", 2)
        assert fleet.starting == {"v1": 2}
        provisioner.fail.set()
        await _until(lambda: told)
        await scaler.stop()
        assert fleet.starting == {"v1": 0}
        # Once, when the last start failed with none of the variant's instances left.
        assert router.failed == [("e", "v1")]
        assert told == [("e", "v1", "the weights are gone")]

    asyncio.run(main())


def test_a_replaced_fleets_failed_cold_start_fails_nothing() -> None:
    async def main() -> None:
        fleets = {"e": _fleet()}
        old = fleets["e"]
        scaler, provisioner, router, told = _scaler(fleets)
        scaler.demand(old, "v1", 1)
        fleets["e"] = _fleet()  # UpdateEndpoint: the new fleet's requests wait on
        provisioner.fail.set()
        await _until(lambda: old.starting == {"v1": 0})
        await scaler.stop()
        assert router.failed == []
        assert told == []

    asyncio.run(main())
