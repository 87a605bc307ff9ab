"""A gateway with an ``auth:`` section: only signed, allowed requests get through.

Driven with the clients users have: boto3, the AWS CLI and ``curl --aws-sigv4``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from botocore import UNSIGNED
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, deploy, unique

OPS, OPS_SECRET = "AKIATESTOPS000000001", "ops-secret-value"
APP, APP_SECRET = "AKIATESTAPP000000001", "app-secret-value"
SECRETS = {"SHIPYARD_KEY_OPS": OPS_SECRET, "SHIPYARD_KEY_APP": APP_SECRET}


def write_stack(
    path: Path,
    *,
    more_keys: Sequence[dict[str, Any]] = (),
    sections: dict[str, Any] | None = None,
    **auth: Any,
) -> Path:
    """A stack file with ``auth:`` (the OPS and APP keys, ``more_keys``, and ``auth``'s
    settings) and ``sections`` beside it."""
    stack = {
        "auth": {
            "keys": [
                {"access_key_id": OPS, "secret_access_key_env": "SHIPYARD_KEY_OPS"},
                {
                    "access_key_id": APP,
                    "secret_access_key_env": "SHIPYARD_KEY_APP",
                    "allow": ["sagemaker-runtime:InvokeEndpoint*", "sagemaker:Describe*"],
                },
                *more_keys,
            ],
            **auth,
        },
        **(sections or {}),
    }
    path.write_text(json.dumps(stack))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One gateway with auth: for the module, and the sum model deployed as ``sums``."""
    from tests.conftest import make_tarball, start_gateway

    home = tmp_path_factory.mktemp("auth")
    models = home / "models"
    tarball = make_tarball("sum", models / "sum" / "model.tar.gz")
    stack = write_stack(home / "stack.yaml", file_roots=[str(models)])
    gw = start_gateway(home / "home", extra_env=SECRETS, args=["--config", str(stack)])
    try:
        deploy(client(gw, "sagemaker"), "sums", tarball.as_uri())
        yield gw
    finally:
        gw.stop()


def client(gw: GatewayProcess, service: str, key: str = OPS, secret: str = OPS_SECRET) -> Any:
    return boto3.client(
        service,
        endpoint_url=gw.url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def error_code(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response["Error"]
    return (
        error["Code"],
        info.value.response["ResponseMetadata"]["HTTPStatusCode"],
        error.get("Message", ""),
    )


def http(
    gw: GatewayProcess, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(gw.url + path, data=body or None, method=method)
    for k, v in headers.items():
        request.add_header(k.replace("_", "-"), v)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def signed_http(
    gw: GatewayProcess,
    method: str,
    path: str,
    body: bytes = b"",
    key: str = OPS,
    secret: str = OPS_SECRET,
    **headers: str,
) -> tuple[int, Any, bytes]:
    request = AWSRequest(method=method, url=gw.url + path, data=body, headers=headers)
    SigV4Auth(Credentials(key, secret), "sagemaker", "us-east-1").add_auth(request)
    return http(gw, method, path, body, **dict(request.headers.items()))


def test_boto3_with_a_configured_key_deploys_and_invokes(secured: GatewayProcess) -> None:
    rt = client(secured, "sagemaker-runtime")
    out = rt.invoke_endpoint(
        EndpointName="sums", ContentType="application/json", Body=b'{"instances": [[1, 2]]}'
    )
    assert json.loads(out["Body"].read()) == {"predictions": [3]}
    names = [e["EndpointName"] for e in client(secured, "sagemaker").list_endpoints()["Endpoints"]]
    assert "sums" in names


def test_unsigned_requests_are_refused_on_every_door(secured: GatewayProcess) -> None:
    config = botocore.config.Config(signature_version=UNSIGNED, retries={"max_attempts": 1})
    sm = boto3.client("sagemaker", endpoint_url=secured.url, region_name="us-east-1", config=config)
    rt = boto3.client(
        "sagemaker-runtime", endpoint_url=secured.url, region_name="us-east-1", config=config
    )
    assert error_code(sm.list_endpoints) == (
        "MissingAuthenticationTokenException",
        403,
        "Missing Authentication Token",
    )
    code, status, _ = error_code(
        lambda: rt.invoke_endpoint(EndpointName="sums", ContentType="application/json", Body=b"[]")
    )
    assert (code, status) == ("MissingAuthenticationTokenException", 403)
    code, status, _ = error_code(
        lambda: rt.invoke_endpoint_async(EndpointName="sums", InputLocation="s3://b/k")
    )
    assert (code, status) == ("MissingAuthenticationTokenException", 403)

    status, _, body = http(secured, "POST", "/inference", b'{"type": "x"}')
    assert status == 403
    assert json.loads(body) == {"status": 403, "errMsg": "Missing Authentication Token"}
    assert http(secured, "GET", "/metrics")[0] == 403
    assert http(secured, "GET", "/jobs/x/logs")[0] == 403
    status, _, body = http(secured, "GET", "/v2/models/sums")
    assert status == 403 and "error" in json.loads(body)
    assert http(secured, "GET", "/healthz")[0] == 200


def test_an_unknown_key_and_a_wrong_secret_are_refused(secured: GatewayProcess) -> None:
    unknown = client(secured, "sagemaker", key="AKIAUNKNOWN000000000", secret="x")
    assert error_code(unknown.list_models)[:2] == ("UnrecognizedClientException", 403)
    wrong = client(secured, "sagemaker-runtime", key=OPS, secret="not-the-secret")
    code, status, message = error_code(
        lambda: wrong.invoke_endpoint(EndpointName="sums", ContentType="text/csv", Body=b"1,2")
    )
    assert (code, status) == ("InvalidSignatureException", 403)
    assert message.startswith("The request signature we calculated does not match")


def test_a_garbage_signature_is_refused(secured: GatewayProcess) -> None:
    garbage = (
        f"AWS4-HMAC-SHA256 Credential={OPS}/20261122/us-east-1/sagemaker/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64
    )
    status, headers, body = http(
        secured,
        "POST",
        "/endpoints/sums/invocations",
        b"[[1, 2]]",
        Authorization=garbage,
        X_Amz_Date="20261122T000000Z",
        Content_Type="application/json",
    )
    assert status == 403
    assert headers.get("x-amzn-ErrorType") == "InvalidSignatureException"
    status, _, body = http(
        secured, "POST", "/", b"{}", Authorization="garbage", X_Amz_Target="SageMaker.ListModels"
    )
    assert status == 403 and json.loads(body)["__type"] == "InvalidSignatureException"


def test_a_scoped_key_may_only_call_what_it_allows(secured: GatewayProcess) -> None:
    sm = client(secured, "sagemaker", APP, APP_SECRET)
    assert sm.describe_endpoint(EndpointName="sums")["EndpointStatus"] == "InService"
    code, status, message = error_code(sm.list_endpoints)
    assert (code, status) == ("AccessDeniedException", 403)
    assert f"user/{APP} is not authorized to perform: sagemaker:ListEndpoints" in message
    code, _, _ = error_code(lambda: sm.delete_endpoint(EndpointName="sums"))
    assert code == "AccessDeniedException"
    rt = client(secured, "sagemaker-runtime", APP, APP_SECRET)
    out = rt.invoke_endpoint(EndpointName="sums", ContentType="application/json", Body=b"[[4, 5]]")
    assert json.loads(out["Body"].read()) == [9]
    status, _, _ = signed_http(secured, "GET", "/metrics", key=APP, secret=APP_SECRET)
    assert status == 403
    status, _, body = signed_http(secured, "GET", "/metrics")
    assert status == 200
    assert b"# TYPE" in body


def test_curl_sigv4_signs_for_the_runtime_and_the_control_plane(secured: GatewayProcess) -> None:
    def curl(*args: str) -> tuple[int, str]:
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-w",
                "\n%{http_code}",
                "--aws-sigv4",
                "aws:amz:us-east-1:sagemaker",
                "--user",
                f"{OPS}:{OPS_SECRET}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        body, _, code = out.stdout.rpartition("\n")
        return int(code), body

    code, body = curl(
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "[[1, 2], [3, 4]]",
        f"{secured.url}/endpoints/sums/invocations",
    )
    assert code == 200, body
    assert json.loads(body) == [3, 7]
    code, body = curl(
        "-H",
        "Content-Type: application/x-amz-json-1.1",
        "-H",
        "X-Amz-Target: SageMaker.ListModels",
        "--data-binary",
        "{}",
        f"{secured.url}/",
    )
    assert code == 200, body
    assert "sums" in [m["ModelName"] for m in json.loads(body)["Models"]]


def test_the_aws_cli_signs_with_the_environment_credentials(
    secured: GatewayProcess, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_ACCESS_KEY_ID": OPS,
        "AWS_SECRET_ACCESS_KEY": OPS_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    aws = [str(Path(sys.executable).parent / "aws"), "--endpoint-url", secured.url]
    out = subprocess.run(
        [*aws, "sagemaker", "describe-endpoint", "--endpoint-name", "sums"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["EndpointStatus"] == "InService"
    env["AWS_SECRET_ACCESS_KEY"] = "wrong"
    out = subprocess.run(
        [*aws, "sagemaker", "list-models"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode != 0
    assert "InvalidSignatureException" in out.stderr


def test_a_missing_secret_stops_the_gateway_at_start(tmp_path: Path) -> None:
    stack = write_stack(tmp_path / "stack.yaml")
    env = {**os.environ, "SHIPYARD_KEY_OPS": "x"}
    env.pop("SHIPYARD_KEY_APP", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shipyard",
            "serve",
            "--home",
            str(tmp_path / "h"),
            "--port",
            "1",
            "--config",
            str(stack),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2
    assert "auth.keys[1].secret_access_key_env" in out.stderr
    assert "SHIPYARD_KEY_APP is not set" in out.stderr
    assert "x" not in out.stderr.split("not set")[-1]


def test_a_public_host_without_auth_is_refused_unless_insecure(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shipyard",
            "serve",
            "--home",
            str(tmp_path / "h"),
            "--host",
            "0.0.0.0",
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0" in out.stderr and "--insecure" in out.stderr

    from shipyard.app import create_app
    from shipyard.settings import Settings

    # --insecure lets it through (built, not served: tests bind loopback only).
    gateway = create_app(Settings(host="0.0.0.0", insecure=True, home=tmp_path / "h2"))
    gateway.store.close()


def test_a_non_loopback_host_with_auth_needs_no_flag(tmp_path: Path) -> None:
    from shipyard.app import create_app
    from shipyard.settings import Settings

    stack = write_stack(tmp_path / "stack.yaml")
    os.environ.update(SECRETS)
    try:
        gateway = create_app(Settings(host="0.0.0.0", home=tmp_path / "h", config=stack))
    finally:
        for name in SECRETS:
            os.environ.pop(name, None)
    gateway.store.close()


def test_the_unsigned_gateway_of_local_use_still_takes_any_request(
    gateway_factory: Callable[..., GatewayProcess], model_tarball: Callable[[str], str]
) -> None:
    gw = gateway_factory()
    name = unique("open")
    deploy(gw.sm, name, model_tarball("sum"))
    status, _, body = http(
        gw, "POST", f"/endpoints/{name}/invocations", b"[[1, 1]]", Content_Type="application/json"
    )
    assert status == 200, body


def test_the_shipyard_cli_signs_with_the_environment_credentials(
    secured: GatewayProcess, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_ACCESS_KEY_ID": OPS,
        "AWS_SECRET_ACCESS_KEY": OPS_SECRET,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    cli = [sys.executable, "-m", "shipyard"]
    out = subprocess.run(
        [*cli, "jobs", "list", "--url", secured.url], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [*cli, "logs", "no-such-job", "--url", secured.url],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "Could not find job no-such-job" in out.stderr
    env["AWS_SECRET_ACCESS_KEY"] = "wrong"
    out = subprocess.run(
        [*cli, "jobs", "list", "--url", secured.url], capture_output=True, text=True, env=env
    )
    assert out.returncode != 0
    assert "InvalidSignatureException" in out.stderr


SDK_PREDICT = """
import json, sys
import boto3, sagemaker
from sagemaker.deserializers import JSONDeserializer
from sagemaker.predictor import Predictor
from sagemaker.serializers import JSONSerializer

session = sagemaker.Session(boto_session=boto3.Session(region_name="us-east-1"))
predictor = Predictor(
    "sums", sagemaker_session=session,
    serializer=JSONSerializer(), deserializer=JSONDeserializer(),
)
print(json.dumps(predictor.predict([[1, 2], [3, 4]])))
print(session.sagemaker_client.describe_endpoint(EndpointName="sums")["EndpointStatus"])
"""


def test_the_sagemaker_sdk_signs_with_the_environment_credentials(
    secured: GatewayProcess, tmp_path: Path
) -> None:
    """The SDK reaches shipyard through AWS_ENDPOINT_URL_* alone, as users point it."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": OPS,
        "AWS_SECRET_ACCESS_KEY": OPS_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_SAGEMAKER": secured.url,
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": secured.url,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", SDK_PREDICT], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[-2]) == [3, 7]
    assert lines[-1] == "InService"
    env["AWS_SECRET_ACCESS_KEY"] = "wrong"
    out = subprocess.run(
        [sys.executable, "-c", SDK_PREDICT], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode != 0
    assert "InvalidSignatureException" in out.stdout + out.stderr


def test_an_unsigned_client_that_trickles_its_body_still_gets_its_refusal(
    secured: GatewayProcess,
) -> None:
    import socket

    port = int(secured.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(
            b"POST /endpoints/sums/invocations HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n["
        )
        answer = s.recv(65536)  # the rest of the body never comes
    assert answer.startswith(b"HTTP/1.1 403")
    assert b"MissingAuthenticationTokenException" in answer


@pytest.mark.parametrize("how", ["whole", "in_pieces"])
def test_a_chunked_bodys_trailers_cannot_change_a_signed_header(
    secured: GatewayProcess, how: str
) -> None:
    # Trailer fields come after the head the signature was checked against; taken for
    # headers they would let anyone on the wire replace a signed Content-Type.
    from tests.e2e.test_taken_invocations import in_pieces, whole

    body = b'{"instances": [[1, 2]]}'
    request = AWSRequest(
        method="POST",
        url=secured.url + "/endpoints/sums/invocations",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    SigV4Auth(Credentials(APP, APP_SECRET), "sagemaker", "us-east-1").add_auth(request)
    head = [b"POST /endpoints/sums/invocations HTTP/1.1", b"Host: " + secured.url[7:].encode()]
    head += [f"{name}: {value}".encode() for name, value in request.headers.items()]
    head += [b"Transfer-Encoding: chunked"]
    data = (
        b"\r\n".join(head) + b"\r\n\r\n" + b"%x\r\n%s\r\n0\r\n" % (len(body), body)
        + b"Content-Type: text/csv\r\nX-Amzn-SageMaker-Target-Variant: none\r\n\r\n"
    )  # fmt: skip
    status, _, answer = (whole if how == "whole" else in_pieces)(secured, data)
    assert (status, json.loads(answer)) == (200, {"predictions": [3]})


def test_logs_calls_are_scoped_as_logs_actions(secured: GatewayProcess) -> None:
    group = "/aws/sagemaker/Endpoints/sums"
    code, status, message = error_code(
        lambda: client(secured, "logs", APP, APP_SECRET).describe_log_streams(logGroupName=group)
    )
    assert (code, status) == ("AccessDeniedException", 403)
    assert "logs:DescribeLogStreams" in message
    streams = client(secured, "logs").describe_log_streams(logGroupName=group)["logStreams"]
    assert streams and streams[0]["logStreamName"].startswith("v1/")


def test_notification_secrets_are_shown_only_to_a_caller_who_may_put_them(
    tmp_path: Path,
) -> None:
    """A console's key (``shipyard:Get*``) reads ``GET /stack`` with the topics' and job
    notifications' passwords masked; the operator, who may put them, reads them whole
    (``shipyard apply`` compares them with its file's)."""
    from tests.conftest import start_gateway

    view, view_secret = "AKIATESTVIEW00000001", "view-secret-value"
    mail = "mailto://alerts:TOPSECRETPW@127.0.0.1:2525?from=a@example.com&to=b@example.com"
    hook = "json://hookuser:HOOKPW@127.0.0.1:9/events/PATHSECRET?-token=QSECRET&+X-Key=HSECRET"
    path = write_stack(
        tmp_path / "stack.yaml",
        more_keys=[
            {
                "access_key_id": view,
                "secret_access_key_env": "SHIPYARD_KEY_VIEW",
                "allow": ["shipyard:Get*"],
            }
        ],
        sections={"topics": {"done": [mail]}, "jobs": {"notify": {"Completed": [hook]}}},
        sandbox=False,
    )
    gw = start_gateway(
        tmp_path / "home",
        extra_env={**SECRETS, "SHIPYARD_KEY_VIEW": view_secret},
        args=["--config", str(path)],
    )
    try:
        status, _, body = signed_http(gw, "GET", "/stack", key=view, secret=view_secret)
        assert status == 200, body
        for secret in (b"TOPSECRETPW", b"HOOKPW", b"PATHSECRET", b"QSECRET", b"HSECRET"):
            assert secret not in body, secret
        masked = json.loads(body)
        assert masked["topics"]["done"] == ["mailto://127.0.0.1/..."]  # where it goes
        assert masked["jobs"]["notify"]["Completed"] == ["json://127.0.0.1/..."]
        status, _, body = signed_http(gw, "GET", "/stack")
        assert status == 200, body
        whole = json.loads(body)
        assert whole["topics"]["done"] == [mail]
        assert whole["jobs"]["notify"]["Completed"] == [hook]
        status, _, _ = signed_http(
            gw, "PUT", "/stack", b'{"stack": "x"}', key=view, secret=view_secret
        )
        assert status == 403
    finally:
        gw.stop()
