"""Batch transform with input that is bad by the caller's fault: a manifest
that is missing, not JSON or not of SageMaker's shape, names nothing, or names an object
that is not there. Each ends the job Failed with a ``ClientError: ...`` FailureReason
naming what is wrong, as an empty S3Prefix does, never as an internal error with a
traceback in the gateway's log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess, unique
from tests.e2e.test_transform import create_model, transform, wait_done, write_csv


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory()


def test_bad_manifests_fail_the_job_as_client_errors(gw: GatewayProcess, tmp_path: Path) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in1"
    write_csv(data, "a.csv", [[1, 2]])
    prefix = data.as_uri() + "/"
    # name -> (manifest text, or None for no manifest at all; what the reason says)
    cases: dict[str, tuple[str | None, str]] = {
        "notjson": ("not json", "not JSON"),
        "prefixstr": (json.dumps(["prefix"]), '{"prefix"'),
        "prefixlist": (json.dumps([["prefix"]]), '{"prefix"'),
        "deep": ("[" * 100_000, "not JSON"),
        "entry": (json.dumps([{"prefix": prefix}, "a.csv", {"x": 1}]), "entry 2"),
        "missing": (None, "Could not find"),
        "empty": (json.dumps([{"prefix": prefix}]), "No objects found"),
    }
    jobs = {}
    for case, (text, _) in cases.items():
        manifest = tmp_path / f"{case}.manifest"
        if text is not None:
            manifest.write_text(text)
        name = unique(f"tfbad-{case}")
        transform(gw, name, "lines", manifest.as_uri(), tmp_path / f"out-{case}",
                  data_type="ManifestFile")  # fmt: skip
        jobs[case] = (name, manifest.as_uri())
    for case, (name, uri) in jobs.items():
        job = wait_done(gw, name)
        reason = job.get("FailureReason", "")
        assert job["TransformJobStatus"] == "Failed", (case, reason)
        assert reason.startswith("ClientError: "), (case, reason)
        assert uri in reason and cases[case][1] in reason, (case, reason)
        assert not (tmp_path / f"out-{case}").exists(), case
    assert "Traceback" not in gw.log()
    assert "InternalServerError" not in gw.log()


def test_an_object_gone_before_it_is_read_fails_the_job_as_a_client_error(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    # A manifest's entry names an object no longer there: as one deleted between the
    # listing and its reading, the same NoSuchObject when the object is opened.
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in1"
    write_csv(data, "a.csv", [[1, 2]])
    gone = data / "gone.csv"
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([{"prefix": data.as_uri() + "/"}, "a.csv", "gone.csv"]))
    name = unique("tfgone")
    transform(gw, name, "lines", manifest.as_uri(), tmp_path / "out", data_type="ManifestFile")
    job = wait_done(gw, name)
    reason = job.get("FailureReason", "")
    assert job["TransformJobStatus"] == "Failed", reason
    assert reason.startswith("ClientError: ") and gone.as_uri() in reason, reason
    assert not (tmp_path / "out" / "gone.csv.out").exists()
    assert "Traceback" not in gw.log()
