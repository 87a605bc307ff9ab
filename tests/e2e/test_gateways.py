"""Several gateways on one store: one fleet per endpoint, and every gateway routes to it.

Gateways are real ``shipyard serve`` processes on one PostgreSQL schema (skipped where
PostgreSQL is absent); instances are counted as processes, by the gateways' PIDs.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, PgSchema, deploy, unique, wait_in_service, wait_until
from tests.e2e.processes import alive, instance_pids
from tests.e2e.test_inference_components import component_endpoint, wait_component
from tests.e2e.test_jobs import ENV as JOBS_ENV
from tests.e2e.test_jobs import job_request, wait_final

# The default lease: a shorter one is given up by a holder starved of CPU on a busy host.
LEASES = {"SHIPYARD_LEASE_RENEW_S": "0.5"}


def _pids(gw: GatewayProcess, name: str, n: int = 12) -> set[int]:
    """The instance PIDs that answer ``name``'s invocations through ``gw``."""
    rt = gw.client("sagemaker-runtime")
    out = set()
    for _ in range(n):
        body = rt.invoke_endpoint(EndpointName=name, Body=b"{}")["Body"].read()
        out.add(json.loads(body)["pid"])
    return out


def _answers(gw: GatewayProcess, name: str) -> bool:
    try:
        _pids(gw, name, n=1)
        return True
    except Exception:
        return False


def _fleet(*gateways: GatewayProcess) -> list[int]:
    return [
        pid for gw in gateways if gw.process.poll() is None for pid in instance_pids(gw.process.pid)
    ]


@pytest.fixture
def two_gateways(
    gateway_factory: Callable[..., GatewayProcess], pg_schema: PgSchema, tmp_path: Path
) -> tuple[GatewayProcess, GatewayProcess]:
    """Two gateways started at once on a new schema: they migrate it in turn."""
    return _start_two(gateway_factory, pg_schema, tmp_path, LEASES)


def _start_two(
    gateway_factory: Callable[..., GatewayProcess],
    pg_schema: PgSchema,
    tmp_path: Path,
    env: dict[str, str],
) -> tuple[GatewayProcess, GatewayProcess]:
    args = ["--db", pg_schema.url]
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(
            lambda home: gateway_factory(home, args=args, extra_env=env),
            (tmp_path / "a", tmp_path / "b"),
        )
    return first, second


def test_two_gateways_on_one_database_run_one_fleet_and_both_route_to_it(
    two_gateways: tuple[GatewayProcess, GatewayProcess], model_tarball: Any
) -> None:
    a, b = two_gateways
    deploy(b.sm, "shared", model_tarball("sleepy"), count=2)
    for gw in (a, b):  # at once: a gateway yet to read the routes holds the request
        rt = gw.client("sagemaker-runtime", max_attempts=1)
        rt.invoke_endpoint(EndpointName="shared", Body=b"{}")["Body"].read()
    wait_until(lambda: len(_fleet(a, b)) == 2, "two instances in all", timeout_s=60)
    wait_until(lambda: _answers(a, "shared") and _answers(b, "shared"), "both answer", 60)
    fleet = set(_fleet(a, b))
    assert _pids(a, "shared") <= fleet
    assert _pids(b, "shared") <= fleet
    assert sorted(_fleet(a, b)) == sorted(fleet), "a second fleet was started"
    described = a.sm.describe_endpoint(EndpointName="shared")
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 2


def test_killing_the_holder_under_load_passes_the_fleet_to_the_other_gateway(
    two_gateways: tuple[GatewayProcess, GatewayProcess], model_tarball: Any
) -> None:
    """Clients load both gateways; the one running the fleet is SIGKILLed (its
    instances die with it). The other takes the lease once it expires and starts the
    fleet again; its own clients see no failure meanwhile (requests wait for the new
    fleet; a request cut on a dying instance is answered 503, which boto3 retries)."""
    a, b = two_gateways
    deploy(a.sm, "takeover", model_tarball("sleepy"), count=1)
    wait_until(lambda: _answers(a, "takeover") and _answers(b, "takeover"), "both answer", 60)
    holder, survivor = (a, b) if instance_pids(a.process.pid) else (b, a)
    old_fleet = _fleet(a, b)
    assert len(old_fleet) == 1
    stop = threading.Event()
    outcomes: dict[str, list[bool]] = {"holder": [], "survivor": []}

    def load(gw: GatewayProcess, key: str) -> None:
        rt = gw.client("sagemaker-runtime", read_timeout=90)
        while not stop.is_set():
            try:
                rt.invoke_endpoint(EndpointName="takeover", Body=b'{"sleep": 0.02}')
                outcomes[key].append(True)
            except Exception:
                outcomes[key].append(False)
                if gw is holder:
                    return  # the gateway is gone: nothing more to send it

    threads = [
        threading.Thread(target=load, args=(gw, key))
        for gw, key in ((holder, "holder"), (survivor, "survivor"), (survivor, "survivor"))
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(outcomes["survivor"]) >= 10, "load on the survivor", 30)
        holder.process.send_signal(signal.SIGKILL)
        holder.process.wait(10)
        wait_until(
            lambda: len(instance_pids(survivor.process.pid)) == 1,
            "the survivor runs the fleet",
            timeout_s=60,
        )
        served = len(outcomes["survivor"])
        wait_until(lambda: len(outcomes["survivor"]) >= served + 10, "served after", 60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert all(outcomes["survivor"]), outcomes["survivor"].count(False)
    wait_until(lambda: not any(alive(p) for p in old_fleet), "the old fleet is gone", 10)
    assert len(_fleet(survivor)) == 1
    assert _pids(survivor, "takeover") == set(instance_pids(survivor.process.pid))


def test_a_gateway_alone_takes_its_leases_back_at_once_after_it_was_killed(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Any
) -> None:
    """On SQLite one gateway holds every lease. Killed and started again on its home it is
    the same holder, so it takes its leases back at once rather than after they expire
    (here longer than the test may take)."""
    gw = gateway_factory(extra_env={"SHIPYARD_LEASE_S": "600"})
    deploy(gw.sm, "alone", model_tarball("sleepy"))
    gw.stop(signal.SIGKILL)
    again = gateway_factory(home=gw.home, extra_env={"SHIPYARD_LEASE_S": "600"})
    wait_until(lambda: len(instance_pids(again.process.pid)) == 1, "its fleet back", 60)
    wait_until(lambda: _answers(again, "alone"), "it answers", 30)
    again.stop()
    third = gateway_factory(home=gw.home, extra_env={"SHIPYARD_LEASE_S": "600"})
    wait_until(lambda: _answers(third, "alone"), "it answers after a clean stop", 60)
    assert _pids(third, "alone") == set(instance_pids(third.process.pid))


def test_each_training_job_is_run_by_one_of_two_gateways(
    gateway_factory: Callable[..., GatewayProcess],
    pg_schema: PgSchema,
    tmp_path: Path,
) -> None:
    """Both gateways watch the store's jobs; each job's runner is started once, by the
    gateway holding its lease, and its changes are recorded once."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "a.txt").write_text("1 2 3")
    env = {**LEASES, **JOBS_ENV}
    a = gateway_factory(tmp_path / "a", args=["--db", pg_schema.url], extra_env=env)
    b = gateway_factory(tmp_path / "b", args=["--db", pg_schema.url], extra_env=env)
    names = [unique("twice") for _ in range(3)]
    for i, name in enumerate(names):
        gw = (a, b)[i % 2]
        gw.sm.create_training_job(**job_request(name, tmp_path / "out", data_dir, mode="ok"))
    for name in names:
        job = wait_final(a.sm, name)
        assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
        steps = [t["Status"] for t in job["SecondaryStatusTransitions"]]
        assert steps == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
        runs = [gw.home for gw in (a, b) if (gw.home / "jobs" / name / "attempt-1").exists()]
        assert len(runs) == 1, f"{name} ran on {runs}"


def test_a_holder_paused_past_its_lease_gives_its_fleet_up_when_it_wakes(
    two_gateways: tuple[GatewayProcess, GatewayProcess], model_tarball: Any
) -> None:
    """SIGSTOP freezes the holder: its instances run on, but it renews nothing, so the
    other gateway takes the lease and starts a fleet of its own. Woken, the old holder
    finds the lease gone and stops its fleet: one fleet again, run by the new holder."""
    a, b = two_gateways
    deploy(a.sm, "paused", model_tarball("sleepy"), count=1)
    wait_until(lambda: len(_fleet(a, b)) == 1, "one instance", 60)
    holder, other = (a, b) if instance_pids(a.process.pid) else (b, a)
    old = instance_pids(holder.process.pid)
    holder.process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: instance_pids(other.process.pid), "the other's fleet", 60)
    finally:
        holder.process.send_signal(signal.SIGCONT)
    wait_until(lambda: not any(alive(p) for p in old), "the old fleet stopped", 30)
    assert len(_fleet(a, b)) == 1
    assert _pids(holder, "paused") == set(instance_pids(other.process.pid))


def test_both_gateways_route_to_inference_components_and_their_adapters(
    two_gateways: tuple[GatewayProcess, GatewayProcess],
    model_tarball: Any,
    tmp_path: Path,
) -> None:
    a, b = two_gateways
    component_endpoint(a.sm, "ics", count=1)
    a.sm.create_inference_component(
        InferenceComponentName="base",
        EndpointName="ics",
        Specification={
            "Container": {"Image": "shipyard/python", "ArtifactUrl": model_tarball("lora")},
            "ComputeResourceRequirements": {
                "NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 512,
            },
        },
        RuntimeConfig={"CopyCount": 1},
    )  # fmt: skip
    wait_component(a.sm, "base")
    (tmp_path / "x5").mkdir()
    (tmp_path / "x5" / "adapter.json").write_text('{"scale": 5}')
    a.sm.create_inference_component(
        InferenceComponentName="x5",
        EndpointName="ics",
        Specification={
            "BaseInferenceComponentName": "base",
            "Container": {"ArtifactUrl": (tmp_path / "x5").as_uri()},
        },
    )
    wait_component(a.sm, "x5")

    def ask(gw: GatewayProcess, component: str) -> float:
        rt = gw.client("sagemaker-runtime")
        out = rt.invoke_endpoint(EndpointName="ics", InferenceComponentName=component,
                                 Body=b"[1, 2]", ContentType="application/json")  # fmt: skip
        return float(json.loads(out["Body"].read())["sum"])

    def both_answer() -> bool:
        try:
            return [ask(gw, c) for gw in (a, b) for c in ("base", "x5")] == [3, 15, 3, 15]
        except Exception:
            return False

    wait_until(both_answer, "both gateways serve the component and its adapter", 60)
    # At zero copies, a request through either gateway brings a copy back.
    a.sm.update_inference_component_runtime_config(
        InferenceComponentName="base", DesiredRuntimeConfig={"CopyCount": 0}
    )
    wait_until(lambda: not _fleet(a, b), "no copy left", timeout_s=60)
    for gw in (a, b):
        assert ask(gw, "x5") == 15.0


def test_a_request_through_the_other_gateway_while_the_last_copy_drains_brings_one_back(
    two_gateways: tuple[GatewayProcess, GatewayProcess], model_tarball: Any, tmp_path: Path
) -> None:
    """Scaled to zero, the last copy leaves routing at once and drains its request; the
    component stays Updating until the copy is stopped, and then nothing changes in the
    routes the other gateway reads. A request through that gateway in the window asks
    for a copy as one at rest at zero does (before, it waited out its timeout)."""
    a, b = two_gateways
    started = tmp_path / "started"
    component_endpoint(a.sm, "drains", count=1)
    a.sm.create_inference_component(
        InferenceComponentName="slow",
        EndpointName="drains",
        Specification={
            "Container": {
                "Image": "shipyard/python",
                "ArtifactUrl": model_tarball("sleepy"),
                "Environment": {"SLEEPY_STARTED_FILE": str(started)},
            },
            "ComputeResourceRequirements": {
                "NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 512,
            },
        },
        RuntimeConfig={"CopyCount": 1},
    )  # fmt: skip
    wait_component(a.sm, "slow")
    wait_until(lambda: len(_fleet(a, b)) == 1, "one copy", timeout_s=60)
    holder, other = (a, b) if instance_pids(a.process.pid) else (b, a)

    def ask(gw: GatewayProcess, sleep: float) -> int:
        rt = gw.client("sagemaker-runtime")  # retrying what boto3 retries, as users do
        out = rt.invoke_endpoint(EndpointName="drains", InferenceComponentName="slow",
                                 Body=json.dumps({"sleep": sleep}).encode(),
                                 ContentType="application/json")  # fmt: skip
        pid: int = json.loads(out["Body"].read())["pid"]
        return pid

    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(ask, holder, 10)
        wait_until(started.exists, "the long request under way", timeout_s=30)
        holder.sm.update_inference_component_runtime_config(
            InferenceComponentName="slow", DesiredRuntimeConfig={"CopyCount": 0}
        )
        seen: dict[str, Any] = {}

        def out_of_routing() -> bool:  # as the other gateway sees it
            seen.update(other.sm.describe_inference_component(InferenceComponentName="slow"))
            return bool(seen["RuntimeConfig"]["CurrentCopyCount"] == 0)

        wait_until(out_of_routing, "the copy out of the other's routes", timeout_s=30)
        assert seen["InferenceComponentStatus"] == "Updating", "still draining"
        assert not long.done()
        fresh = ask(other, 0)
        assert fresh != long.result(timeout=30), "answered by a copy started for it"


def test_a_serverless_endpoint_serves_through_the_gateway_that_does_not_run_it(
    gateway_factory: Callable[..., GatewayProcess],
    pg_schema: PgSchema,
    tmp_path: Path,
    model_tarball: Any,
) -> None:
    """Only the holder starts and stops a serverless variant's instances. At rest, a
    request through the other gateway is held for a cold start, as one through the
    holder is (it once waited out its timeout); and an instance busy with the other's
    request is not stopped as idle under it (the holder saw no request of its own)."""
    from tests.e2e.test_serverless import create_serverless, invoke

    env = {**LEASES, "SHIPYARD_SERVERLESS_IDLE_S": "3"}
    a, b = _start_two(gateway_factory, pg_schema, tmp_path, env)
    name = unique("sls")
    create_serverless(a, name, model_tarball("sleepy"))
    for gw in (a, b):  # one of them holds the endpoint
        wait_until(lambda: not _fleet(a, b), "no instance while idle", timeout_s=60)
        rt = gw.client("sagemaker-runtime", max_attempts=1)
        # A cold start, then longer than the idle time on it: the next request finds it.
        first = invoke(rt, name, {"sleep": 6})
        assert first["slept"] == 6
        assert invoke(rt, name, {"sleep": 0})["pid"] == first["pid"], "stopped as idle"


def test_a_serverless_cold_start_that_fails_fails_the_requests_of_both_gateways(
    gateway_factory: Callable[..., GatewayProcess],
    pg_schema: PgSchema,
    tmp_path: Path,
    model_tarball: Any,
) -> None:
    """A cold start that fails fails the requests waiting for it, through the holder as
    through the other gateway, with the model's reason; before, one through the other
    waited out its 60 s timeout. Once the model starts again, both serve."""
    from tests.e2e.test_serverless import serverless_variant

    env = {**LEASES, "SHIPYARD_SERVERLESS_IDLE_S": "1"}
    a, b = _start_two(gateway_factory, pg_schema, tmp_path, env)
    name, broken = unique("slsbreaks"), tmp_path / "broken"
    a.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": model_tarball("sleepy"),
            "Environment": {"SLEEPY_FAIL_FILE": str(broken)},
        },
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    a.sm.create_endpoint_config(
        EndpointConfigName=name, ProductionVariants=serverless_variant(name)
    )
    a.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    wait_in_service(a.sm, name)
    wait_until(lambda: not _fleet(a, b), "no instance while idle", timeout_s=60)
    broken.write_text("the weights are gone")
    for gw in (a, b):  # one of them holds the endpoint
        rt = gw.client("sagemaker-runtime", max_attempts=1)
        began = time.monotonic()
        with pytest.raises(rt.exceptions.ModelError) as failed:
            rt.invoke_endpoint(EndpointName=name, Body=b'{"sleep": 0}')
        assert time.monotonic() - began < 30, "not left to wait out its timeout"
        message = failed.value.response["Error"]["Message"]
        assert "failed to start" in message and "the weights are gone" in message, message
    broken.unlink()
    for gw in (a, b):
        out = gw.client("sagemaker-runtime").invoke_endpoint(EndpointName=name, Body=b"{}")
        assert json.loads(out["Body"].read())["slept"] == 0


def test_the_gateway_that_scales_an_endpoint_counts_the_requests_the_others_routed(
    gateway_factory: Callable[..., GatewayProcess],
    pg_schema: PgSchema,
    tmp_path: Path,
    model_tarball: Any,
) -> None:
    """Target tracking on InvocationsPerInstance with every request routed by the gateway
    that does not hold the endpoint: the holder scales on what the other recorded."""
    from tests.e2e.test_autoscaling import FAST, Load, activities, counts, put_policy, register

    env = {**LEASES, **FAST, "SHIPYARD_METRICS_TICK_S": "1"}
    a, b = _start_two(gateway_factory, pg_schema, tmp_path, env)
    name = unique("elsewhere")
    deploy(a.sm, name, model_tarball("sleepy"))
    wait_until(lambda: len(_fleet(a, b)) == 1, "one instance", timeout_s=60)
    holder, other = (a, b) if instance_pids(a.process.pid) else (b, a)
    wait_until(lambda: _answers(other, name), "the other gateway routes to it", 60)
    register(holder, name, MinCapacity=1, MaxCapacity=2)
    # One instance answers about 20 requests a second (50 ms each): 1,200 a minute, twice
    # the target. The holder routes none of them.
    put_policy(holder, name, {
        "TargetValue": 600.0,
        "PredefinedMetricSpecification": {
            "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleOutCooldown": 1, "ScaleInCooldown": 600,
    })  # fmt: skip
    with Load(other, name, threads=4, sleep_s=0.05) as load:
        wait_until(lambda: counts(holder, name)[1] == 2, "scaled out on the other's requests", 90)
    assert load.failures == []
    assert load.ok > 0
    assert instance_pids(holder.process.pid), "the holder kept the endpoint"
    (step,) = [a for a in activities(holder, name) if "2" in a["Description"]]
    assert "SageMakerVariantInvocationsPerInstance" in step["Cause"]


def test_a_session_opened_through_one_gateway_is_followed_through_the_other(
    two_gateways: tuple[GatewayProcess, GatewayProcess],
) -> None:
    """Session ids are signed with the store's shared key and name their instance, so
    the gateway that did not open a session routes it too (routing/sessions.py)."""
    from botocore.exceptions import ClientError

    from tests.e2e.test_sessions import IMAGE, MODELS, ask

    a, b = two_gateways
    deploy(a.sm, "talks", (MODELS / "sessions").as_uri(), image=IMAGE, count=2)
    wait_until(lambda: _answers(a, "talks") and _answers(b, "talks"), "both answer", 60)
    ra, rb = a.client("sagemaker-runtime"), b.client("sagemaker-runtime")
    first, out = ask(ra, "talks", SessionId="NEW_SESSION")
    session = out["NewSessionId"].split(";")[0]
    turns = [ask(rt, "talks", SessionId=session)[0] for rt in (rb, ra, rb, rb)]
    assert {t["pid"] for t in turns} == {first["pid"]}
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]

    closing, out = ask(rb, "talks", b"close", SessionId=session)
    assert out["ClosedSessionId"] == session
    for rt, sid in ((rb, session), (ra, "0" * len(session)), (rb, "never-opened")):
        with pytest.raises(ClientError) as refused:
            ask(rt, "talks", SessionId=sid)
        assert refused.value.response["Error"]["Code"] == "ValidationError"

    # The close reaches the other gateway through the store (routing/session_closes.py):
    # it refuses the session too, in any spelling.
    def refused_by_a() -> bool:
        try:
            ask(ra, "talks", SessionId=session)
        except ClientError as exc:
            return bool(exc.response["Error"]["Code"] == "ValidationError")
        return False

    wait_until(refused_by_a, "the close known to the other gateway", timeout_s=10)
    with pytest.raises(ClientError):
        ask(ra, "talks", SessionId=session.upper())
