"""The console on a gateway without ``auth:``: pages, live charts, logs, failures, phones.

One gateway for the module, with a two-variant endpoint (``scores``) and one whose
model cannot load (``broken``); invocations are real boto3 calls.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, deploy, make_tarball, start_gateway, unique
from tests.console.conftest import PHONE, Tab
from tests.e2e.test_jobs import ENV, job_request, wait_final


def _variant(name: str, model: str, weight: float, count: int) -> dict[str, Any]:
    return {
        "VariantName": name,
        "ModelName": model,
        "InstanceType": "ml.m5.large",
        "InitialInstanceCount": count,
        "InitialVariantWeight": weight,
        "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
    }


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("console")
    gw = start_gateway(home / "home", extra_env=ENV)
    try:
        sm = gw.sm
        url = make_tarball("sum", home / "models" / "sum.tar.gz").as_uri()
        deploy(
            sm,
            "scores",
            url,
            variants=[_variant("blue", "scores", 3, 1), _variant("green", "scores", 1, 1)],
        )
        deploy(sm, "broken", make_tarball("load_fails", home / "models" / "bad.tar.gz").as_uri(),
               wait=False)  # fmt: skip
        waiter = sm.get_waiter("endpoint_in_service")
        with pytest.raises(Exception, match="Failed"):
            waiter.wait(EndpointName="broken", WaiterConfig={"Delay": 0.2, "MaxAttempts": 300})
        yield gw
    finally:
        gw.stop()


def _invoke(gw: GatewayProcess, n: int) -> None:
    rt = gw.rt
    for _ in range(n):
        rt.invoke_endpoint(
            EndpointName="scores", ContentType="application/json", Body=b'{"instances": [[1, 2]]}'
        )


def _loaded(tab: Tab, selector: str = "[data-view]") -> None:
    try:
        tab.page.wait_for_selector(f"{selector}[data-loaded]")
    except Exception as exc:  # say what the page shows, not only that it timed out
        problem = tab.page.locator("#problem")
        shown = problem.inner_text() if problem.is_visible() else "(no problem shown)"
        raise AssertionError(f"{selector} never loaded: {shown}; {tab.errors}") from exc


def test_the_overview_lists_endpoints_with_status_variants_and_weights(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(gw.url + "/console")
    _loaded(tab)
    table = tab.page.locator("table.cards")
    scores = table.locator("tr", has_text="scores")
    assert "InService" in scores.inner_text()
    assert re.search(r"blue\s+1/1", scores.inner_text())
    assert "weight 3 (75%)" in scores.inner_text()
    assert "LEAST_OUTSTANDING_REQUESTS" in scores.inner_text()
    broken = table.locator("tr", has_text="broken")
    assert "Failed" in broken.inner_text()
    assert "weights missing" in broken.inner_text()
    tab.screenshot("overview.png")
    # Filtered as ListEndpoints filters: by status, by a part of the name.
    tab.page.get_by_label("Status").select_option("Failed")
    scores.wait_for(state="detached")
    assert broken.count() == 1
    tab.page.get_by_label("Status").select_option("")
    tab.page.get_by_label("Name contains").fill("SCO")
    broken.wait_for(state="detached")
    assert scores.count() == 1
    assert tab.errors == []


def test_an_endpoints_charts_follow_its_invocations(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(gw.url + "/console/endpoints/scores")
    _loaded(tab)
    page = tab.page
    instances = page.locator("section[data-view] table.cards").nth(1)
    assert instances.inner_text().count("healthy") == 2
    chart = page.locator('figure[data-chart="invocations"]')
    page.wait_for_function(
        "() => Number(document.querySelector('figure[data-chart=invocations]').dataset.points) >= 1"
    )
    before = int(chart.get_attribute("data-total") or 0)
    _invoke(gw, 30)
    page.wait_for_function(
        "n => Number(document.querySelector('figure[data-chart=invocations]').dataset.total) >= n",
        arg=before + 30,
    )
    assert "now" in chart.locator(".now").inner_text()
    assert chart.locator(".legend").inner_text().split() == ["blue", "green"]
    latency = page.locator('figure[data-chart="latency"]')
    assert int(latency.get_attribute("data-total") or 0) >= before + 30
    points = int(chart.get_attribute("data-points") or 0)
    for _ in range(4):  # steady traffic over a few polls, so the screenshot shows a line
        _invoke(gw, 12)
        time.sleep(1)
    page.wait_for_function(
        "n => Number(document.querySelector('figure[data-chart=invocations]').dataset.points) >= n",
        arg=points + 3,
    )
    tab.screenshot("endpoint.png")
    later = open_tab(gw.url + "/console/endpoints/scores")  # starts from the gateway's readings
    later.page.wait_for_selector('figure[data-chart="invocations"][data-points]')
    assert (
        int(
            later.page.locator('figure[data-chart="invocations"]').get_attribute("data-points") or 0
        )
        >= 2
    )
    assert tab.errors == later.errors == []


def test_a_failed_endpoint_shows_its_failure_reason(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(gw.url + "/console/endpoints/broken")
    _loaded(tab)
    failure = tab.page.locator(".failure")
    assert "weights missing" in failure.inner_text()
    assert "Failed" in tab.page.locator(".status").inner_text()
    logs = tab.page.locator('section[data-view$="/logs"] pre.tail').first
    logs.wait_for()
    assert "weights missing" in logs.inner_text()  # the instance's own traceback
    tab.screenshot("failed.png", full_page=False)
    assert tab.errors == []


def test_a_jobs_log_streams_while_it_runs(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    name = unique("steps")
    gw.sm.create_training_job(**job_request(name, tmp_path / "out", mode="steps", steps="25"))
    tab = open_tab(f"{gw.url}/console/jobs/{name}")
    log = tab.page.locator("pre.log")
    log.filter(has_text="step 3").wait_for()
    assert "step 25" not in log.inner_text()  # still running: the log grows as it prints
    assert "InProgress" in tab.page.locator(".status").inner_text()
    tab.page.wait_for_selector("pre.log[data-done]")
    text = log.inner_text()
    assert text.count("step 12\n") == 1 and "step 25" in text  # appended once each
    assert wait_final(gw.sm, name)["TrainingJobStatus"] == "Completed"
    tab.page.locator(".status", has_text="Completed").wait_for()
    tab.screenshot("job.png")
    jobs = open_tab(gw.url + "/console/jobs")
    _loaded(jobs)
    assert name in jobs.page.locator("table.cards").first.inner_text()
    events = open_tab(gw.url + "/console/events")
    _loaded(events)
    assert "SageMaker Training Job State Change" in events.page.inner_text("main")
    assert events.page.locator(f'a[href="/console/jobs/{name}"]').count() >= 1
    assert tab.errors == jobs.errors == events.errors == []


def test_a_running_job_is_stopped_from_its_page(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    name = unique("long")
    gw.sm.create_training_job(**job_request(name, tmp_path / "out", mode="steps", steps="10000"))
    tab = open_tab(f"{gw.url}/console/jobs/{name}")
    page = tab.page
    page.locator("pre.log").filter(has_text="step 2").wait_for()
    page.get_by_role("button", name="Stop job").click()
    confirm = page.get_by_role("region", name="Stop job")
    assert "SIGTERM" in confirm.inner_text()  # says what happens, and asks once
    confirm.get_by_role("button", name="Stop", exact=True).click()
    page.get_by_role("status").filter(has_text=f"Stopping {name}").wait_for()
    assert wait_final(gw.sm, name)["TrainingJobStatus"] == "Stopped"
    page.locator(".status", has_text="Stopped").wait_for()
    assert tab.errors == []


def test_a_phone_width_screen_gets_cards_without_sideways_scrolling(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    shots = {"/console": "phone-overview.png", "/console/endpoints/scores": "phone-endpoint.png"}
    for path, shot in shots.items():
        tab = open_tab(gw.url + path, viewport=PHONE)
        _loaded(tab)
        page = tab.page
        assert page.evaluate("document.scrollingElement.scrollWidth") <= PHONE["width"]
        header = page.locator("table.cards thead").first
        assert not header.is_visible()  # rows are cards, each cell labelled instead
        tab.screenshot(shot)
        assert tab.errors == []


def test_a_transform_job_shows_its_progress(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    from tests.e2e.test_transform import create_model, transform, wait_done, write_csv

    model = unique("lines")
    create_model(gw, model, "lines", tmp_path)
    data = tmp_path / "in"
    for n in range(3):
        write_csv(data, f"part-{n}.csv", [[i, 1] for i in range(100)])
    name = unique("tf")
    transform(gw, name, model, data.as_uri(), tmp_path / "out")
    tab = open_tab(f"{gw.url}/console/transform-jobs/{name}")
    tab.page.locator(".progress", has_text="3/3 objects · 300 records").wait_for()
    assert wait_done(gw, name)["TransformJobStatus"] == "Completed"
    tab.page.locator(".status", has_text="Completed").wait_for()
    assert tab.page.locator("details.tail summary").first.inner_text().startswith(name)
    jobs = open_tab(gw.url + "/console/jobs")
    _loaded(jobs)
    row = jobs.page.locator("tr", has_text=name)
    assert "3/3 objects" in row.inner_text() and row.locator("progress").count() == 1
    assert tab.errors == jobs.errors == []


def test_a_list_whose_first_read_fails_is_read_again_within_a_second(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    from shipyard.gateway.console.pages import LIST_EVERY_MS

    tab = open_tab(gw.url + "/console")
    _loaded(tab)
    reads: list[float] = []

    def first_fails(route: Any) -> None:
        reads.append(time.monotonic())
        if len(reads) == 1:
            route.abort("connectionreset")  # as a connection lost under the read
        else:
            route.continue_()

    tab.page.route("**/console/api/jobs*", first_fails)
    tab.page.goto(gw.url + "/console/jobs")
    _loaded(tab)
    # Read again after about a second, not after the list's period (5 s).
    assert len(reads) == 2
    assert reads[1] - reads[0] < LIST_EVERY_MS / 1000 / 2
    assert tab.page.locator("#problem").is_hidden()  # the problem shown went with it
    # The browser reports the reset itself; the script reports nothing (not its fault).
    assert [e for e in tab.errors if "ERR_CONNECTION_RESET" not in e] == []
