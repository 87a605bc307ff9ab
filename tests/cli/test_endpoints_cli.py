"""``shipyard endpoints`` against a real gateway, through typer's CliRunner."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shipyard.cli import app
from tests.conftest import GatewayProcess, deploy, make_tarball, start_gateway, wait_until


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway with endpoint ``echo`` (one instance) and ``broken`` (Failed)."""
    root = tmp_path_factory.mktemp("endpoints-cli")
    gateway = start_gateway(root / "home")
    try:
        sm = gateway.sm
        deploy(sm, "echo", make_tarball("echo", root / "echo.tar.gz").as_uri())
        deploy(sm, "broken", make_tarball("load_fails", root / "bad.tar.gz").as_uri(), wait=False)
        wait_until(
            lambda: sm.describe_endpoint(EndpointName="broken")["EndpointStatus"] == "Failed",
            "endpoint broken Failed",
            timeout_s=60,
        )
        yield gateway
    finally:
        gateway.stop()


def shipyard(gw: GatewayProcess, *args: str, stdin: str | bytes | None = None) -> Any:
    return CliRunner().invoke(app, ["endpoints", *args, "--url", gw.url], input=stdin)


def test_list_shows_every_endpoint_and_its_status(gw: GatewayProcess) -> None:
    out = shipyard(gw, "list")
    assert out.exit_code == 0, out.output
    rows = {line.split()[1]: line for line in out.output.splitlines() if "│ " in line}
    assert "InService" in rows["echo"]
    assert "Failed" in rows["broken"]


def test_describe_shows_variants_instances_and_health(gw: GatewayProcess) -> None:
    out = shipyard(gw, "describe", "echo")
    assert out.exit_code == 0, out.output
    assert "InService" in out.output
    variant = next(line for line in out.output.splitlines() if line.startswith("│ v1"))
    cells = [cell.strip() for cell in variant.strip("│ ").split("│")]
    # Variant, model, instance type, weight, instances (current/desired), healthy, unhealthy
    assert cells == ["v1", "echo", "ml.m5.large", "1", "1/1", "1", "0"]


def test_describe_of_a_failed_endpoint_gives_the_reason(gw: GatewayProcess) -> None:
    out = shipyard(gw, "describe", "broken")
    assert out.exit_code == 0, out.output
    assert "Failed" in out.output
    assert "Failure reason" in out.output and "weights missing" in out.output


def test_describe_json_is_describe_endpoint(gw: GatewayProcess) -> None:
    out = shipyard(gw, "describe", "echo", "--json")
    assert out.exit_code == 0, out.output
    described = json.loads(out.output)
    assert described["EndpointName"] == "echo"
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 1


def test_invoke_takes_the_body_from_an_argument_a_file_or_stdin(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    out = shipyard(gw, "invoke", "echo", '{"from": "argument"}')
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"from": "argument"}

    body = tmp_path / "body.json"
    body.write_text('{"from": "file"}')
    out = shipyard(gw, "invoke", "echo", "--file", str(body), "--content-type", "application/json")
    assert json.loads(out.stdout) == {"from": "file"}

    out = shipyard(gw, "invoke", "echo", stdin='{"from": "stdin"}')
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"from": "stdin"}


def test_invoke_of_a_missing_endpoint_is_one_red_line_and_exit_1(gw: GatewayProcess) -> None:
    out = shipyard(gw, "invoke", "nope", "{}")
    assert out.exit_code == 1
    assert out.stderr.count("\n") == 1
    assert "nope" in out.stderr and "ValidationError" in out.stderr


def test_logs_print_each_instance_s_lines_with_its_id(gw: GatewayProcess) -> None:
    gw.rt.invoke_endpoint(EndpointName="echo", Body=b"{}", ContentType="application/json")
    out = shipyard(gw, "logs", "echo")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines and all(line.startswith("[echo-v1-") for line in lines)
    assert any("serving" in line for line in lines)
    instance = lines[0][1 : lines[0].index("]")]
    only = shipyard(gw, "logs", "echo", "--instance", instance)
    assert only.stdout.splitlines() == [
        line.split("] ", 1)[1] for line in lines if line.startswith(f"[{instance}]")
    ]


def test_shipyard_logs_reads_an_endpoint_when_no_job_has_the_name(gw: GatewayProcess) -> None:
    out = CliRunner().invoke(app, ["logs", "echo", "--url", gw.url])
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("[echo-v1-")
    out = CliRunner().invoke(app, ["logs", "nope", "--url", gw.url])
    assert out.exit_code == 1
    assert "Could not find job nope" in out.stderr


def test_delete_removes_the_endpoint(gw: GatewayProcess, tmp_path: Path) -> None:
    deploy(gw.sm, "doomed", make_tarball("echo", tmp_path / "m.tar.gz").as_uri())
    out = shipyard(gw, "delete", "doomed", "--yes")
    assert out.exit_code == 0, out.output
    wait_until(
        lambda: "doomed" not in shipyard(gw, "list").stdout, "endpoint doomed gone", timeout_s=30
    )
    out = shipyard(gw, "delete", "doomed", "--yes")
    assert out.exit_code == 1 and "doomed" in out.stderr


def test_an_unreachable_gateway_is_one_red_line(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["endpoints", "list", "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 1
    assert "cannot reach the gateway at http://127.0.0.1:9" in out.stderr
