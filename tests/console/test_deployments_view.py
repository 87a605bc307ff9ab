"""The console's view of CloudWatch and deployments, in a real browser: charts that start
from the stored datapoints (so a restarted gateway still shows what came before), an
endpoint's alarms and their states, and a deployment's progress and rollback."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import GatewayProcess, make_tarball, wait_in_service, wait_until
from tests.console.conftest import Tab
from tests.e2e.test_deployments import make_config


def test_charts_alarms_and_a_deployment_that_rolls_back(
    gateway_factory: Callable[..., GatewayProcess],
    open_tab: Callable[..., Tab],
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    env = {"SHIPYARD_METRICS_TICK_S": "2"}
    gw = gateway_factory(home=home, extra_env=env)
    url = make_tarball("flaky", tmp_path / "flaky.tar.gz").as_uri()
    make_config(gw, "shop-a", url, "old")
    make_config(gw, "shop-b", url, "new")
    gw.sm.create_endpoint(EndpointName="shop", EndpointConfigName="shop-a")
    wait_in_service(gw.sm, "shop")
    for _ in range(20):
        gw.rt.invoke_endpoint(EndpointName="shop", Body=b"{}", ContentType="application/json")
    cw = gw.client("cloudwatch")
    where = [{"Name": "EndpointName", "Value": "shop"}, {"Name": "VariantName", "Value": "v1"}]

    def recorded() -> float:
        now = time.time()
        answer = cw.get_metric_statistics(
            Namespace="AWS/SageMaker", MetricName="Invocations", Dimensions=where,
            StartTime=now - 600, EndTime=now + 60, Period=600, Statistics=["Sum"],
        )  # fmt: skip
        return sum(p["Sum"] for p in answer["Datapoints"])

    wait_until(lambda: recorded() == 20, "the invocations recorded")
    # A new gateway on the same home: its memory is empty, its store is not.
    gw.stop()
    gw = gateway_factory(home=home, extra_env=env)
    cw = gw.client("cloudwatch")
    # No traffic from here: with "ignore" the state SetAlarmState sets stays.
    cw.put_metric_alarm(
        AlarmName="shop-errors",
        Namespace="AWS/SageMaker",
        MetricName="Invocation5XXErrors",
        # On the endpoint alone: no datapoint has these dimensions (each is per variant),
        # so no evaluation can take back the state SetAlarmState sets below. On the
        # variant's, the periods of the 20 calls above, judged OK, could land between
        # SetAlarmState and the deployment's next look at its alarms.
        Dimensions=where[:1],
        Statistic="Sum",
        Period=10,
        EvaluationPeriods=1,
        Threshold=1,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="ignore",
    )  # fmt: skip
    wait_in_service(gw.sm, "shop")

    tab = open_tab(gw.url + "/console/endpoints/shop")
    page = tab.page
    page.wait_for_selector("[data-view][data-loaded]")
    page.wait_for_function(
        "() => Number(document.querySelector('figure[data-chart=invocations]').dataset.stored) >= 1"
    )
    alarms = page.locator("section[data-view] table", has_text="shop-errors").first
    assert "Invocation5XXErrors" in alarms.inner_text()

    # A canary of one instance, rolled back by shop-errors, started from the page.
    page.get_by_role("button", name="Update endpoint").click()
    form = page.get_by_role("region", name="Update endpoint")
    form.get_by_label("Endpoint config").select_option("shop-b")
    form.get_by_role("radiogroup", name="Deployment policy").get_by_label("Canary").check()
    form.get_by_label("Size").fill("1")
    form.get_by_label("Unit").select_option(label="Instances")
    form.get_by_label("Wait interval").fill("300")
    form.get_by_label("Rollback alarms").fill("shop-errors")
    form.get_by_role("button", name="Start update").click()
    page.wait_for_selector('[data-deployment="Baking"]', timeout=60_000)
    deployment = page.get_by_role("region", name="Deployment")
    assert "shop-b" in deployment.inner_text() and "blue/green, canary" in deployment.inner_text()
    assert deployment.locator("meter").get_attribute("value") == "0.500"
    assert "shop-errors" in deployment.inner_text()
    tab.screenshot("deployment.png")

    # Roll back: the page sets the rollback alarm (SetAlarmState), as a drill would.
    deployment.get_by_role("button", name="Roll back").click()
    page.get_by_role("status").filter(has_text="the deployment rolls back").wait_for()
    page.wait_for_function(
        "() => document.body.innerText.includes('rolled back')"
        " && document.querySelector('p[data-status]')?.dataset.status === 'InService'",
        timeout=60_000,
    )
    text = page.locator("section[data-view]").first.inner_text()
    assert "shop-errors" in text and "InService" in text
    assert page.locator("[data-deployment]").count() == 0
    assert "ALARM" in alarms.inner_text()
    # The steps, and why it ended, in the endpoint's deployment history.
    history = page.locator("section[data-view] table", has_text="Endpoint Deployment").first
    assert "RolledBack" in history.inner_text() and "Baking" in history.inner_text()
    assert tab.errors == []
