"""``POST /copies`` on real instances: a shadow variant's copies taken many at a time, each
invoked as ``POST /invocations`` would be, answered with each one's status and seconds
(shipyard/contract.py). The gateway's side is in tests/e2e/test_shadow.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.runtime import test_runtime_contract
from tests.runtime.test_runtime_contract import MODELS, Runtime

from shipyard.contract import MAX_COPIES, pack_copies, unpack_copies, unpack_outcomes

start_runtime = test_runtime_contract.start_runtime  # the module-scoped fixture, shared

JSON = [(b"Content-Type", b"application/json")]


def post_copies(runtime: Runtime, copies: list[tuple[list[tuple[bytes, bytes]], bytes]]):
    reply = runtime.request("POST", "/copies", pack_copies(copies))
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"] == "application/octet-stream"
    return unpack_outcomes(reply.body, len(copies))


def test_each_copy_is_invoked_with_its_own_headers(start_runtime: Callable[..., Runtime]) -> None:
    summer = start_runtime(MODELS / "sum")
    outcomes = post_copies(
        summer,
        [
            ([(b"Content-Type", b"text/csv")], b"1,2\n3,4\n"),
            ([(b"Content-Type", b"application/json")], b"1,2\n3,4\n"),  # not JSON: refused
            ([(b"Content-Type", b"text/csv"), (b"Accept", b"text/csv")], b"5,6\n"),
        ],
    )
    assert [status for status, _ in outcomes] == [200, 400, 200]
    assert all(0 <= seconds < 10 for _, seconds in outcomes)


def test_a_failing_copy_fails_alone_and_copies_run_in_order(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    log = tmp_path / "shadow.log"
    log.touch()
    runtime = start_runtime(MODELS / "shadow_log", SHADOW_LOG=str(log))
    bodies = [json.dumps({"i": n}).encode() for n in range(5)]
    outcomes = post_copies(runtime, [(JSON, body) for body in bodies])
    assert [status for status, _ in outcomes] == [200] * 5
    assert log.read_bytes().splitlines() == bodies

    failing = start_runtime(MODELS / "shadow_log", SHADOW_FAIL="1")
    outcomes = post_copies(failing, [(JSON, b"{}"), (JSON, b"{}")])
    assert [status for status, _ in outcomes] == [500, 500]


def test_the_instance_answers_pings_between_the_copies_it_works_through(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    """Sixteen copies of 0.25 s each hold the instance for 4 s, each too short for the
    ping standby (runtime/workers.py): a ping waits for a copy or two, not for all of them."""
    runtime = start_runtime(MODELS / "shadow_log", SHADOW_SLEEP_S="0.25")
    with ThreadPoolExecutor(1) as pool:
        copies = pool.submit(post_copies, runtime, [(JSON, b"{}")] * 16)
        time.sleep(0.5)  # the copies are under way
        started = time.monotonic()
        assert runtime.request("GET", "/ping").status == 200
        waited = time.monotonic() - started
        outcomes = copies.result(timeout=30)
    assert [s for s, _ in outcomes] == [200] * 16
    assert waited < 2.0, waited  # 3.5 s when the copies never give the loop a turn


def test_copies_to_a_batching_instance_are_gathered_into_one_batch(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    """Four copies, a batch of four and a 10 s delay: answered at once only if the
    copies reached the batcher together rather than one after another."""
    log = tmp_path / "batches.log"
    runtime = start_runtime(
        MODELS / "batching",
        SHIPYARD_MAX_BATCH_SIZE="4",
        SHIPYARD_MAX_BATCH_DELAY_MS="10000",
        BATCH_LOG=str(log),
    )
    started = time.monotonic()
    copies = [(JSON, json.dumps({"id": n}).encode()) for n in range(3)]
    copies.append((JSON, json.dumps({"id": 3, "fail": "item"}).encode()))
    outcomes = post_copies(runtime, copies)
    assert time.monotonic() - started < 8
    assert [status for status, _ in outcomes] == [200, 200, 200, 500]
    assert log.read_text().split() == ["4"]


def test_a_body_that_is_no_sequence_of_copies_is_refused(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(MODELS / "sum")
    whole = pack_copies([(JSON, b"[[1, 2]]")])
    too_many = pack_copies([([], b"")] * (MAX_COPIES + 1))  # six bytes a copy
    for broken in (whole[:-1], whole[:3], whole + b"\x00", too_many):
        reply = runtime.request("POST", "/copies", broken)
        assert reply.status == 400, broken
        assert reply.body.startswith(b"Not a sequence of copies")
    assert runtime.request("GET", "/copies").status == 405


@pytest.mark.parametrize(
    "copies",
    [
        [],
        [([], b"")],
        [(JSON, b"{}"), ([(b"X-Amzn-SageMaker-Custom-Attributes", b"a=1")], b"\x00" * 70_000)],
        [([(b"N" * 300, b"v" * 70_000)], b"body")],
    ],
    ids=["none", "empty", "two", "long-header"],
)
def test_copies_unpack_to_what_was_packed(
    copies: list[tuple[list[tuple[bytes, bytes]], bytes]],
) -> None:
    lowered = [([(n.lower(), v) for n, v in headers], body) for headers, body in copies]
    assert unpack_copies(pack_copies(copies)) == lowered
