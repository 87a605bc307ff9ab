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
from tests.e2e.test_auth import APP, APP_SECRET, OPS, OPS_SECRET, SECRETS, client, write_stack


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
