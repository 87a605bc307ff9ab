"""Warm spares: a serverless cold start takes a runtime process started ahead, with the
imports of earlier instances done, and it becomes the instance as a fresh one would."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from shipyard import autogroup
from tests.conftest import GatewayProcess, needs_autogroups, unique, wait_in_service, wait_until
from tests.e2e.processes import listening
from tests.e2e.test_serverless import gone, instances, serverless_variant
from tests.e2e.test_transform import create_model, transform, wait_done


def spares(gw: GatewayProcess) -> list[psutil.Process]:
    """The gateway's spare runtime processes that wait for work."""
    found = []
    for child in psutil.Process(gw.process.pid).children(recursive=True):
        try:
            if "--spare" in child.cmdline() and not listening(child.pid):
                found.append(child)  # not serving yet: still waiting for work
        except psutil.Error:
            continue
    return found


def one_spare(gw: GatewayProcess) -> psutil.Process:
    found: list[psutil.Process] = []

    def check() -> bool:
        found[:] = spares(gw)
        return len(found) == 1

    wait_until(check, "one spare waiting")
    return found[0]


def serverless_endpoint(gw: GatewayProcess, prefix: str, model_url: str) -> str:
    """A serverless endpoint of the model at ``model_url``, in service; its name."""
    name = unique(prefix)
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model_url},
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName=name, ProductionVariants=serverless_variant(name)
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gw.sm, name)
    return name


def group_nice(line: str) -> int:
    """The nice value in a ``/proc/PID/autogroup`` line (``/autogroup-7 nice 19``)."""
    name, word, nice = line.split()
    assert word == "nice", line
    return int(nice)


def cold_invoke(gw: GatewayProcess, name: str) -> dict[str, Any]:
    wait_until(lambda: instances(gw, name) == 0, "no instance")
    answer = gw.rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json")
    result: dict[str, Any] = json.loads(answer["Body"].read())
    return result


def test_a_cold_start_takes_a_spare_that_preloaded_what_the_model_imports(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(
        extra_env={"SHIPYARD_SERVERLESS_IDLE_S": "0.5", "SHIPYARD_WARM_SPARES": "1"}
    )
    name = unique("warm")
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": model_tarball("preloaded"),
            "Environment": {"GREETING": "hello"},
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName=name, ProductionVariants=serverless_variant(name)
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(gw.sm, name)

    # CreateEndpoint's trial start taught the spares what to import; a cold start takes a
    # spare and another is started after it.
    first = cold_invoke(gw, name)
    assert first["greeting"] == "hello"
    spare = one_spare(gw)

    # The spare started after an instance had imported the library: it preloaded it, and
    # the next cold start is that very process, with the instance's environment, folder
    # and log.
    warm = cold_invoke(gw, name)
    assert warm["pid"] == spare.pid
    assert warm["preloaded"] is True
    assert warm["greeting"] == "hello"
    home = gw.home / "run" / "home"
    assert warm["cwd"].startswith(str(home)) and not warm["cwd"].startswith(str(home / "_spare"))
    logs = (gw.home / "logs" / name).glob("*.log")
    assert any(f"preloaded model loading in {spare.pid}" in p.read_text() for p in logs)

    # A new spare replaces the one taken; stopping the gateway stops it too.
    waiting = one_spare(gw)
    assert waiting.pid != spare.pid
    gw.stop()
    wait_until(lambda: gone(waiting.pid) and gone(warm["pid"]), "spare and instance ended")


@needs_autogroups
def test_a_waiting_spare_runs_at_the_lowest_priority_and_its_instance_at_the_usual_one(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(
        extra_env={"SHIPYARD_SERVERLESS_IDLE_S": "0.5", "SHIPYARD_WARM_SPARES": "1"}
    )
    name = serverless_endpoint(gw, "share", model_tarball("preloaded"))

    # A spare waits in a scheduling group of its own at the lowest priority
    # (runtime/spare.py), apart from the gateway's.
    cold_invoke(gw, name)
    spare = one_spare(gw)
    wait_until(lambda: autogroup.nice(spare.pid) == 19, "the spare's group at nice 19")
    waiting = Path(f"/proc/{spare.pid}/autogroup").read_text()
    assert waiting.split()[0] != Path(f"/proc/{gw.process.pid}/autogroup").read_text().split()[0]

    # The instance it becomes serves at the usual priority, in that same group.
    warm = cold_invoke(gw, name)
    assert warm["pid"] == spare.pid and warm["preloaded"] is True
    assert warm["autogroup"].split()[0] == waiting.split()[0]
    assert group_nice(warm["autogroup"]) == 0


def test_no_spares_when_turned_off(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory(
        extra_env={"SHIPYARD_SERVERLESS_IDLE_S": "0.5", "SHIPYARD_WARM_SPARES": "0"}
    )
    name = serverless_endpoint(gw, "cold", model_tarball("preloaded"))
    for _ in range(2):
        assert cold_invoke(gw, name)["preloaded"] is False
    assert spares(gw) == []


def test_a_transform_job_starts_on_a_spare_unless_it_sets_an_import_time_variable(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    gw = gateway_factory(extra_env={"SHIPYARD_WARM_SPARES": "1"})
    create_model(gw, "preloaded", "preloaded", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    (data / "one.json").write_text("{}")

    def answer(**environment: str) -> dict[str, Any]:
        job = unique("tf")
        out = tmp_path / job
        whole = {"SplitType": "None", "ContentType": "application/json"}
        transform(gw, job, "preloaded", data.as_uri(), out, Environment=environment,
                  TransformInput=whole)  # fmt: skip
        described = wait_done(gw, job)
        assert described["TransformJobStatus"] == "Completed", described.get("FailureReason")
        result: dict[str, Any] = json.loads((out / "one.json.out").read_text())
        return result

    # The first job finds no spare (none was needed yet), and a spare starts while its
    # instance loads the model; the instance then records what it imported, the waiting
    # spare imports it too, and the next job's instance is that very process, with the
    # job's own variables.
    assert answer(LOAD_S="2")["preloaded"] is False
    spare = one_spare(gw)
    warm = answer(GREETING="hi")
    assert warm["pid"] == spare.pid and warm["preloaded"] is True
    assert warm["greeting"] == "hi"
    # The job's instances are stopped after its end is recorded; until that one has
    # exited it still looks like a spare (its command line, no TCP port).
    spare.wait(timeout=30)

    # A variable libraries read when imported cannot be taken on: that job starts fresh
    # and the spare keeps waiting.
    waiting = one_spare(gw)
    own = answer(OMP_NUM_THREADS="1", GREETING="hello")
    assert own["pid"] != waiting.pid and own["preloaded"] is False
    assert own["greeting"] == "hello"
    assert [p.pid for p in spares(gw)] == [waiting.pid]
