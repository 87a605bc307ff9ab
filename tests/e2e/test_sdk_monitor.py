"""The sagemaker SDK v2, unchanged, end to end against a real gateway and a moto S3:
SKLearnProcessor and ScriptProcessor runs, then DefaultModelMonitor's suggest_baseline,
create_monitoring_schedule (NOW), list_executions and the latest statistics and
violations of an endpoint whose traffic has drifted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Bucket, GatewayProcess, make_tarball
from tests.e2e.test_sdk_workflow import sdk_env

SCRIPT = Path(__file__).with_name("sdk_monitor.py")
CODE = Path(__file__).with_name("sdk_monitor_code")


@pytest.mark.timeout(400)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_processors_and_default_model_monitor_with_the_sdk(
    gateway_factory: Callable[..., GatewayProcess], bucket: Bucket, tmp_path: Path
) -> None:
    gw = gateway_factory(
        extra_env={
            "SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url,
            "SHIPYARD_JOB_POLL_PERIOD_S": "0.2",
            "SHIPYARD_CAPTURE_FLUSH_INTERVAL_S": "0.2",
            "SHIPYARD_ACCOUNT_ID": "123456789012",  # what moto's STS tells the SDK
        }
    )
    env = sdk_env(gw, bucket, tmp_path)
    model = make_tarball("lines", tmp_path / "lines.tar.gz")
    argv = [sys.executable, str(SCRIPT), bucket.name, str(CODE), str(model), str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=380)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    lines = {
        line.split(" ", 1)[0]: line.split(" ", 1)[1]
        for line in (raw.lstrip(".!") for raw in out.stdout.splitlines())  # wait()'s dots
        if " " in line
    }
    assert lines["SKLEARN"] == "500"
    assert lines["SCRIPT"] == "500"
    assert "preprocessed 500 rows" in out.stdout  # run(logs=True) printed the job's log
    assert json.loads(lines["BASELINE"]) == ["label", "age", "income"]
    assert lines["EXECUTION"] == "CompletedWithViolations"
    assert lines["STATISTICS"] == "200"
    checks = {tuple(c) for c in json.loads(lines["VIOLATIONS"])}
    assert ("income", "baseline_drift_check") in checks
    assert ("age", "baseline_drift_check") not in checks
