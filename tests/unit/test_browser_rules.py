"""The browser rules of a gateway without auth: (gateway/edge/browser.py), by the head alone."""

from __future__ import annotations

import pytest

from shipyard.gateway.edge.assembly import _bound
from shipyard.gateway.edge.auth import Head
from shipyard.gateway.edge.browser import BrowserRules

RULES = BrowserRules(8080, ["gw.example", "proxy.example:9000", "[::2]"])


@pytest.mark.parametrize(
    ("host", "own"),
    [("127.0.0.1:8080", True), ("localhost", True), ("[::1]:8080", True),
     ("LOCALHOST:8080", True), ("gw.example:1", True), ("proxy.example:9000", True),
     ("[::2]:443", True), ("127.0.0.1:8081", False), ("proxy.example", False),
     ("evil.example:8080", False), ("gw.example.evil", False), (None, False), ("", False)],
)  # fmt: skip
def test_host(host: str | None, own: bool) -> None:
    refusal = RULES.refusal("GET", "/metrics", Head(host=host))
    assert (refusal is None) is own, refusal
    assert RULES.refusal("GET", "/healthz", Head(host=host)) is None


@pytest.mark.parametrize(
    ("origin", "own"),
    [("http://127.0.0.1:8080", True), ("https://gw.example", True),
     ("http://proxy.example:9000", True), ("http://localhost", False),
     ("http://localhost:3000", False), ("null", False), ("file://", False),
     ("http://127.0.0.1:8080,https://evil.example", False), ("ftp://gw.example", False)],
)  # fmt: skip
def test_origin(origin: str, own: bool) -> None:
    head = Head(host="127.0.0.1:8080", origin=origin, content_type="application/json")
    assert (RULES.refusal("POST", "/", head) is None) is own
    # a console page opens from anywhere; its data does not
    assert RULES.refusal("GET", "/console/jobs", head) is None
    assert (RULES.refusal("GET", "/console/api/jobs", head) is None) is own


def test_the_scheme_s_own_port_and_a_port_chosen_at_start() -> None:
    on_80 = BrowserRules(80)
    assert on_80.refusal("POST", "/", Head(host="localhost", origin="http://localhost")) is None
    any_port = BrowserRules(0)
    assert any_port.refusal("POST", "/", Head(host="127.0.0.1:5123")) is None
    assert any_port.refusal("POST", "/", Head(host="evil.example:5123")) is not None


@pytest.mark.parametrize(
    ("content_type", "authorization", "refused"),
    [("text/plain", None, True), ("Text/Plain; charset=UTF-8", None, True),
     ("application/x-www-form-urlencoded", None, True),
     ("multipart/form-data; boundary=x", None, True),
     ("application/json,text/plain", None, True),
     ("application/x-www-form-urlencoded", "AWS4-HMAC-SHA256 ...", False),
     ("application/json", None, False), ("text/csv", None, False), (None, None, False)],
)  # fmt: skip
def test_bodies(content_type: str | None, authorization: str | None, refused: bool) -> None:
    for _ in range(2):  # the second time from what the first learnt
        head = Head(host="127.0.0.1", content_type=content_type, authorization=authorization)
        assert (RULES.refusal("POST", "/", head) is not None) is refused
        assert RULES.refusal("GET", "/", head) is None


@pytest.mark.parametrize("entry", ["http://x/", "a b", "*", "x:port", ""])
def test_an_allowed_host_must_be_a_host(entry: str) -> None:
    with pytest.raises(ValueError, match="allow_hosts"):
        BrowserRules(8080, [entry])


@pytest.mark.parametrize(
    ("bound", "names"),
    [("10.1.2.3", ["10.1.2.3:8080"]), ("gw.internal", ["gw.internal:8080"]),
     ("fd00::5", ["[fd00::5]:8080"]), ("0.0.0.0", []), ("::", []), ("127.0.0.1", [])],
)  # fmt: skip
def test_the_address_a_gateway_listens_on_is_one_of_its_names(bound: str, names: list[str]) -> None:
    """A gateway told to listen beyond loopback (``--host 10.1.2.3 --insecure``) is
    reached by that address: its clients name it so, and no page can make a browser
    send another site's address as its Host."""
    assert _bound(bound, 8080) == names
    rules = BrowserRules(8080, _bound(bound, 8080))
    for name in names:
        assert rules.refusal("POST", "/", Head(host=name, content_type="application/json")) is None
        assert rules.refusal("POST", "/", Head(host=name.rsplit(":", 1)[0] + ":1")) is not None
