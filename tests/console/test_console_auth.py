"""The console on a gateway with ``auth:``: pages load unsigned and hold no data; the
page asks for a key and signs every call in the browser, which the gateway's own SigV4
verifier checks, scoped like any other caller."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import GatewayProcess, deploy, make_tarball, start_gateway
from tests.console.conftest import Tab
from tests.e2e.test_auth import (
    APP,
    APP_SECRET,
    OPS,
    OPS_SECRET,
    SECRETS,
    client,
    signed_http,
    write_stack,
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("console-auth")
    models = home / "models"
    tarball = make_tarball("sum", models / "sum" / "model.tar.gz")
    stack = write_stack(home / "stack.yaml", file_roots=[str(models)])
    gw = start_gateway(home / "home", extra_env=SECRETS, args=["--config", str(stack)])
    try:
        deploy(client(gw, "sagemaker"), "guarded", tarball.as_uri())
        yield gw
    finally:
        gw.stop()


def _sign_in(tab: Tab, key: str, secret: str) -> None:
    form = tab.page.locator("form#signin")
    form.wait_for()
    form.locator("input[name=key]").fill(key)
    form.locator("input[name=secret]").fill(secret)
    with tab.page.expect_navigation():
        form.locator("button[type=submit]").click()


def test_pages_load_unsigned_and_hold_no_data_while_views_need_a_signature(
    secured: GatewayProcess,
) -> None:
    status, page = secured.get("/console/endpoints/guarded")
    assert status == 200 and b'data-auth="1"' in page
    assert b"InService" not in page  # a shell: the data comes from signed views
    assert secured.get("/console/static/console.js")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(secured.url + "/console/api/endpoints", timeout=10)
    assert refused.value.code == 403
    assert json.loads(refused.value.read())["__type"] == "MissingAuthenticationTokenException"


def test_the_console_asks_for_a_key_and_signs_its_calls(
    secured: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    tab = open_tab(secured.url + "/console")
    page = tab.page
    assert page.locator("form#signin").is_visible()
    assert not page.locator("main#content").is_visible()
    tab.screenshot("sign-in.png", full_page=False)
    assert tab.errors == []

    _sign_in(tab, OPS, "not-the-secret")
    problem = page.locator("#problem")
    problem.filter(has_text="InvalidSignatureException").wait_for()
    assert page.locator("form#signin").is_visible()  # asked again, the bad key forgotten
    assert page.evaluate("sessionStorage.length") == 0
    tab.errors.clear()  # the refused call is a 403 the browser reports as a failed load

    _sign_in(tab, OPS, OPS_SECRET)
    page.locator("section[data-view] tr", has_text="guarded").wait_for()
    assert "InService" in page.locator("section[data-view]").inner_text()
    assert page.locator("#signout").is_visible()
    page.goto(secured.url + "/console/endpoints/guarded")  # the key stays for the tab
    page.wait_for_selector("figure[data-chart=invocations][data-points]")
    assert page.locator(".status").inner_text().strip() == "InService"
    assert tab.errors == []


def test_a_scoped_key_sees_what_it_may_describe_and_is_told_what_it_may_not(
    secured: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    """APP may call sagemaker:Describe* but not shipyard:GetMetrics: the endpoint's
    details load, its charts say why they cannot."""
    tab = open_tab(secured.url + "/console/endpoints/guarded")
    _sign_in(tab, APP, APP_SECRET)
    page = tab.page
    page.locator(".status", has_text="InService").wait_for()
    charts = page.locator("section.charts")
    charts.filter(has_text="AccessDeniedException").wait_for()
    assert "shipyard:GetMetrics" in charts.inner_text()
    assert page.locator("form#signin").is_hidden()  # denied, not signed out


def test_a_read_only_key_sees_every_control_disabled_with_why_and_a_forged_call_is_refused(
    secured: GatewayProcess, open_tab: Callable[..., Tab]
) -> None:
    """APP may describe and invoke, nothing else: the page disables what it may not
    call, naming the action; a control enabled by hand still gets the gateway's
    refusal, announced as an alert, and nothing changes."""
    tab = open_tab(secured.url + "/console/endpoints/guarded")
    _sign_in(tab, APP, APP_SECRET)
    page = tab.page
    page.get_by_role("status", name="Status").filter(has_text="InService").wait_for()
    weights = page.get_by_role("button", name="Update weights and capacity")
    page.wait_for_function("document.querySelector('[data-open=weights]').disabled === true")
    assert "sagemaker:UpdateEndpointWeightsAndCapacities" in (
        weights.get_attribute("aria-description") or ""
    )
    delete = page.get_by_role("button", name="Delete endpoint")
    assert delete.is_disabled()
    assert "sagemaker:DeleteEndpoint" in (delete.get_attribute("aria-description") or "")

    # Invoking is allowed: Try it goes through the runtime door, signed.
    try_it = page.get_by_role("region", name="Try it")
    assert try_it.get_by_role("button", name="Invoke").is_enabled()
    try_it.get_by_label("Body").fill("[[1, 2]]")
    try_it.get_by_role("button", name="Invoke").click()
    page.get_by_role("region", name="Response").locator("[data-http-status='200']").wait_for()

    # Forged: the button enabled by hand; the gateway refuses the call itself.
    page.evaluate("document.querySelector('[data-open=delete]').disabled = false")
    delete.click()
    panel = page.get_by_role("region", name="Delete endpoint")
    panel.get_by_label("Confirm").fill("guarded")
    panel.get_by_role("button", name="Delete").click()
    alert = page.get_by_role("alert").filter(has_text="AccessDeniedException")
    alert.wait_for()
    assert "sagemaker:DeleteEndpoint" in alert.inner_text()
    status = client(secured, "sagemaker").describe_endpoint(EndpointName="guarded")
    assert status["EndpointStatus"] == "InService"
    tab.errors[:] = [e for e in tab.errors if "403" not in e]  # the refusal's failed load
    assert tab.errors == []


def test_whoami_tells_a_key_what_it_may_do_and_needs_a_signature(
    secured: GatewayProcess,
) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(secured.url + "/console/api/whoami", timeout=10)
    assert refused.value.code == 403
    status, _, body = signed_http(secured, "GET", "/console/api/whoami", key=APP, secret=APP_SECRET)
    assert status == 200
    answer = json.loads(body)
    assert answer["key"] == APP and "sagemaker:describe*" in answer["allow"]  # as matched
