"""Unknown paths and methods get a JSON error in the shape of the door they look like."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message

import pytest

from tests.conftest import GatewayProcess


def _call(gw: GatewayProcess, method: str, path: str) -> tuple[int, Message, dict]:
    request = urllib.request.Request(
        gw.url + path,
        data=b"{}" if method == "POST" else None,
        headers={"Content-Type": "application/json"},
    )
    request.method = method
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/", 405), ("POST", "/no/such/door", 404), ("DELETE", "/metrics", 405)],
)
def test_the_control_plane_shape(gateway: GatewayProcess, method: str, path: str, status: int):
    code, headers, body = _call(gateway, method, path)
    assert code == status
    assert body["__type"] == "UnknownOperationException" and path in body["message"]
    assert headers["Content-Type"] == "application/x-amz-json-1.1"


def test_the_runtime_shape(gateway: GatewayProcess) -> None:
    code, headers, body = _call(gateway, "GET", "/endpoints/x/invocations")
    assert code == 404 and headers["x-amzn-ErrorType"] == "UnknownOperationException"
    assert body["message"]


def test_the_facade_shape(gateway: GatewayProcess) -> None:
    code, _, body = _call(gateway, "GET", "/inference")
    assert code == 405 and body == {"status": 405, "errMsg": "GET is not supported on /inference."}
