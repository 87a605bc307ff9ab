"""The events log and the healthy counts tell the truth about inference components and
jobs too, on real gateways with no notification topic: a component's status changes
(Creating, InService, Deleting) and a training or transform job's are events, each row
naming its resource; and the console of a gateway that does not hold a component
endpoint's fleet shows the healthy instances the holder does."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import GatewayProcess, unique, wait_until
from tests.e2e.processes import instance_pids
from tests.e2e.test_gateways import two_gateways  # noqa: F401 (a fixture)
from tests.e2e.test_inference_components import (
    component_endpoint,
    create_component,
    wait_component,
)
from tests.e2e.test_jobs import ENV as JOBS_ENV
from tests.e2e.test_jobs import job_request, wait_final
from tests.e2e.test_transform import create_model, transform, wait_done, write_csv
from tests.e2e.test_truthful_events import ROLE, event_rows


def test_a_components_status_changes_are_events_with_no_topic(
    gateway: GatewayProcess, model_tarball: Callable[[str], str]
) -> None:
    sm = gateway.sm
    sm.create_model(
        ModelName="told-model",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("echo")},
        ExecutionRoleArn=ROLE,
    )
    component_endpoint(sm, "told-ics", count=1)
    name = unique("told-ic")
    create_component(sm, name, "told-ics", copies=1, cpus=0.5, memory_mb=512, model="told-model")
    wait_component(sm, name)

    def said() -> list[str]:
        rows = (" ".join(r.split()) for r in event_rows(gateway))
        return [r for r in rows if f"Inference component {name} " in r]

    wait_until(lambda: any("is InService" in r for r in said()), "the InService event")
    rows = said()
    statuses = [s for r in rows for s in re.findall(r" is (\w+)\.", r)]
    assert statuses == ["InService", "Creating"], rows  # newest first
    for row in rows:
        assert "SageMaker Inference Component State Change" in row, row
        assert f"{name} on told-ics" in row, row  # the resource cell: component, endpoint
    status, body = gateway.get("/console/api/events")
    assert status == 200 and b'href="/console/endpoints/told-ics"' in body

    sm.delete_inference_component(InferenceComponentName=name)
    # Events outlive their resource: the Deleting row stays once the component is gone.
    wait_until(lambda: any("is Deleting" in r for r in said()), "the Deleting event")
    wait_until(lambda: not sm.list_inference_components(NameContains=name)[
        "InferenceComponents"], "the component gone")  # fmt: skip
    statuses = [s for r in said() for s in re.findall(r" is (\w+)\.", r)]
    assert statuses == ["Deleting", "InService", "Creating"], said()


def test_training_and_transform_jobs_status_changes_are_events_with_no_topic(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env=JOBS_ENV)
    job, data = unique("told-job"), tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("1 2 3")
    gw.sm.create_training_job(**job_request(job, tmp_path / "out", data, mode="ok"))
    ended = wait_final(gw.sm, job)
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")

    create_model(gw, "told-lines", "lines", tmp_path)
    write_csv(tmp_path / "in", "a.csv", [[1, 2], [3, 4]])
    batch = unique("told-tf")
    transform(gw, batch, "told-lines", (tmp_path / "in").as_uri(), tmp_path / "tf-out")
    assert wait_done(gw, batch)["TransformJobStatus"] == "Completed"

    def about(name: str) -> list[str]:
        return [r for r in event_rows(gw) if name in r]

    wait_until(lambda: any("Status: Completed" in r for r in about(job)), "the job's end")
    wait_until(lambda: any("Status: Completed" in r for r in about(batch)), "the batch's end")
    for name, kind in ((job, "Training"), (batch, "Transform")):
        rows = about(name)
        assert any("Status: InProgress" in r for r in rows), rows
        assert "Status: Completed" in rows[0], rows  # newest first
        assert all(f"SageMaker {kind} Job State Change" in r for r in rows), rows
        assert all("no topics" in r for r in rows), rows


def test_the_gateway_without_the_fleet_shows_the_holders_healthy_counts(
    two_gateways: tuple[GatewayProcess, GatewayProcess],  # noqa: F811
    model_tarball: Callable[[str], str],
) -> None:
    a, b = two_gateways
    a.sm.create_model(
        ModelName="held-model",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_tarball("echo")},
        ExecutionRoleArn=ROLE,
    )
    component_endpoint(a.sm, "held", count=1)
    create_component(a.sm, "two", "held", copies=2, cpus=0.5, memory_mb=512, model="held-model")
    wait_component(a.sm, "two")
    wait_until(lambda: instance_pids(a.process.pid) or instance_pids(b.process.pid), "copies")
    holder, other = (a, b) if instance_pids(a.process.pid) else (b, a)

    def counts(gw: GatewayProcess) -> tuple[str, str, str]:
        """DescribeEndpoint's, the console's (its list and the endpoint's page) and the
        component's copies on that page."""
        described = gw.sm.describe_endpoint(EndpointName="held")["ProductionVariants"][0]
        _, listing = gw.get("/console/api/endpoints")
        _, page = gw.get("/console/api/endpoints/held")
        instances = re.search(r'data-label="Instances">([^<]*)<', page.decode())
        copies = re.search(
            r'data-label="Instances">([^<]*) <span class="muted">copies', page.decode()
        )
        row = re.search(r'<span class="counts">([^<]*)</span>', listing.decode())
        shown = [m.group(1) if m else "" for m in (row, instances, copies)]
        return (
            f"{described['CurrentInstanceCount']}/{described['DesiredInstanceCount']}",
            f"{shown[0]} {shown[1]}",
            shown[2],
        )

    wait_until(lambda: counts(holder) == ("1/1", "1/1 1/1", "2/2"), "the holder's counts")
    # The other gateway learns the holder's routes within its refresh period.
    seen: list[tuple[str, str, str]] = []

    def agree() -> bool:
        seen.append(counts(other))
        return seen[-1] == counts(holder)

    try:
        wait_until(agree, "the other gateway's counts equal to the holder's", timeout_s=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: the other showed {seen[-1]}") from None
    assert seen[-1] == ("1/1", "1/1 1/1", "2/2"), seen
    for gw in (holder, other):  # the CLI, pointed at either
        assert cli_variant_row(gw, "held")[-3:] == ["1/1", "1", "0"]  # healthy, unhealthy


def cli_variant_row(gw: GatewayProcess, endpoint: str) -> list[str]:
    """The cells of the AllTraffic row of ``shipyard endpoints describe``."""
    env = {"SHIPYARD_URL": gw.url, "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "COLUMNS": "200"}  # fmt: skip
    described = subprocess.run(
        [sys.executable, "-m", "shipyard", "endpoints", "describe", endpoint],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    row = next(line for line in described.stdout.splitlines() if "AllTraffic" in line)
    return [c.strip() for c in re.split(r"[│|]", row) if c.strip()]
