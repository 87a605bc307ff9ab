"""Server-side batching in the runtime: real instances of tests/models/batching over HTTP.

The model answers each request with the size of the ``predict_batch_fn`` call that served
it, so the gathering is seen from inside the model. A long delay (10 s) with a small batch
size makes "cut when full" observable without timing anything: a batch that waited for
the delay would hold the test for 10 s, one cut when full answers at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.runtime import test_runtime_contract
from tests.runtime.test_runtime_contract import MODELS, Reply, Runtime, free_port, runtime_argv

start_runtime = test_runtime_contract.start_runtime  # the module-scoped fixture, shared

BATCHING = MODELS / "batching"
LONG_DELAY_MS = "10000"


def invoke_all(runtime: Runtime, payloads: list[dict[str, object]]) -> list[Reply]:
    """Send every payload at once, each on its own connection; the replies in order."""
    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(
            pool.map(
                lambda p: runtime.invoke(json.dumps(p).encode(), content_type="application/json"),
                payloads,
            )
        )


def batch_header(reply: Reply) -> tuple[int, float]:
    size, wait = reply.headers["x-shipyard-batch"].split(";")
    return int(size.removeprefix("size=")), float(wait.removeprefix("wait="))


def test_concurrent_requests_are_gathered_into_one_call_cut_when_full(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(
        BATCHING, SHIPYARD_MAX_BATCH_SIZE="4", SHIPYARD_MAX_BATCH_DELAY_MS=LONG_DELAY_MS
    )
    replies = invoke_all(runtime, [{"id": n} for n in range(4)])
    answers = [reply.json() for reply in replies]
    assert [reply.status for reply in replies] == [200] * 4
    assert [a["batch_size"] for a in answers] == [4] * 4  # type: ignore[index]
    assert sorted(a["position"] for a in answers) == [0, 1, 2, 3]  # type: ignore[index]
    assert [batch_header(reply)[0] for reply in replies] == [4] * 4


def test_every_answer_goes_back_to_its_own_request(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    log = tmp_path / "batches.log"
    runtime = start_runtime(
        BATCHING,
        SHIPYARD_MAX_BATCH_SIZE="4",
        SHIPYARD_MAX_BATCH_DELAY_MS="50",
        BATCH_LOG=str(log),
    )
    payloads: list[dict[str, object]] = [{"id": n, "sleep": 0.02} for n in range(24)]
    replies = invoke_all(runtime, payloads)
    assert [reply.json()["echo"] for reply in replies] == payloads  # type: ignore[index]
    sizes = [int(line) for line in log.read_text().split()]
    assert sum(sizes) == 24 and max(sizes) <= 4
    assert len(sizes) < 24  # gathered: fewer calls than requests


def test_a_lone_request_waits_the_delay_and_no_longer(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(
        BATCHING, SHIPYARD_MAX_BATCH_SIZE="8", SHIPYARD_MAX_BATCH_DELAY_MS="300"
    )
    started = time.monotonic()
    reply = runtime.invoke(b'{"id": 1}', content_type="application/json")
    elapsed = time.monotonic() - started
    assert reply.json()["batch_size"] == 1  # type: ignore[index]
    size, wait_s = batch_header(reply)
    assert size == 1 and 0.29 <= wait_s < 1.0
    assert elapsed < 3.0  # bounded by the delay, not by a batch that never fills


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ("input", "ValueError: input_fn refused this item"),
        ("item", "ValueError: this item failed"),
        ("output", "ValueError: output_fn refused this item"),
    ],
)
def test_a_failing_item_fails_only_its_own_request(
    start_runtime: Callable[..., Runtime], fail: str, message: str
) -> None:
    runtime = start_runtime(
        BATCHING, SHIPYARD_MAX_BATCH_SIZE="3", SHIPYARD_MAX_BATCH_DELAY_MS=LONG_DELAY_MS
    )
    replies = invoke_all(runtime, [{"id": 0}, {"id": 1, "fail": fail}, {"id": 2}])
    assert [reply.status for reply in replies] == [200, 500, 200]
    assert replies[1].body.decode() == message
    assert [replies[n].json()["echo"]["id"] for n in (0, 2)] == [0, 2]  # type: ignore[index]


def test_a_failing_predict_batch_fn_fails_every_request_of_its_batch(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(
        BATCHING, SHIPYARD_MAX_BATCH_SIZE="2", SHIPYARD_MAX_BATCH_DELAY_MS=LONG_DELAY_MS
    )
    replies = invoke_all(runtime, [{"id": 0}, {"id": 1, "fail": "batch"}])
    assert [reply.status for reply in replies] == [500, 500]
    assert {reply.body.decode() for reply in replies} == {
        "RuntimeError: predict_batch_fn failed the whole batch"
    }
    # The next batch is served as usual.
    replies = invoke_all(runtime, [{"id": 2}, {"id": 3}])
    assert [reply.json()["batch_size"] for reply in replies] == [2, 2]  # type: ignore[index]


def test_batching_is_off_without_the_setting(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    log = tmp_path / "batches.log"
    runtime = start_runtime(BATCHING, BATCH_LOG=str(log))
    replies = invoke_all(runtime, [{"id": n} for n in range(4)])
    assert [reply.json()["batch_size"] for reply in replies] == [None] * 4  # type: ignore[index]
    assert all("x-shipyard-batch" not in reply.headers for reply in replies)
    assert not log.exists()  # predict_batch_fn was never called


@pytest.mark.parametrize(
    ("model", "env", "reason"),
    [
        ("echo", {"SHIPYARD_MAX_BATCH_SIZE": "4"}, "defines no predict_batch_fn"),
        ("batching", {"SHIPYARD_MAX_BATCH_SIZE": "many"}, "SHIPYARD_MAX_BATCH_SIZE must be"),
        ("batching", {"SHIPYARD_MAX_BATCH_DELAY_MS": "5"}, "without SHIPYARD_MAX_BATCH_SIZE"),
    ],
)
def test_a_batching_setting_the_model_cannot_honour_fails_the_start(
    tmp_path: Path, model: str, env: dict[str, str], reason: str
) -> None:
    error_file = tmp_path / "error"
    argv = runtime_argv(MODELS / model, free_port(), "--error-file", str(error_file))
    result = subprocess.run(
        argv, env={**_base_env(), **env}, capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 1
    assert reason in error_file.read_text()


def test_each_model_of_a_multi_model_instance_that_defines_predict_batch_fn_is_batched(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    shutil.copytree(BATCHING, prefix / "batched")
    shutil.copytree(BATCHING, prefix / "twin")
    shutil.copytree(MODELS / "echo", prefix / "plain")
    runtime = start_runtime(
        prefix,
        SAGEMAKER_MULTI_MODEL="true",
        SHIPYARD_MAX_BATCH_SIZE="3",
        SHIPYARD_MAX_BATCH_DELAY_MS=LONG_DELAY_MS,
    )

    def invoke(target: str, n: int) -> Reply:
        body = json.dumps({"id": n}).encode()
        return runtime.invoke(
            body, content_type="application/json", **{"X-Amzn-SageMaker-Target-Model": target}
        )

    with ThreadPoolExecutor(7) as pool:
        plain = pool.submit(invoke, "plain", 99)
        batched = [pool.submit(invoke, "batched", n) for n in range(3)]
        twin = [pool.submit(invoke, "twin", n) for n in range(3)]
        # Each model fills its own batch of 3: one batcher per model, not one shared.
        for reply in [f.result() for f in batched + twin]:
            assert reply.status == 200, reply.body
            assert reply.json()["batch_size"] == 3  # type: ignore[index]
            assert reply.headers["x-shipyard-model-cache"] in ("hit", "miss")
        assert plain.result().json() == {"id": 99}
        assert "x-shipyard-batch" not in plain.result().headers


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SHIPYARD_MAX_BATCH")}
