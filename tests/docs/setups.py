"""What a page's ``<!-- snippet: setup NAME -->`` says its reader already has.

Each is what an earlier page leaves behind, made as that page makes it, so that a guide's
block can start where the reader is (its text says so: "`sm` and `rt` are the clients of
the quickstart"). A setup changes the page's folder, its namespace or its gateway.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3

from tests.conftest import GatewayProcess, wait_in_service

# The quickstart's model (README.md, docs/getting-started/boto3.md): the largest of each row.
INFERENCE = (
    "def model_fn(model_dir):\n    return max\n\n"
    "def predict_fn(rows, model):\n    return [model(row) for row in rows]\n"
)


def my_model(gw: GatewayProcess, folder: Path, namespace: dict[str, Any]) -> None:
    """The folder ``my-model`` the quickstart writes, in the page's folder."""
    (folder / "my-model" / "code").mkdir(parents=True, exist_ok=True)
    (folder / "my-model" / "code" / "inference.py").write_text(INFERENCE)


def clients(gw: GatewayProcess, folder: Path, namespace: dict[str, Any]) -> None:
    """``sm`` and ``rt``, the quickstart's boto3 clients, and its ``kw``."""
    kw = dict(
        endpoint_url=gw.url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    namespace.update(
        kw=kw, sm=boto3.client("sagemaker", **kw), rt=boto3.client("sagemaker-runtime", **kw)
    )


def scores(gw: GatewayProcess, folder: Path, namespace: dict[str, Any]) -> None:
    """The model and endpoint ``scores`` (variant ``v1``, one instance) serving
    ``my-model``, as the stack file of docs/getting-started/cli.md declares them."""
    my_model(gw, folder, namespace)
    url = (folder / "my-model").as_uri()
    gw.sm.create_model(
        ModelName="scores", PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url}
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName="scores-v1",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "scores",
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
    )
    gw.sm.create_endpoint(EndpointName="scores", EndpointConfigName="scores-v1")
    wait_in_service(gw.sm, "scores")


def scores_v2(gw: GatewayProcess, folder: Path, namespace: dict[str, Any]) -> None:
    """A new version of ``scores``: the model ``scores-v2`` and the endpoint config
    ``scores-v2`` (variant ``v1``) serving it."""
    my_model(gw, folder, namespace)
    url = (folder / "my-model").as_uri()
    gw.sm.create_model(
        ModelName="scores-v2", PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url}
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName="scores-v2",
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": "scores-v2",
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
    )


def scores_errors(gw: GatewayProcess, folder: Path, namespace: dict[str, Any]) -> None:
    """The alarm ``scores-errors`` of docs/guides/cloudwatch.md."""
    where = [{"Name": "EndpointName", "Value": "scores"}, {"Name": "VariantName", "Value": "v1"}]
    gw.client("cloudwatch").put_metric_alarm(
        AlarmName="scores-errors",
        Namespace="AWS/SageMaker",
        MetricName="Invocation5XXErrors",
        Dimensions=where,
        Statistic="Sum",
        Period=60,
        EvaluationPeriods=2,
        DatapointsToAlarm=1,
        Threshold=5,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="notBreaching",
    )


def examples(gw: GatewayProcess, folder: Path, namespace: dict[str, Any]) -> None:
    """The repository's ``examples/`` folder, as a reader at its root has it: copied into
    the page's folder, so that what a block builds there stays out of the checkout."""
    shutil.copytree(
        REPOSITORY / "examples",
        folder / "examples",
        ignore=shutil.ignore_patterns("model", "*.tar.gz", "__pycache__"),
    )


REPOSITORY = Path(__file__).resolve().parents[2]

SETUPS: dict[str, Callable[[GatewayProcess, Path, dict[str, Any]], None]] = {
    "examples": examples,
    "my-model": my_model,
    "clients": clients,
    "scores": scores,
    "scores-v2": scores_v2,
    "scores-errors": scores_errors,
}
