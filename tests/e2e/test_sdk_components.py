"""The sagemaker SDK v2, unchanged, deploying a model as an inference component and
invoking it through the Predictor it returns (sdk_components.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Bucket, GatewayProcess, make_tarball
from tests.e2e.test_sdk_workflow import sdk_env

SCRIPT = Path(__file__).with_name("sdk_components.py")


@pytest.mark.timeout(200)
def test_the_sdk_deploys_and_invokes_an_inference_component(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    gw = gateway_factory(
        extra_env={
            "SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url,
            "SHIPYARD_ACCOUNT_ID": "123456789012",  # what moto's STS tells the SDK
        }
    )
    model_data = bucket.put("models/env.tar.gz", make_tarball("env_dump", tmp_path / "env.tar.gz"))
    argv = [sys.executable, str(SCRIPT), bucket.name, model_data]
    out = subprocess.run(
        argv, capture_output=True, text=True, env=sdk_env(gw, bucket, tmp_path), timeout=180
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    # The SDK's wait prints progress marks (!) on the lines the script prints on.
    said = dict(re.findall(r"([A-Z]+) (.*)$", out.stdout, re.M))
    assert said.get("COMPONENT") == "sdk-ic-component", out.stdout[-3000:]
    assert json.loads(said["ANSWER"]) == "sdk-ic-component"
    copies = json.loads(said["COPIES"])
    assert copies == {"DesiredCopyCount": 2, "CurrentCopyCount": 2}
    assert "DELETED" in out.stdout
    described = gw.sm.list_inference_components(EndpointNameEquals="sdk-ic")
    assert described["InferenceComponents"] == [] or all(
        c["InferenceComponentStatus"] == "Deleting" for c in described["InferenceComponents"]
    )
