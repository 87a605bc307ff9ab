"""The endpoint page for the other kinds of endpoint: a multi-model endpoint's cache, a
serverless endpoint's state, an asynchronous endpoint's backlog."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    MODELS,
    GatewayProcess,
    deploy,
    make_tarball,
    start_gateway,
    wait_until,
)
from tests.console.conftest import Tab
from tests.e2e.test_multimodel import _deploy_mme, _invoke
from tests.e2e.test_serverless import create_serverless
from tests.runtime.mme_models import write_models


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("console-kinds")
    gw = start_gateway(home / "home")
    try:
        yield gw
    finally:
        gw.stop()


def _endpoint_page(open_tab: Callable[..., Tab], gw: GatewayProcess, name: str) -> Tab:
    tab = open_tab(f"{gw.url}/console/endpoints/{name}")
    tab.page.wait_for_selector("section[data-view][data-loaded]")
    return tab


def test_a_multi_model_endpoint_shows_what_each_instance_holds(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    prefix = tmp_path / "models"
    write_models(prefix, 2)
    _deploy_mme(gw, "many", prefix)
    for target in ("model-0.tar.gz", "model-1.tar.gz"):
        _invoke(gw, "many", target)
    tab = _endpoint_page(open_tab, gw, "many")
    cache = tab.page.locator("section[data-view] tr", has_text="model-0.tar.gz")
    cache.wait_for()
    assert "model-1.tar.gz" in cache.inner_text()
    assert tab.errors == []


def test_a_serverless_endpoint_shows_its_concurrency_and_instances(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    url = make_tarball("sum", tmp_path / "sum.tar.gz").as_uri()
    create_serverless(gw, "lambda", url, MaxConcurrency=4)
    tab = _endpoint_page(open_tab, gw, "lambda")
    serverless = tab.page.locator("section[data-view] tr", has_text="/ 4")
    serverless.wait_for()
    assert "0 / 4" in serverless.inner_text() and "1024 MB" in serverless.inner_text()
    gw.rt.invoke_endpoint(EndpointName="lambda", ContentType="application/json", Body=b"[[1, 2]]")
    tab.page.locator("section[data-view] tr", has_text="healthy").wait_for()
    assert "serverless" in tab.page.locator("section[data-view]").first.inner_text()
    assert tab.errors == []


def test_an_async_endpoint_shows_its_backlog(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    url = make_tarball("sum", tmp_path / "sum.tar.gz").as_uri()
    out = tmp_path / "async-out"
    deploy(
        gw.sm,
        "queued",
        url,
        async_config={"OutputConfig": {"S3OutputPath": out.as_uri()}},
    )
    inputs = tmp_path / "async-in"
    inputs.mkdir()
    for n in range(3):
        (inputs / f"{n}.json").write_text("[[1, 2]]")
        gw.rt.invoke_endpoint_async(
            EndpointName="queued",
            InputLocation=(inputs / f"{n}.json").as_uri(),
            ContentType="application/json",
        )
    tab = _endpoint_page(open_tab, gw, "queued")
    backlog = tab.page.locator("[data-backlog]")
    backlog.wait_for()
    tab.page.wait_for_selector('[data-backlog="0"]')  # all three answered
    assert "asynchronous" in tab.page.locator("dl.facts").first.inner_text()
    requests = tab.page.get_by_role("region", name="Asynchronous requests")
    requests.locator("tbody tr", has_text="Completed").nth(2).wait_for()
    assert out.as_uri() in requests.inner_text()
    assert tab.errors == []


def test_an_endpoint_of_components_shows_them_their_copies_placement_and_sessions(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    role = "arn:aws:iam::123456789012:role/x"
    url = make_tarball("echo", tmp_path / "echo.tar.gz").as_uri()
    gw.sm.create_model(
        ModelName="ic-echo",
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url},
        ExecutionRoleArn=role,
    )
    gw.sm.create_endpoint_config(
        EndpointConfigName="shared", ExecutionRoleArn=role,
        ProductionVariants=[{"VariantName": "AllTraffic", "InstanceType": "ml.m5.large",
                             "InitialInstanceCount": 2}],
    )  # fmt: skip
    gw.sm.create_endpoint(EndpointName="shared", EndpointConfigName="shared")
    gw.sm.get_waiter("endpoint_in_service").wait(
        EndpointName="shared", WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    gw.sm.create_inference_component(
        InferenceComponentName="echoes", EndpointName="shared", VariantName="AllTraffic",
        Specification={"ModelName": "ic-echo", "ComputeResourceRequirements": {
            "NumberOfCpuCoresRequired": 1.5, "MinMemoryRequiredInMb": 1024}},
        RuntimeConfig={"CopyCount": 2},
    )  # fmt: skip
    wait_until(
        lambda: (
            gw.sm.describe_inference_component(InferenceComponentName="echoes")[
                "InferenceComponentStatus"
            ]
            == "InService"
        ),
        "echoes in service",
    )
    gw.rt.invoke_endpoint(
        EndpointName="shared", InferenceComponentName="echoes", Body=b"{}",
        SessionId="NEW_SESSION",
    )  # fmt: skip
    tab = _endpoint_page(open_tab, gw, "shared")
    row = tab.page.locator("section[data-view] tr", has_text="cores, 1024 MB")
    row.filter(has_text="2/2").wait_for()
    text = row.inner_text()
    assert "echoes" in text
    assert "1.5 cores, 1024 MB" in text
    assert "0, 1" in text  # 1.5 cores each: one copy per 2-core instance
    view = tab.page.locator("section[data-view]").first.inner_text()
    assert "Variant AllTraffic: 2 instances." in view and "Open sessions: 1." in view
    # The list counts the component's copies, and its variant's instances, as served.
    tab.page.goto(f"{gw.url}/console")
    listed = tab.page.locator("section[data-view] tr", has_text="shared")
    listed.filter(has_text="echoes").wait_for()
    assert "2/2" in listed.locator("li", has_text="echoes").inner_text()
    assert "2/2" in listed.locator("li", has_text="ml.m5.large").inner_text()
    tab.page.goto(f"{gw.url}/console/inference-components/echoes")
    tab.page.locator('[data-copies="2"]').wait_for()

    # One copy fewer, from the endpoint's weights and capacity form.
    tab.page.goto(f"{gw.url}/console/endpoints/shared")
    tab.page.get_by_role("button", name="Update weights and capacity").click()
    form = tab.page.get_by_role("region", name="Update weights and capacity")
    form.get_by_role("group", name="echoes").get_by_label("Instances").fill("1")
    form.get_by_role("button", name="Apply").click()
    tab.page.get_by_role("status").filter(has_text="echoes: 1 copies").wait_for()
    described = gw.sm.describe_inference_component(InferenceComponentName="echoes")
    assert described["RuntimeConfig"]["DesiredCopyCount"] == 1
    row.filter(has_text="1/1").wait_for()
    assert tab.errors == []


def test_try_it_streams_a_streaming_models_answer_and_shows_a_mid_stream_failure(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    deploy(gw.sm, "streams", (MODELS / "streamer").as_uri())
    tab = _endpoint_page(open_tab, gw, "streams")
    page = tab.page
    try_it = page.get_by_role("region", name="Try it")
    try_it.get_by_label("Body").fill('{"chunks": 3}')
    try_it.get_by_label("Stream the answer").check()
    try_it.get_by_role("button", name="Invoke").click()
    response = page.get_by_role("region", name="Response")
    page.locator(".response[data-parts='3']").wait_for()
    assert response.locator("pre.answer").inner_text() == "chunk 0\nchunk 1\nchunk 2\n"
    assert response.locator("[data-http-status='200']").count() == 1

    try_it.get_by_label("Body").fill('{"chunks": 5, "fail_after": 2}')
    try_it.get_by_role("button", name="Invoke").click()
    page.get_by_role("alert").filter(has_text="failed mid-stream").wait_for()
    assert "ModelStreamError" in response.locator("pre.answer").inner_text()
    assert tab.errors == []
