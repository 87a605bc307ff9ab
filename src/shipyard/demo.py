"""The demo model that ``shipyard serve --demo`` (and ``make run``) deploys as ``demo``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from shipyard.control.endpoints import EndpointService
from shipyard.errors import AlreadyExists
from shipyard.records import RoutingStrategy, VariantSpec

log = logging.getLogger(__name__)

DEMO_NAME = "demo"

_INFERENCE = '''\
"""Demo model: sums each row of "instances"."""


def model_fn(model_dir):
    return sum


def predict_fn(data, model):
    rows = data["instances"] if isinstance(data, dict) else data
    return {"predictions": [model(row) for row in rows]}
'''


def write_demo_artifact(home: Path) -> Path:
    model_dir = home / "demo-model"
    code = model_dir / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "inference.py").write_text(_INFERENCE)
    return model_dir


async def deploy_demo(service: EndpointService, home: Path) -> None:
    """Create the demo model, config and endpoint unless they exist already."""
    model_dir = await asyncio.to_thread(write_demo_artifact, home)

    def create() -> None:
        steps = (
            lambda: service.create_model(
                DEMO_NAME,
                image="shipyard/python",
                model_data_url=model_dir.as_uri(),
                environment={},
                execution_role_arn=None,
                raw={
                    "ModelName": DEMO_NAME,
                    "PrimaryContainer": {
                        "Image": "shipyard/python",
                        "ModelDataUrl": model_dir.as_uri(),
                    },
                },
            ),
            lambda: service.create_endpoint_config(
                DEMO_NAME,
                [
                    VariantSpec(
                        name="AllTraffic",
                        model_name=DEMO_NAME,
                        instance_type="ml.m5.large",
                        instance_count=1,
                        weight=1.0,
                        routing_strategy=RoutingStrategy.LEAST_OUTSTANDING_REQUESTS,
                    )
                ],
                raw={
                    "EndpointConfigName": DEMO_NAME,
                    "ProductionVariants": [
                        {
                            "VariantName": "AllTraffic",
                            "ModelName": DEMO_NAME,
                            "InstanceType": "ml.m5.large",
                            "InitialInstanceCount": 1,
                            "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
                        }
                    ],
                },
            ),
            lambda: service.create_endpoint(DEMO_NAME, DEMO_NAME),
        )
        for step in steps:
            try:
                step()
            except AlreadyExists:
                pass  # already deployed by an earlier start

    await asyncio.to_thread(create)
    log.info("demo endpoint %r deployed", DEMO_NAME)
