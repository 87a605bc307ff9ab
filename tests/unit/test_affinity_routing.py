"""Multi-model invocations through the router, with fake instance pools: retries and errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shipyard.errors import ModelNotReady, RuntimeValidationError, UpstreamError
from shipyard.http.client import Response, in_task
from shipyard.metrics import Metrics
from shipyard.routing.call import Call
from shipyard.routing.instance import Instance
from shipyard.routing.multimodel import (
    CACHE,
    ERROR,
    MultiModelDispatch,
    not_found_message,
    refusal,
    target_model,
)
from shipyard.routing.policies import ModelAffinity, Random
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute

Answer = Callable[[str], Response]


class FakePool:
    """Answers every request with ``answer(instance_id)`` and records it."""

    def __init__(self, name: str, answer: Answer, log: list[str]) -> None:
        self.name = name
        self.answer = answer
        self.log = log

    async def request(self, *args: object, **kwargs: object) -> Response:
        self.log.append(self.name)
        return self.answer(self.name)

    def start(self, *args: Any, **kwargs: Any) -> Callable[[], None]:
        """As ConnectionPool.start: ``request``'s outcome told to its callback."""
        on_answer = args[5]
        return in_task(self.request(*args[:4]), on_answer)

    def close(self) -> None:
        pass


def _route(answer: Answer, log: list[str], n: int = 2) -> tuple[Router, EndpointRoute]:
    instances = []
    for i in range(n):
        inst = Instance(f"i-{i}", "v", f"http://127.0.0.1:{9000 + i}", concurrency=1)
        inst.pool = FakePool(inst.instance_id, answer, log)  # type: ignore[assignment]
        instances.append(inst)
    metrics = Metrics()
    variant = VariantRoute(
        "v",
        weight=1.0,
        policy=Random(max_in_flight=4),
        instances=instances,
        metrics=metrics.for_variant("e", "v"),
        dispatch=MultiModelDispatch(
            prefix="s3://bucket/models/",
            policy=ModelAffinity(max_in_flight=4),
            metrics={
                i.instance_id: metrics.for_instance_models("e", "v", i.instance_id)
                for i in instances
            },
        ),
    )
    router = Router(timeout_s=5)
    route = EndpointRoute("e", [variant])
    router.publish(route)
    return router, route


def _invoke(router: Router, route: EndpointRoute, model: str = "m.tar.gz") -> Response:
    call = Call([], b"[1]", model=model)
    response, _ = asyncio.run(router.invoke(route, route.variants[0], call))
    return response


def test_a_model_too_large_for_one_instance_is_tried_on_the_other() -> None:
    log: list[str] = []

    def answer(name: str) -> Response:
        if name == "i-0":
            return Response(507, [(ERROR, b"ModelTooLarge")], b"ModelTooLarge: too big")
        return Response(200, [(CACHE, b"miss")], b"ok")

    router, route = _route(answer, log)
    first, second = route.variants[0].instances
    second.in_flight = 1  # so the first try goes to i-0
    assert _invoke(router, route).body == b"ok"
    assert log == ["i-0", "i-1"]
    assert "m.tar.gz" not in first.models and "m.tar.gz" in second.models


def test_too_large_everywhere_returns_the_last_refusal() -> None:
    log: list[str] = []
    router, route = _route(lambda _: Response(507, [(ERROR, b"ModelTooLarge")], b"x"), log)
    assert _invoke(router, route).status == 507
    assert sorted(log) == ["i-0", "i-1"]


def test_a_connection_refused_before_sending_is_retried_elsewhere() -> None:
    log: list[str] = []

    def answer(name: str) -> Response:
        if name == "i-0":
            raise UpstreamError("refused", sent=False)
        return Response(200, [(CACHE, b"miss")], b"ok")

    router, route = _route(answer, log)
    route.variants[0].instances[1].in_flight = 1
    assert _invoke(router, route).body == b"ok"
    assert not route.variants[0].instances[0].healthy


def test_no_healthy_instance_is_model_not_ready() -> None:
    router, route = _route(lambda _: Response(200, [], b""), [])
    for instance in route.variants[0].instances:
        instance.healthy = False
    with pytest.raises(ModelNotReady):
        _invoke(router, route)


def test_target_model_is_required_and_checked() -> None:
    header = b"X-Amzn-SageMaker-Target-Model"
    assert target_model("e", [(header, b"a/b.tar.gz")]) == "a/b.tar.gz"
    for value in (b"../x", b"/etc/passwd", b"a/./b", b"x" * 1025, b"\xff"):
        with pytest.raises(RuntimeValidationError):
            target_model("e", [(header, value)])
    with pytest.raises(RuntimeValidationError, match="multi-model endpoint"):
        target_model("e", [])


def test_platform_errors_become_runtime_errors() -> None:
    def refused(status: int, code: bytes, text: bytes) -> Response:
        return Response(status, [(ERROR, code)], code + b": " + text)

    missing = refusal(refused(404, b"ModelNotFound", b"gone"), "Houston_TX.tar.gz", "s3://b/p/")
    assert isinstance(missing, RuntimeValidationError)
    assert missing.message.startswith(
        "Failed to download model data(bucket: b, key: p/Houston_TX.tar.gz)"
    )
    busy = refusal(refused(429, b"ModelNotReady", b"still loading"), "m", "s3://b/p")
    assert isinstance(busy, ModelNotReady) and busy.message == "still loading"
    big = refusal(refused(507, b"ModelTooLarge", b"Model 'm' needs 9 bytes"), "m", "/p")
    assert isinstance(big, RuntimeValidationError) and big.message == "Model 'm' needs 9 bytes"
    assert refusal(refused(500, b"ModelLoadFailed", b"boom"), "m", "/p") is None
    assert refusal(Response(500, [], b"handler"), "m", "/p") is None
    assert "url: file:///p/a%20b" in not_found_message("file:///p", "a b")
