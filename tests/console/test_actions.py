"""Working in the console, as a newcomer would: every action is a form in the page that
calls the public API, driven here in the browser against a real gateway (no ``auth:``).

One gateway for the module; the ``sum`` model answers the sum of each row, and a second
variant is added by an update so that traffic can be shifted between two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, make_tarball, start_gateway, wait_until
from tests.console.conftest import PHONE, Tab

ROLE = "arn:aws:iam::123456789012:role/x"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("console-actions")
    gw = start_gateway(home / "home", extra_env={"SHIPYARD_CAPTURE_FLUSH_INTERVAL_S": "0.2"})
    try:
        url = make_tarball("sum", home / "models" / "sum.tar.gz").as_uri()
        for name in ("adder", "adder-two"):
            gw.sm.create_model(
                ModelName=name,
                PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": url},
                ExecutionRoleArn=ROLE,
            )
        yield gw
    finally:
        gw.stop()


def _status(gw: GatewayProcess, name: str) -> str:
    return str(gw.sm.describe_endpoint(EndpointName=name)["EndpointStatus"])


def _create_from_model(tab: Tab, name: str, capture: str = "") -> None:
    page = tab.page
    page.get_by_role("button", name="Create endpoint").click()
    page.get_by_label("Endpoint name").fill(name)
    page.get_by_label("Instance type").fill("ml.m5.large")
    page.get_by_label("Instances", exact=True).fill("1")
    page.get_by_label("Capture to").fill(capture)
    page.get_by_role("button", name="Create", exact=True).click()
    page.wait_for_url(f"**/console/endpoints/{name}")


def test_a_newcomer_deploys_invokes_shifts_traffic_and_deletes_from_the_console(
    gw: GatewayProcess, open_tab: Callable[..., Tab], tmp_path: Path
) -> None:
    tab = open_tab(gw.url + "/console/models")
    page = tab.page
    page.get_by_role("link", name="adder", exact=True).click()
    page.wait_for_url("**/console/models/adder")
    _create_from_model(tab, "first", capture=(tmp_path / "captured").as_uri())
    status = page.get_by_role("status", name="Status")
    status.filter(has_text="InService").wait_for(timeout=60_000)

    # Try it: the same door as any client; the answer, its status and variant.
    try_it = page.get_by_role("region", name="Try it")
    try_it.get_by_label("Body").fill("[[1, 2], [3, 4]]")
    try_it.get_by_label("Content type").fill("application/json")
    try_it.get_by_role("button", name="Invoke").click()
    response = page.get_by_role("region", name="Response")
    response.locator("[data-http-status='200']").wait_for()
    assert "[3" in response.locator("pre.answer").inner_text()
    assert response.locator("[data-variant='AllTraffic']").count() == 1
    assert "ms" in response.inner_text()
    # What was captured of it, readable: input and output as text.
    captured = page.get_by_role("region", name="Captured data")
    captured.locator("tr", has_text="[[1, 2], [3, 4]]").wait_for()
    assert "AllTraffic" in captured.inner_text()
    tab.screenshot("try-it.png")

    # A second variant, by an update to a config of two (created as a client would).
    gw.sm.create_endpoint_config(
        EndpointConfigName="first-two",
        ProductionVariants=[
            {"VariantName": "AllTraffic", "ModelName": "adder", "InstanceType": "ml.m5.large",
             "InitialInstanceCount": 1, "InitialVariantWeight": 1},
            {"VariantName": "second", "ModelName": "adder-two", "InstanceType": "ml.m5.large",
             "InitialInstanceCount": 1, "InitialVariantWeight": 0},
        ],
    )  # fmt: skip
    page.get_by_role("button", name="Update endpoint").click()
    update = page.get_by_role("region", name="Update endpoint")
    update.get_by_label("Endpoint config").select_option("first-two")
    update.get_by_role("radiogroup", name="Deployment policy").get_by_label("All at once").check()
    update.get_by_role("button", name="Start update").click()
    page.get_by_role("status").filter(has_text="Updating first to first-two").wait_for()
    wait_until(
        lambda: (
            len(gw.sm.describe_endpoint(EndpointName="first")["ProductionVariants"]) == 2
            and _status(gw, "first") == "InService"
        ),
        "first updated to two variants",
        timeout_s=90,
    )

    # Shift 10 % of the traffic to the second variant.
    page.get_by_role("button", name="Update weights and capacity").click()
    weights = page.get_by_role("region", name="Update weights and capacity")
    weights.get_by_role("group", name="AllTraffic").get_by_label("Weight").fill("9")
    weights.get_by_role("group", name="second").get_by_label("Weight").fill("1")
    weights.get_by_role("button", name="Apply").click()
    page.get_by_role("status").filter(has_text="UpdateEndpointWeightsAndCapacities").wait_for()
    wait_until(
        lambda: (
            {
                v["VariantName"]: v["CurrentWeight"]
                for v in gw.sm.describe_endpoint(EndpointName="first")["ProductionVariants"]
            }
            == {"AllTraffic": 9.0, "second": 1.0}
        ),
        "weights 9:1",
        timeout_s=60,
    )
    page.locator("section[data-view]", has_text="(10%)").wait_for()

    # Invoke the second variant by name: the answer says which variant served it.
    try_it.get_by_label("Variant").select_option("second")
    try_it.get_by_role("button", name="Invoke").click()
    response.locator("[data-variant='second']").wait_for()

    # Target tracking on the second variant; the page lists the policy.
    page.get_by_role("button", name="Scaling policy").click()
    scaling = page.get_by_role("region", name="Scaling policy")
    scaling.get_by_label("Variant").select_option("second")
    scaling.get_by_label("Max instances").fill("3")
    scaling.get_by_label("Target invocations per instance").fill("50")
    scaling.get_by_role("button", name="Save policy").click()
    page.get_by_role("status").filter(has_text="Scaling policy saved").wait_for()
    history = page.get_by_role("region", name="History")
    history.locator("tr", has_text="endpoint/first/variant/second").wait_for(timeout=30_000)
    assert "SageMakerVariantInvocationsPerInstance at 50" in history.inner_text()
    # Opened again, the form shows what is set, to edit it.
    page.get_by_role("button", name="Scaling policy").click()
    scaling.get_by_label("Variant").select_option("second")
    assert scaling.get_by_label("Max instances").input_value() == "3"
    assert scaling.get_by_label("Target invocations per instance").input_value() == "50"
    page.keyboard.press("Escape")

    # Every step is an event, linked to its endpoint, filterable by resource.
    page.goto(gw.url + "/console/events")
    page.get_by_label("Resource").fill("first")
    rows = page.locator("section[data-view] tbody tr")
    rows.filter(has_text="Updating").first.wait_for()
    assert page.locator("section[data-view] a", has_text="first").count() >= 1

    # Delete, confirmed by typing the name; the page leaves and calls nothing more for it.
    page.goto(gw.url + "/console/endpoints/first")
    status.filter(has_text="InService").wait_for()
    page.get_by_role("button", name="Delete endpoint").click()
    delete = page.get_by_role("region", name="Delete endpoint")
    assert "every request to it fails" in delete.inner_text()
    delete.get_by_label("Confirm").fill("first")
    delete.get_by_role("button", name="Delete").click()
    page.wait_for_url("**/console?deleted=first")
    wait_until(lambda: "first" not in _names(gw), "first deleted", timeout_s=60)
    assert tab.errors == []


def _names(gw: GatewayProcess) -> list[str]:
    return [e["EndpointName"] for e in gw.sm.list_endpoints()["Endpoints"]]


def test_every_kind_of_resource_has_a_list_and_a_page(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    gw.sm.create_endpoint_config(
        EndpointConfigName="listed",
        ProductionVariants=[{"VariantName": "AllTraffic", "ModelName": "adder",
                             "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}],
    )  # fmt: skip
    gw.client("cloudwatch").put_metric_alarm(
        AlarmName="listed-errors", Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Dimensions=[{"Name": "EndpointName", "Value": "listed"},
                    {"Name": "VariantName", "Value": "AllTraffic"}],
        Statistic="Sum", Period=10, EvaluationPeriods=1, Threshold=1,
        ComparisonOperator="GreaterThanOrEqualToThreshold", TreatMissingData="notBreaching",
    )  # fmt: skip
    tab = open_tab(gw.url + "/console")
    page = tab.page
    for nav, name, heading in (
        ("Models", "adder-two", "adder-two"),
        ("Endpoint configs", "listed", "listed"),
        ("Alarms", "listed-errors", "listed-errors"),
    ):
        page.get_by_role("navigation").get_by_role("link", name=nav, exact=True).click()
        page.get_by_role("link", name=name, exact=True).click()
        page.get_by_role("heading", name=heading, level=1).wait_for()
        page.locator("section[data-view][data-loaded]").wait_for()
    page.locator("section[data-view] tr", has_text="StateUpdate").first.wait_for()  # history

    # Lists filter as the List* actions do.
    page.goto(gw.url + "/console/models")
    page.get_by_role("link", name="adder", exact=True).wait_for()
    page.get_by_label("Name contains").fill("two")
    page.get_by_role("link", name="adder", exact=True).wait_for(state="detached")
    assert page.get_by_role("link", name="adder-two", exact=True).count() == 1

    page.goto(gw.url + "/console/inference-components")
    page.locator("section[data-view][data-loaded]").wait_for()
    tab.page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.goto(gw.url + "/console/models/adder")
    page.get_by_role("button", name="Create endpoint").click()
    page.get_by_role("region", name="Create endpoint").get_by_label("Endpoint name").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    tab.screenshot("phone-create-endpoint.png")
    assert tab.errors == []


def test_the_actions_are_reachable_by_keyboard(
    gw: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(gw.url + "/console/models/adder")
    page = tab.page
    page.locator("section[data-view][data-loaded]").wait_for()
    button = page.get_by_role("button", name="Create endpoint")
    button.focus()
    page.keyboard.press("Enter")
    focused: Any = page.evaluate("document.activeElement.name")
    assert focused == "endpoint"  # the form opened with its first field focused
    page.keyboard.press("Escape")
    page.get_by_role("region", name="Create endpoint").wait_for(state="hidden")
    assert page.evaluate("document.activeElement.textContent") == "Create endpoint"
    assert tab.errors == []
