"""A gateway without ``auth:`` refuses what a web page could make the user's browser send.

Issue 65 item 2, reproduced as a page would try it: a name re-pointed at 127.0.0.1 (DNS
rebinding, so a foreign ``Host``), a cross-site ``fetch`` or ``<form>`` (``Origin``,
``Sec-Fetch-Site``), and the bodies a page sends without a preflight (a form, text/plain).
Each is refused in its door's error shape with nothing done; the clients that are not
browsers (boto3 signing with any key, or not signing at all) keep working.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.config
import botocore.model
import pytest
from botocore import UNSIGNED
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, make_tarball, start_gateway
from tests.e2e.test_auth import SECRETS, client, write_stack

ROLE = "arn:aws:iam::123456789012:role/x"
JSON = {"Content-Type": "application/x-amz-json-1.1"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
PAGE = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway without auth: (local use), the sum model deployed as ``sums``."""
    home = tmp_path_factory.mktemp("browser")
    tarball = make_tarball("sum", home / "models" / "sum" / "model.tar.gz")
    gw = start_gateway(home / "home")
    try:
        deploy(gw.sm, "sums", tarball.as_uri())
        yield gw
    finally:
        gw.stop()


def port(gw: GatewayProcess) -> int:
    return int(urlsplit(gw.url).port or 0)


def send(
    gw: GatewayProcess, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly ``headers`` (``Host`` included, when given), as a
    browser would send it; its status, headers and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port(gw), timeout=30)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body or method in ("POST", "PUT"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)  # head and body in one write, as a browser may
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


def create_model(name: str, marker: Path) -> bytes:
    return json.dumps(
        {
            "ModelName": name,
            "PrimaryContainer": {"Image": f"cmd:touch {marker}; exec sleep 60"},
            "ExecutionRoleArn": ROLE,
        }
    ).encode()


def models(gw: GatewayProcess) -> list[str]:
    return [m["ModelName"] for m in gw.sm.list_models()["Models"]]


def test_a_foreign_host_creates_nothing(local: GatewayProcess, tmp_path: Path) -> None:
    """DNS rebinding: the page's own name, pointed at 127.0.0.1, arrives as Host."""
    marker = tmp_path / "ran"
    body = create_model("rebound", marker)
    target = {"X-Amz-Target": "SageMaker.CreateModel", **JSON}
    for host in ("evil.example:8080", f"evil.example:{port(local)}", "127.0.0.1:1", "evil"):
        status, headers, out = send(local, "POST", "/", body, Host=host, **target)
        assert status == 403, out
        error = json.loads(out)
        assert error["__type"] == "AccessDeniedException" and "--allow-host" in error["message"]
    assert "rebound" not in models(local) and not marker.exists()
    # The same request, with the gateway's own names: taken.
    for n, host in enumerate(("127.0.0.1", "localhost", "LocalHost", "[::1]")):
        body = create_model(f"own-{n}", marker)
        status, _, out = send(local, "POST", "/", body, Host=f"{host}:{port(local)}", **target)
        assert status == 200, out
        local.sm.delete_model(ModelName=f"own-{n}")


def test_health_answers_any_host(local: GatewayProcess) -> None:
    status, _, _ = send(local, "GET", "/healthz", Host="evil.example:8080")
    assert status == 200
    status, _, _ = send(local, "GET", "/metrics", Host="evil.example:8080")
    assert status == 403


def test_each_door_refuses_a_foreign_host_in_its_shape(local: GatewayProcess) -> None:
    host = {"Host": "evil.example:8080", "Content-Type": "application/json"}
    own = {**host, "Host": f"127.0.0.1:{port(local)}"}
    # An invocation whose body is whole is served on callbacks (the taken path) once the
    # instance has a connection open: that path refuses it too.
    for _ in range(3):
        status, _, out = send(local, "POST", "/endpoints/sums/invocations", b"[[1, 2]]", **own)
        assert status == 200 and json.loads(out) == [3], out
        status, headers, out = send(
            local, "POST", "/endpoints/sums/invocations", b"[[1, 2]]", **host
        )
        assert status == 403 and headers["x-amzn-errortype"] == "AccessDeniedException", out
    status, _, out = send(local, "POST", "/v2/models/sums/infer", b"{}", **host)
    assert status == 403 and "Host" in json.loads(out)["error"]
    status, _, out = send(local, "POST", "/inference", b'{"type": "x"}', **host)
    assert status == 403 and json.loads(out)["status"] == 403 and json.loads(out)["errMsg"]
    status, _, out = send(local, "POST", "/v1/chat/completions", b"{}", **host)
    assert status == 403 and json.loads(out)["error"]["type"] == "permission_error"


def test_another_sites_page_is_refused(local: GatewayProcess, tmp_path: Path) -> None:
    own = f"127.0.0.1:{port(local)}"
    target = {"X-Amz-Target": "SageMaker.CreateModel", **JSON, "Host": own}
    marker = tmp_path / "ran"
    for page in (
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of this host: another origin
        {"Origin": "null"},  # a sandboxed frame or a file: page
        {"Origin": f"http://{own}, https://evil.example"},
        {"Origin": "http://localhost:1"},
        {"Origin": "http://localhost"},  # a page of port 80's server: another origin
    ):
        status, _, out = send(local, "POST", "/", create_model("paged", marker), **target, **page)
        assert status == 403 and b"another site" in out, (page, out)
    status, _, out = send(
        local, "POST", "/endpoints/sums/invocations", b"[[1, 2]]",
        Host=own, **{"Content-Type": "application/json"}, **PAGE,
    )  # fmt: skip
    assert status == 403, out
    status, _, _ = send(local, "GET", "/console/api/events", Host=own, **PAGE)
    assert status == 403
    assert "paged" not in models(local) and not marker.exists()
    # The console's own pages: its fetches are same-origin, and a link opens a page.
    same = {"Origin": f"http://{own}", "Sec-Fetch-Site": "same-origin"}
    status, _, out = send(local, "POST", "/", create_model("own", marker), **target, **same)
    assert status == 200, out
    local.sm.delete_model(ModelName="own")
    status, _, _ = send(local, "GET", "/console/api/events", Host=own, **same)
    assert status == 200
    status, _, page = send(local, "GET", "/console/", Host=own, **PAGE)
    assert status == 200 and b"<html" in page.lower()


def test_form_and_text_bodies_need_an_authorization_header(local: GatewayProcess) -> None:
    own = {"Host": f"127.0.0.1:{port(local)}"}
    alarm = (
        b"Action=PutMetricAlarm&Version=2010-08-01&AlarmName=paged&Namespace=N&MetricName=m"
        b"&Statistic=Sum&Period=60&EvaluationPeriods=1&Threshold=1"
        b"&ComparisonOperator=GreaterThanThreshold"
    )
    status, headers, out = send(local, "POST", "/", alarm, **own, **FORM)
    # the query protocol's own XML, as its clients read it
    assert status == 403 and headers["content-type"].startswith("text/xml"), out
    assert b"<Code>AccessDeniedException</Code>" in out and b"form" in out
    cloudwatch = local.client("cloudwatch")
    assert cloudwatch.describe_alarms(AlarmNames=["paged"])["MetricAlarms"] == []
    for kind in ("text/plain;charset=UTF-8", "multipart/form-data; boundary=x", "TEXT/PLAIN"):
        status, _, out = send(
            local, "POST", "/inference", b'{"type": "x"}', **own, **{"Content-Type": kind}
        )
        assert status == 403 and json.loads(out)["status"] == 403, out
    status, headers, out = send(
        local, "POST", "/endpoints/sums/invocations", b"[[1, 2]]", **own,
        **{"Content-Type": "text/plain"},
    )  # fmt: skip
    assert status == 403 and headers["x-amzn-errortype"] == "AccessDeniedException", out
    # With an Authorization header (which a page cannot send cross-site without a
    # preflight), any body: boto3 signs its form bodies with whatever key it has.
    status, _, out = send(
        local, "POST", "/endpoints/sums/invocations", b"[[1, 2]]", **own,
        **{"Content-Type": "text/plain", "Authorization": "anything"},
    )  # fmt: skip
    assert status != 403, out


def test_sdks_keep_working(local: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    unsigned = boto3.client(
        "sagemaker",
        endpoint_url=local.url,
        region_name="us-east-1",
        config=botocore.config.Config(signature_version=UNSIGNED),
    )
    assert unsigned.describe_endpoint(EndpointName="sums")["EndpointStatus"] == "InService"
    runtime = boto3.client(
        "sagemaker-runtime",
        endpoint_url=local.url,
        region_name="us-east-1",
        config=botocore.config.Config(signature_version=UNSIGNED),
    )
    out = runtime.invoke_endpoint(EndpointName="sums", Body=b"1,2", ContentType="text/csv")
    assert out["Body"].read()
    # CloudWatch's query protocol, a form body signed (with any key: nothing checks it)
    monkeypatch.setattr(botocore.model, "PRIORITY_ORDERED_SUPPORTED_PROTOCOLS", ("query",))
    old = local.client("cloudwatch")
    assert old.meta.service_model.resolved_protocol == "query"
    old.put_metric_alarm(
        AlarmName="signed-form", Namespace="N", MetricName="m", Statistic="Sum", Period=60,
        EvaluationPeriods=1, Threshold=1.0, ComparisonOperator="GreaterThanThreshold",
    )  # fmt: skip
    assert [a["AlarmName"] for a in old.describe_alarms()["MetricAlarms"]] == ["signed-form"]
    old.delete_alarms(AlarmNames=["signed-form"])


def test_console_404s_do_not_repeat_the_path(local: GatewayProcess) -> None:
    for path in ("/console/%3Cscript%3Ealert(1)%3C/script%3E", "/console/static/%3Cb%3E.js"):
        status, headers, out = send(local, "GET", path, Host=f"127.0.0.1:{port(local)}")
        assert status == 404 and headers["x-content-type-options"] == "nosniff", headers
        assert b"<" not in out and headers["content-type"].startswith("text/plain"), out


def test_allowed_hosts_are_answered(tmp_path: Path) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(json.dumps({"allow_hosts": ["proxy.example:9000"]}))
    gw = start_gateway(
        tmp_path / "home",
        args=["--config", str(stack), "--allow-host", "gw.example", "--allow-host", "[::2]"],
    )
    try:
        for host, status in (
            ("gw.example", 200),
            ("gw.example:1234", 200),
            ("proxy.example:9000", 200),
            ("[::2]:80", 200),
            ("proxy.example:9001", 403),
            ("proxy.example", 403),
            ("evil.gw.example", 403),
        ):
            got, _, out = send(gw, "POST", "/", b"{}", Host=host,
                               **{"X-Amz-Target": "SageMaker.ListModels", **JSON})  # fmt: skip
            assert got == status, (host, out)
        got, _, out = send(
            gw, "POST", "/", b"{}", Host="gw.example", Origin="https://gw.example",
            **{"X-Amz-Target": "SageMaker.ListModels", **JSON},
        )  # fmt: skip
        assert got == 200, out
    finally:
        gw.stop()


def test_a_bad_allowed_host_fails_the_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "shipyard", "serve", "--home", str(tmp_path / "h"),
         "--port", "1", "--allow-host", "http://x/"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "allow_hosts" in out.stderr, out.stderr


def test_a_query_protocol_refusal_names_the_action_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused by the alarm it names, the form's action was reported as
    sagemaker:UnknownOperation."""
    watcher, secret = "AKIATESTWATCHB000001", "watcher-b-secret"
    stack = write_stack(
        tmp_path / "stack.yaml",
        more_keys=[
            {
                "access_key_id": watcher,
                "secret_access_key_env": "K_WATCHER",
                "allow": ["cloudwatch:*"],
                "resources": ["arn:aws:cloudwatch:*:*:alarm:team-a-*"],
            }
        ],
    )
    gw = start_gateway(
        tmp_path / "home", extra_env={**SECRETS, "K_WATCHER": secret}, args=["--config", str(stack)]
    )
    try:
        monkeypatch.setattr(botocore.model, "PRIORITY_ORDERED_SUPPORTED_PROTOCOLS", ("query",))
        cw: Any = client(gw, "cloudwatch", watcher, secret)
        assert cw.meta.service_model.resolved_protocol == "query"
        with pytest.raises(ClientError) as refused:
            cw.set_alarm_state(AlarmName="team-b-guard", StateValue="ALARM", StateReason="x")
        error = refused.value.response["Error"]
        assert error["Code"] == "AccessDeniedException"
        assert "perform: cloudwatch:SetAlarmState on resource" in error["Message"], error
        assert "UnknownOperation" not in error["Message"]
    finally:
        gw.stop()
