"""An update replaces an endpoint's fleet while a health-check pass may still hold the
old one (the pass takes the fleets when it starts, and pings one instance at a time).
That pass must neither route the endpoint back to the old fleet nor start its stopped
instances again: calls after InService would get ModelNotReady from a table with no
instance, and the old model would run again, out of every fleet.

The gateway runs in this process (its lifespan, not a server) so that the pass can be
run at the moment it would race: after the update, on the fleet it replaced.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from shipyard.app import create_app
from shipyard.demo import DEMO_NAME, deploy_demo
from shipyard.gateway.api.actions import endpoint_configs
from shipyard.records import EndpointStatus
from shipyard.settings import Settings
from tests.conftest import wait_until_async


async def _update_then_supervise_the_old_fleet(home: Path) -> None:
    # Health checks are left to the test: the loop's own passes would come hours apart.
    gateway = create_app(Settings(home=home, health_check_period_s=3600))
    try:
        async with gateway.app.router.lifespan_context(gateway.app):
            await deploy_demo(gateway.service, home)
            reconciler, store = gateway.reconciler, gateway.store

            def status() -> EndpointStatus:
                return store.get_endpoint(DEMO_NAME).status

            await wait_until_async(
                lambda: status() == EndpointStatus.IN_SERVICE, "the endpoint", timeout_s=60
            )
            old = reconciler.fleets[DEMO_NAME]
            endpoint_configs.create_endpoint_config(
                gateway.service,
                {
                    "EndpointConfigName": "demo-next",
                    "ProductionVariants": [
                        {
                            "VariantName": "AllTraffic",
                            "ModelName": DEMO_NAME,
                            "InstanceType": "ml.m5.large",
                            "InitialInstanceCount": 1,
                        }
                    ],
                },
            )
            gateway.service.update_endpoint(DEMO_NAME, "demo-next")
            await wait_until_async(
                lambda: (
                    status() == EndpointStatus.IN_SERVICE
                    and all(slot.handle is None for slot in old.all_slots())
                ),
                "the update, its old fleet drained and stopped",
                timeout_s=60,
            )
            new = reconciler.fleets[DEMO_NAME]
            assert new is not old

            await reconciler.supervisor.supervise(old)  # a pass that began before the swap

            route = gateway.router.routes[DEMO_NAME]
            routed = [instance for variant in route.variants for instance in variant.instances]
            assert routed and routed == [slot.instance for slot in new.all_slots()]
            assert all(slot.handle is None for slot in old.all_slots())  # not started again
    finally:
        gateway.store.close()


def test_a_health_check_pass_never_brings_back_a_fleet_an_update_replaced(
    tmp_path: Path,
) -> None:
    asyncio.run(_update_then_supervise_the_old_fleet(tmp_path / "home"))
