"""Multi-model mode end to end: real runtime processes with SAGEMAKER_MULTI_MODEL=true.

Each instance serves a prefix of small linear models (tests/runtime/mme_models.py) on a
free port on 127.0.0.1 and is stopped by its PID when the module is done. ``served`` has
a roomy budget; ``tight`` has 250 MiB and models carrying 100 to 300 MiB of ballast.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from mme_models import (
    COUNTER_ENV,
    LinearModel,
    archive_bytes,
    linear_model,
    load_counts,
    write_model,
    write_models,
)
from test_runtime_contract import (
    MODELS,
    Reply,
    Runtime,
    free_port,
    run_to_exit,
    runtime_argv,
    spawn,
    stop,
    wait_ready,
)
from tests.conftest import Bucket

from shipyard.contract import (
    ERROR_HEADER,
    EVICTED_HEADER,
    LOADED_MODELS_HEADER,
    MODEL_CACHE_HEADER,
    MODEL_TIMINGS_HEADER,
    TARGET_MODEL_HEADER,
    parse_evicted,
    parse_timings,
)

MIB = 2**20
ROWS = [[1, 2], [3, -4]]
CACHE = MODEL_CACHE_HEADER.lower()
TIMINGS = MODEL_TIMINGS_HEADER.lower()
EVICTED = EVICTED_HEADER.lower()
LOADED = LOADED_MODELS_HEADER.lower()
ERROR = ERROR_HEADER.lower()


@dataclass
class MultiModelRuntime(Runtime):
    """A runtime in multi-model mode, and the file its models' loads are counted in."""

    counter: Path

    def invoke_model(self, target: str, rows: object = ROWS, **headers: str) -> Reply:
        wire = {TARGET_MODEL_HEADER: target, **headers}
        return self.request("POST", "/invocations", json.dumps(rows).encode(), wire)

    def post_json(self, path: str, payload: object) -> Reply:
        return self.request("POST", path, json.dumps(payload).encode())

    def rss_bytes(self) -> int:
        statm = Path(f"/proc/{self.process.pid}/statm").read_text()
        return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def unload_all(self) -> None:
        listing = self.request("GET", "/models").json()
        assert isinstance(listing, dict)
        for model in listing["models"]:
            self.request("DELETE", f"/models/{quote(model['modelName'], safe='')}")


@dataclass
class Prefix:
    path: Path
    models: dict[str, LinearModel]


@pytest.fixture(scope="module")
def start_mme(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., MultiModelRuntime]]:
    """A factory: ``start_mme(prefix, **env)`` returns a ready instance.

    Every process started is stopped by its PID when the module is done.
    """
    started: list[MultiModelRuntime] = []

    def start(prefix: str, **env: str) -> MultiModelRuntime:
        home = tmp_path_factory.mktemp("mme-instance")
        port = free_port()
        environ = {
            **os.environ,
            "SAGEMAKER_MULTI_MODEL": "true",
            "SHIPYARD_MODEL_PREFIX": prefix,
            COUNTER_ENV: str(home / "loads.txt"),
            **env,
        }
        stderr_path = home / "runtime.log"
        process = spawn(runtime_argv(home / "model", port), environ, stderr_path)
        runtime = MultiModelRuntime(port, process, stderr_path, home / "loads.txt")
        started.append(runtime)
        wait_ready(runtime)
        return runtime

    try:
        yield start
    finally:
        for runtime in started:  # signal all first: each takes a moment to drain
            if runtime.process.poll() is None:
                runtime.process.terminate()
        for runtime in started:
            stop(runtime.process)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Prefix:
    """Four plain models, and some with a twist: slow, broken, a folder, a nested name."""
    path = tmp_path_factory.mktemp("mme-prefix")
    written = write_models(path, 4)
    written.append(write_model(path, "burst.tar.gz", load_sleep_s=0.5))
    written.append(write_model(path, "slow.tar.gz", load_sleep_s=3))
    written.append(write_model(path, "broken.tar.gz", fail=True))
    written.append(write_model(path, "folder-model", folder=True))
    written.append(write_model(path, "team/nested.tar.gz"))
    return Prefix(path, {model.name: model for model in written})


@pytest.fixture(scope="module")
def served(start_mme: Callable[..., MultiModelRuntime], roomy: Prefix) -> MultiModelRuntime:
    """The roomy prefix, named by a file:// URI, with a 2 GiB budget."""
    return start_mme(roomy.path.as_uri(), SHIPYARD_MODEL_CACHE_BYTES=str(2048 * MIB))


@pytest.fixture(scope="module")
def ballast(tmp_path_factory: pytest.TempPathFactory) -> Prefix:
    path = tmp_path_factory.mktemp("mme-ballast")
    written = write_models(path, 3, stem="big", ballast_mb=100)
    written.append(write_model(path, "huge.tar.gz", ballast_mb=300))
    written.append(write_model(path, "ballast200.tar.gz", ballast_mb=200))
    return Prefix(path, {model.name: model for model in written})


@pytest.fixture(scope="module")
def tight(start_mme: Callable[..., MultiModelRuntime], ballast: Prefix) -> MultiModelRuntime:
    """The ballast prefix, named by a plain path, with a 250 MiB budget."""
    return start_mme(str(ballast.path), SHIPYARD_MODEL_CACHE_BYTES=str(250 * MIB))


def expected(model: LinearModel) -> dict[str, object]:
    return {"model": model.name, "predictions": model.predict(ROWS)}


# --- serving models by TargetModel ----------------------------------------------------


def test_each_model_answers_with_its_own_coefficients(
    served: MultiModelRuntime, roomy: Prefix
) -> None:
    answers = []
    for name in ("model-0.tar.gz", "model-1.tar.gz", "folder-model", "team/nested.tar.gz"):
        reply = served.invoke_model(name)
        assert (reply.status, reply.json()) == (200, expected(roomy.models[name]))
        answers.append(json.dumps(reply.json()["predictions"]))
    assert len(set(answers)) == len(answers)


def test_a_first_request_misses_and_reports_its_load_then_requests_hit(
    served: MultiModelRuntime,
) -> None:
    first = served.invoke_model("model-2.tar.gz")
    assert (first.status, first.headers[CACHE]) == (200, "miss")
    assert set(parse_timings(first.headers[TIMINGS])) == {"wait", "download", "load"}
    assert int(first.headers[LOADED]) >= 1
    assert EVICTED not in first.headers
    second = served.invoke_model("model-2.tar.gz")
    assert (second.status, second.headers[CACHE]) == (200, "hit")
    assert TIMINGS not in second.headers
    assert second.headers[LOADED] == first.headers[LOADED]


def test_a_model_copied_under_the_prefix_after_start_is_served_at_once(
    served: MultiModelRuntime, roomy: Prefix
) -> None:
    assert served.invoke_model("late.tar.gz").status == 404
    late = write_model(roomy.path, "late.tar.gz")
    reply = served.invoke_model("late.tar.gz")
    assert (reply.status, reply.json()) == (200, expected(late))


def test_twenty_concurrent_first_requests_load_the_model_once(
    served: MultiModelRuntime, roomy: Prefix
) -> None:
    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(lambda _: served.invoke_model("burst.tar.gz"), range(20)))
    assert [reply.status for reply in replies] == [200] * 20
    assert all(reply.json() == expected(roomy.models["burst.tar.gz"]) for reply in replies)
    assert load_counts(served.counter)["burst.tar.gz"] == 1
    reports = [parse_timings(reply.headers.get(TIMINGS, "")) for reply in replies]
    assert sum("load" in report for report in reports) == 1


def test_a_slow_load_does_not_hold_up_models_in_memory(served: MultiModelRuntime) -> None:
    assert served.invoke_model("model-3.tar.gz").status == 200
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(served.invoke_model, "slow.tar.gz")
        deadline = time.monotonic() + 10
        while load_counts(served.counter)["slow.tar.gz"] == 0:  # its model_fn has begun
            assert time.monotonic() < deadline, served.stderr()
            time.sleep(0.01)
        for _ in range(5):
            reply = served.invoke_model("model-3.tar.gz")
            assert (reply.status, reply.headers[CACHE]) == (200, "hit")
        assert not slow.done()  # still loading while the other model answered
        assert slow.result(timeout=30).status == 200


# --- refusals -------------------------------------------------------------------------


def test_a_missing_model_is_404_naming_it(served: MultiModelRuntime) -> None:
    reply = served.invoke_model("Houston_TX.tar.gz")
    assert (reply.status, reply.headers[ERROR]) == (404, "ModelNotFound")
    assert reply.body.startswith(b"ModelNotFound: Could not find model 'Houston_TX.tar.gz' at ")


def test_a_load_that_outlasts_the_wait_is_429_model_not_ready(
    start_mme: Callable[..., MultiModelRuntime], roomy: Prefix
) -> None:
    """The code the gateway turns into ModelNotReadyException (routing/multimodel.py)."""
    impatient = start_mme(roomy.path.as_uri(), SHIPYARD_MODEL_LOAD_WAIT_S="0.2")
    reply = impatient.invoke_model("slow.tar.gz")
    assert (reply.status, reply.headers[ERROR]) == (429, "ModelNotReady")
    assert reply.body.startswith(b"ModelNotReady: ")


@pytest.mark.parametrize("target", ["../x", "/abs", "a/../../b", "x" * 1025])
def test_an_unsafe_target_model_is_400(served: MultiModelRuntime, target: str) -> None:
    reply = served.invoke_model(target)
    assert (reply.status, reply.headers[ERROR]) == (400, "InvalidTargetModel")
    assert reply.body.startswith(b"InvalidTargetModel: TargetModel ")


def test_an_invocation_without_target_model_is_400_naming_the_header(
    served: MultiModelRuntime,
) -> None:
    reply = served.request("POST", "/invocations", b"[[1, 2]]")
    assert (reply.status, reply.headers[ERROR]) == (400, "InvalidTargetModel")
    assert TARGET_MODEL_HEADER.encode() in reply.body


def test_a_model_whose_code_fails_to_load_is_500_with_its_reason(
    served: MultiModelRuntime,
) -> None:
    reply = served.invoke_model("broken.tar.gz")
    assert (reply.status, reply.headers[ERROR]) == (500, "ModelLoadFailed")
    assert b"RuntimeError: weights of broken.tar.gz are missing" in reply.body


def test_a_handler_error_is_answered_as_in_single_model_mode(served: MultiModelRuntime) -> None:
    """The model's own 406, without X-Shipyard-Error: the gateway makes it a ModelError."""
    served.invoke_model("model-0.tar.gz")  # loaded here, whichever tests ran before
    reply = served.invoke_model("model-0.tar.gz", accept="image/png")
    assert reply.status == 406
    assert reply.body.startswith(b"UnsupportedAccept: ")
    assert ERROR not in reply.headers
    assert reply.headers[CACHE] == "hit"


def test_csv_input_reaches_the_model_through_the_default_input_fn(
    served: MultiModelRuntime, roomy: Prefix
) -> None:
    wire = {TARGET_MODEL_HEADER: "model-1.tar.gz", "Content-Type": "text/csv"}
    reply = served.request("POST", "/invocations", b"1,2\n3,-4\n", wire)
    assert (reply.status, reply.json()) == (200, expected(roomy.models["model-1.tar.gz"]))


# --- the /models contract ---------------------------------------------------------------


def test_the_models_contract(served: MultiModelRuntime) -> None:
    url = str(MODELS / "custom_attrs")
    assert served.post_json("/models", {"model_name": "team/attrs", "url": url}).status == 200
    again = served.post_json("/models", {"model_name": "team/attrs", "url": url})
    assert (again.status, again.headers[ERROR]) == (409, "ModelAlreadyLoaded")
    listing = served.request("GET", "/models").json()
    assert {"modelName": "team/attrs", "modelUrl": url} in listing["models"]
    member = "/models/team%2Fattrs"
    described = served.request("GET", member)
    assert described.status == 200
    assert described.json()["modelUrl"] == url
    invoked = served.request(
        "POST", member + "/invoke", b"[1]", {"X-Amzn-SageMaker-Custom-Attributes": "trace=abc"}
    )
    assert (invoked.status, invoked.json()) == (200, [1])
    assert invoked.headers["x-amzn-sagemaker-custom-attributes"] == "echo:trace=abc"
    assert served.invoke_model("team/attrs", [2]).json() == [2]  # the same name, by TargetModel
    deleted = served.request("DELETE", member)
    assert deleted.status == 200 and "unload" in parse_timings(deleted.headers[TIMINGS])
    for method, path in (("GET", member), ("DELETE", member), ("POST", member + "/invoke")):
        reply = served.request(method, path, b"[1]" if method == "POST" else b"")
        assert (reply.status, reply.headers[ERROR]) == (404, "ModelNotLoaded"), (method, path)


def test_a_multi_model_handler_keeps_sessions_through_its_context(
    served: MultiModelRuntime,
) -> None:
    """As in single-model mode: the handler reads the request's session from its
    context, opens one with its own id and expiry, and closes it."""
    url = str(MODELS / "session_context")
    assert served.post_json("/models", {"model_name": "talk", "url": url}).status == 200
    session = "X-Amzn-SageMaker-Session-Id"
    opened = served.request("POST", "/models/talk/invoke", b"{}", {session: "NEW_SESSION"})
    assert opened.status == 200 and opened.json()["seen"] == "NEW_SESSION"
    new = opened.headers["x-amzn-sagemaker-new-session-id"]
    sid, _, expires = new.partition("; Expires=")
    assert sid == opened.json()["opened"] and re.fullmatch(r"\d{4}-.*T.*Z", expires)
    turn = served.request("POST", "/models/talk/invoke", b"{}", {session: sid})
    assert turn.json()["seen"] == sid and "x-amzn-sagemaker-new-session-id" not in turn.headers
    closed = served.request("POST", "/models/talk/invoke", b"close", {session: sid})
    assert closed.headers["x-amzn-sagemaker-closed-session-id"] == sid
    assert served.request("DELETE", "/models/talk").status == 200


def test_post_models_refuses_a_malformed_body_and_a_missing_artifact(
    served: MultiModelRuntime, tmp_path: Path
) -> None:
    bad = served.request("POST", "/models", b'{"model_name": "x"}')
    assert (bad.status, bad.headers[ERROR]) == (400, "BadModelRequest")
    missing = served.post_json("/models", {"model_name": "gone", "url": str(tmp_path / "gone")})
    assert (missing.status, missing.headers[ERROR]) == (404, "ModelNotFound")


def test_get_models_pages(served: MultiModelRuntime) -> None:
    served.invoke_model("model-0.tar.gz")
    served.invoke_model("model-1.tar.gz")
    first = served.request("GET", "/models?page_size=1").json()
    assert isinstance(first, dict) and len(first["models"]) == 1
    rest = served.request("GET", f"/models?next_page_token={first['nextPageToken']}").json()
    assert isinstance(rest, dict) and "nextPageToken" not in rest
    assert first["models"][0] not in rest["models"]
    for query in ("page_size=0", "page_size=x", "next_page_token=-1"):
        refused = served.request("GET", f"/models?{query}")
        assert (refused.status, refused.headers[ERROR]) == (400, "BadModelRequest"), query


# --- memory: eviction, the budget, unloading -------------------------------------------


def test_eviction_under_a_small_budget_and_a_reload_from_the_disk_cache(
    tight: MultiModelRuntime, ballast: Prefix
) -> None:
    """Two 100 MiB models fit in 250 MiB; a third unloads the coldest, which comes back
    later from the disk cache: loaded again, not downloaded again."""
    tight.unload_all()
    tight.invoke_model("big-0.tar.gz")
    tight.invoke_model("big-1.tar.gz")
    third = tight.invoke_model("big-2.tar.gz")
    assert parse_evicted(third.headers[EVICTED]) == ["big-0.tar.gz"]
    assert "unload" in parse_timings(third.headers[TIMINGS])
    assert third.headers[LOADED] == "2"
    again = tight.invoke_model("big-0.tar.gz")
    assert (again.status, again.json()) == (200, expected(ballast.models["big-0.tar.gz"]))
    assert again.headers[CACHE] == "miss"
    assert set(parse_timings(again.headers[TIMINGS])) == {"wait", "load", "unload"}
    assert parse_evicted(again.headers[EVICTED]) == ["big-1.tar.gz"]
    assert load_counts(tight.counter)["big-0.tar.gz"] == 2


def test_a_model_bigger_than_the_budget_is_507(tight: MultiModelRuntime) -> None:
    reply = tight.invoke_model("huge.tar.gz")
    assert (reply.status, reply.headers[ERROR]) == (507, "ModelTooLarge")
    text = reply.body.decode()
    assert "'huge.tar.gz' needs " in text and f"budget of {250 * MIB} bytes" in text
    loaded = tight.request("GET", "/models").json()
    assert "huge.tar.gz" not in json.dumps(loaded)


def test_unloading_a_model_gives_its_memory_back(tight: MultiModelRuntime) -> None:
    tight.unload_all()
    before = tight.rss_bytes()
    assert tight.invoke_model("ballast200.tar.gz").status == 200
    loaded = tight.rss_bytes()
    assert loaded - before > 150 * MIB
    assert tight.request("DELETE", "/models/ballast200.tar.gz").status == 200
    assert loaded - tight.rss_bytes() > 150 * MIB


# --- an s3:// prefix ----------------------------------------------------------------------


def test_an_s3_prefix_is_served(
    start_mme: Callable[..., MultiModelRuntime], bucket: Bucket
) -> None:
    first = linear_model("a.tar.gz")
    bucket.put("models/a.tar.gz", archive_bytes(first))
    runtime = start_mme(f"s3://{bucket.name}/models/", SHIPYARD_S3_ENDPOINT_URL=bucket.endpoint_url)
    assert runtime.invoke_model("a.tar.gz").json() == expected(first)
    assert runtime.invoke_model("b.tar.gz").status == 404
    second = linear_model("b.tar.gz")
    bucket.put("models/b.tar.gz", archive_bytes(second))
    assert runtime.invoke_model("b.tar.gz").json() == expected(second)


def test_a_malformed_setting_is_a_failed_start_naming_it(tmp_path: Path) -> None:
    reason = run_to_exit(
        tmp_path, tmp_path, SAGEMAKER_MULTI_MODEL="true", SHIPYARD_MODEL_CACHE_BYTES="lots"
    )
    assert (
        reason == "ValueError: SHIPYARD_MODEL_CACHE_BYTES must be a number above 0, got 'lots'.\n"
    )
