"""The container contract, end to end: real runtime processes driven over plain HTTP.

Each fixture model under tests/models/ is started once per module, on a free port, and
stopped by its PID when the module is done.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import post_expecting_continue, wait_until

from shipyard.backends.base import token_pipe

MODELS = Path(__file__).parent.parent / "models"
START_TIMEOUT_S = 20.0


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass
class Runtime:
    """A running instance: its port, its process and the file its stderr goes to."""

    port: int
    process: subprocess.Popen[bytes]
    stderr_path: Path

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            reply_headers = {k.lower(): v for k, v in response.getheaders()}
            return Reply(response.status, reply_headers, response.read())
        finally:
            conn.close()

    def invoke(self, body: bytes, **headers: str) -> Reply:
        names = {"content_type": "Content-Type", "accept": "Accept"}
        wire = {names.get(k, k.replace("_", "-")): v for k, v in headers.items()}
        return self.request("POST", "/invocations", body, wire)

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runtime_argv(model_dir: Path, port: int, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "shipyard.runtime", "--port", str(port)]
    return argv + ["--model-dir", str(model_dir), *extra]


def spawn(
    argv: list[str], env: dict[str, str], stderr_path: Path, *, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """A runtime process started with ``env``, its stderr written to ``stderr_path``."""
    with open(stderr_path, "wb") as stderr:
        return subprocess.Popen(
            argv,
            env=env,
            pass_fds=pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_ready(runtime: Runtime) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if runtime.process.poll() is not None:
            pytest.fail(f"runtime exited with {runtime.process.returncode}:\n{runtime.stderr()}")
        try:
            if runtime.request("GET", "/ping").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.02)
    pytest.fail(f"runtime not ready after {START_TIMEOUT_S}s:\n{runtime.stderr()}")


@pytest.fixture(scope="module")
def start_runtime(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Runtime]]:
    """A factory: ``start_runtime(model_dir, **env)`` returns a ready instance;
    ``adapters_token=`` hands it a component copy's token as the gateway does (a pipe).

    Instances are shared within the module by model dir and environment, and every
    process started is stopped by its PID at the end.
    """
    started: dict[tuple[Path, str | None, tuple[tuple[str, str], ...]], Runtime] = {}
    log_dir = tmp_path_factory.mktemp("runtime-logs")

    def start(model_dir: Path, *, adapters_token: str | None = None, **env: str) -> Runtime:
        key = (model_dir, adapters_token, tuple(sorted(env.items())))
        if key not in started:
            port = free_port()
            stderr_path = log_dir / f"{model_dir.name}-{port}.log"
            argv, fds = runtime_argv(model_dir, port), ()
            if adapters_token is not None:
                fds = (token_pipe(adapters_token),)
                argv += ["--adapters-token-fd", str(fds[0])]
            try:
                process = spawn(argv, {**os.environ, **env}, stderr_path, pass_fds=fds)
            finally:
                for fd in fds:
                    os.close(fd)
            started[key] = Runtime(port, process, stderr_path)
            wait_ready(started[key])
        return started[key]

    try:
        yield start
    finally:
        for runtime in started.values():  # signal all first: each takes ~0.2 s to drain
            if runtime.process.poll() is None:
                runtime.process.terminate()
        for runtime in started.values():
            stop(runtime.process)


@pytest.fixture(scope="module")
def echo(start_runtime: Callable[..., Runtime]) -> Runtime:
    return start_runtime(MODELS / "echo")


@pytest.fixture(scope="module")
def summer(start_runtime: Callable[..., Runtime]) -> Runtime:
    return start_runtime(MODELS / "sum")


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


# --- routes ---------------------------------------------------------------------------


def test_ping_answers_200_with_an_empty_body(echo: Runtime) -> None:
    for method in ("GET", "HEAD"):  # HEAD: a head and nothing after it
        reply = echo.request(method, "/ping")
        assert (reply.status, reply.body) == (200, b"")
        assert reply.headers["content-length"] == "0"


def test_a_client_expecting_100_continue_gets_it_before_it_sends_the_body(
    echo: Runtime,
) -> None:
    head, payload = post_expecting_continue(echo.port, "/invocations", b'{"continued": true}')
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(payload) == {"continued": True}


def test_an_unknown_path_is_404(echo: Runtime) -> None:
    assert echo.request("GET", "/nope").status == 404
    assert echo.request("POST", "/invocations/extra", b"{}").status == 404


def test_a_wrong_method_is_405_with_allow(echo: Runtime) -> None:
    reply = echo.request("GET", "/invocations")
    assert (reply.status, reply.headers["allow"]) == (405, "POST")
    assert echo.request("POST", "/ping", b"").status == 405


# --- defaults -------------------------------------------------------------------------


def test_default_handlers_echo_json(echo: Runtime) -> None:
    payload = {"instances": [[1, 2.5], [3, 4]], "name": "é"}
    reply = echo.invoke(json.dumps(payload).encode(), content_type="application/json")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == payload


def test_missing_content_type_and_accept_mean_json(echo: Runtime) -> None:
    reply = echo.request("POST", "/invocations", b"[1, 2]")
    assert (reply.status, reply.headers["content-type"], reply.json()) == (
        200,
        "application/json",
        [1, 2],
    )


def test_accept_any_means_json(echo: Runtime) -> None:
    reply = echo.invoke(b'{"a": 1}', accept="*/*")
    assert (reply.headers["content-type"], reply.json()) == ("application/json", {"a": 1})


def test_a_large_body_arrives_whole(echo: Runtime) -> None:
    payload = list(range(300_000))
    reply = echo.invoke(json.dumps(payload).encode())
    assert reply.json() == payload


def test_an_unsupported_content_type_is_415(echo: Runtime) -> None:
    reply = echo.invoke(b"hello", content_type="text/plain")
    assert reply.status == 415
    assert reply.headers["content-type"].startswith("text/plain")
    assert reply.body.startswith(b"UnsupportedContentType: Content type 'text/plain'")


def test_an_unsupported_accept_is_406(echo: Runtime) -> None:
    reply = echo.invoke(b"[1]", accept="image/png")
    assert reply.status == 406
    assert reply.body.startswith(b"UnsupportedAccept: Accept 'image/png'")


def test_a_body_that_is_not_json_is_400(echo: Runtime) -> None:
    reply = echo.invoke(b"{not json", content_type="application/json")
    assert reply.status == 400
    assert reply.body.startswith(b"InvalidBody: The body is not valid JSON")


def test_a_model_dir_without_code_uses_every_default(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    runtime = start_runtime(tmp_path)
    assert runtime.invoke(b'{"x": [1, 2]}').json() == {"x": [1, 2]}


# --- a numpy model through the default codecs -----------------------------------------


def test_json_in_json_out(summer: Runtime) -> None:
    reply = summer.invoke(b"[[1, 2], [3, 4.5]]")
    assert (reply.status, reply.json()) == (200, [3.0, 7.5])


def test_a_predictions_dict_keeps_its_shape(summer: Runtime) -> None:
    reply = summer.invoke(b'{"instances": [[1, 2, 3]]}')
    assert reply.json() == {"predictions": [6.0]}


def test_csv_in_csv_out(summer: Runtime) -> None:
    reply = summer.invoke(b"1,2\n3,4.5\n", content_type="text/csv", accept="text/csv")
    assert (reply.status, reply.headers["content-type"]) == (200, "text/csv")
    assert reply.body == b"3.0\n7.5\n"


def test_csv_in_json_out(summer: Runtime) -> None:
    reply = summer.invoke(b"1,1\n2,2", content_type="text/csv; charset=utf-8")
    assert reply.json() == [2.0, 4.0]


def test_npy_in_npy_out(summer: Runtime) -> None:
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    reply = summer.invoke(npy(array), content_type="application/x-npy", accept="application/x-npy")
    assert (reply.status, reply.headers["content-type"]) == (200, "application/x-npy")
    result = np.load(io.BytesIO(reply.body), allow_pickle=False)
    np.testing.assert_array_equal(result, array.sum(axis=1))


def test_the_first_known_accept_type_wins(summer: Runtime) -> None:
    reply = summer.invoke(b"[[1, 2]]", accept="image/png, text/csv;q=0.9, application/json")
    assert (reply.headers["content-type"], reply.body) == ("text/csv", b"3.0\n")


def test_a_bad_csv_body_is_400(summer: Runtime) -> None:
    reply = summer.invoke(b"1,2\nx,y\n", content_type="text/csv")
    assert reply.status == 400
    assert reply.body.startswith(b"InvalidBody: The body is not CSV of numbers")


def test_a_pickled_npy_body_is_refused(summer: Runtime) -> None:
    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    reply = summer.invoke(out.getvalue(), content_type="application/x-npy")
    assert reply.status == 400
    assert reply.body.startswith(b"InvalidBody: The body is not a NPY array")


# --- user handlers --------------------------------------------------------------------


def test_a_handler_that_raises_is_500_with_its_message(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(MODELS / "predict_raises")
    reply = runtime.invoke(b"[1]")
    assert reply.status == 500
    assert reply.headers["content-type"].startswith("text/plain")
    assert reply.body == b"ValueError: bad input for model"
    stderr = runtime.stderr()
    assert "Traceback" in stderr and "ValueError: bad input for model" in stderr
    # one failure does not take the instance down
    assert runtime.request("GET", "/ping").status == 200


@pytest.mark.parametrize(
    ("status_code", "expected"), [(429, 429), (404, 404), (200, 500), (600, 500), ("429", 500)]
)
def test_an_exception_status_code_in_4xx_5xx_is_used(
    start_runtime: Callable[..., Runtime], status_code: object, expected: int
) -> None:
    runtime = start_runtime(MODELS / "predict_raises")
    reply = runtime.invoke(json.dumps({"status_code": status_code}).encode())
    assert (reply.status, reply.body) == (expected, b"ModelBusy: model busy, try later")


def test_custom_attributes_reach_the_handler_and_come_back(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(MODELS / "custom_attrs")
    reply = runtime.invoke(b"[1]", X_Amzn_SageMaker_Custom_Attributes="trace=abc")
    assert reply.status == 200
    assert reply.headers["x-amzn-sagemaker-custom-attributes"] == "echo:trace=abc"
    assert reply.json() == [1]


def test_no_custom_attributes_header_without_one_set(
    start_runtime: Callable[..., Runtime],
) -> None:
    runtime = start_runtime(MODELS / "custom_attrs")
    reply = runtime.invoke(b"[1]")
    assert reply.status == 200
    assert "x-amzn-sagemaker-custom-attributes" not in reply.headers


TRANSFORM_PROGRAM = """
def model_fn(model_dir):
    return str.upper


def transform_fn(model, input_data, content_type, accept, context=None):
    context.response_custom_attributes = "seen"
    text = model(input_data.decode())
    return f"{text}|{content_type}|{accept}", "text/x-shout"
"""


def test_transform_fn_from_sagemaker_program(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    """SAGEMAKER_PROGRAM names the module; its transform_fn replaces the other handlers."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "serve.py").write_text(TRANSFORM_PROGRAM)
    runtime = start_runtime(tmp_path, SAGEMAKER_PROGRAM="serve.py")
    reply = runtime.invoke(b"hello", content_type="text/plain", accept="text/x-shout")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/x-shout"
    assert reply.headers["x-amzn-sagemaker-custom-attributes"] == "seen"
    assert reply.body == b"HELLO|text/plain|text/x-shout"


# --- failing starts -------------------------------------------------------------------


def run_to_exit(model_dir: Path, tmp_path: Path, port: int | None = None, **env: str) -> str:
    """Start a runtime that must fail; return the line it wrote to its error file."""
    error_file = tmp_path / "instance.error"
    argv = runtime_argv(model_dir, port or free_port(), "--error-file", str(error_file))
    process = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _, stderr = process.communicate(timeout=START_TIMEOUT_S)
    finally:
        stop(process)
    assert process.returncode == 1, stderr.decode()
    assert b"Traceback" in stderr
    return error_file.read_text()


def test_a_failing_model_fn_exits_1_with_the_reason(tmp_path: Path) -> None:
    assert run_to_exit(MODELS / "load_fails", tmp_path) == "RuntimeError: weights missing\n"


def test_a_missing_sagemaker_program_is_a_failed_start(tmp_path: Path) -> None:
    reason = run_to_exit(MODELS / "echo", tmp_path, SAGEMAKER_PROGRAM="serve.py")
    assert reason.startswith("FileNotFoundError: SAGEMAKER_PROGRAM serve.py is not in ")


def test_a_missing_model_dir_is_a_failed_start(tmp_path: Path) -> None:
    reason = run_to_exit(tmp_path / "absent", tmp_path)
    assert reason.startswith("FileNotFoundError: The model directory ")


def test_a_taken_port_is_a_failed_start(echo: Runtime, tmp_path: Path) -> None:
    reason = run_to_exit(MODELS / "echo", tmp_path, port=echo.port)
    assert reason.startswith("OSError: [Errno")


def _invoke_in_background(runtime: Runtime, body: bytes) -> tuple[threading.Thread, list[Reply]]:
    replies: list[Reply] = []

    def call() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", runtime.port, timeout=30)
        try:
            conn.request("POST", "/invocations", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            replies.append(Reply(response.status, dict(response.getheaders()), response.read()))
        finally:
            conn.close()

    thread = threading.Thread(target=call)
    thread.start()
    return thread, replies


def test_ping_answers_while_a_long_prediction_runs(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    """The prediction holds the event loop (one worker runs it there); /ping answers."""
    started = tmp_path / "started"
    sleepy = start_runtime(MODELS / "sleepy", SLEEPY_STARTED_FILE=str(started))
    thread, replies = _invoke_in_background(sleepy, b'{"sleep": 3}')
    wait_until(started.exists, "the prediction under way, for 3 s", timeout_s=10)
    assert sleepy.request("GET", "/ping").status == 200
    assert thread.is_alive()  # the ping did not wait for the prediction
    thread.join(30)
    assert replies and replies[0].status == 200
    assert json.loads(replies[0].body)["slept"] == 3


def test_while_a_prediction_holds_the_loop_the_standby_answers_pings_and_passes_on_the_rest(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    started = tmp_path / "started"
    sleepy = start_runtime(MODELS / "sleepy", SLEEPY_STARTED_FILE=str(started))
    long, long_replies = _invoke_in_background(sleepy, b'{"spin": 4, "tag": "long"}')
    wait_until(started.exists, "the prediction under way", timeout_s=10)

    # Busy in Python, not asleep: the standby thread still gets its turn at the GIL.
    for method in ("GET", "HEAD"):
        asked = time.monotonic()
        ping = sleepy.request(method, "/ping")
        assert (ping.status, ping.body) == (200, b"")
        assert time.monotonic() - asked < 2
        assert ping.headers["connection"] == "close"  # the standby's answer, not the loop's
    assert long.is_alive()

    # Any other request that arrives meanwhile is handed to the loop, unread, and served
    # once the long one is done.
    second, second_replies = _invoke_in_background(sleepy, b'{"tag": "second"}')
    for thread in (long, second):
        thread.join(30)
    assert [r.status for r in long_replies + second_replies] == [200, 200]
    assert json.loads(second_replies[0].body)["slept"] == 0
    assert started.read_text().splitlines() == ["started long", "started second"]
    # The loop answers again (the standby may still take a connection that raced the
    # end of the call; a correct answer either way).
    wait_until(
        lambda: "connection" not in sleepy.request("GET", "/ping").headers,
        "a ping answered by the loop",
        timeout_s=5,
    )


def test_model_server_workers_sets_how_many_predictions_run_at_once(
    start_runtime: Callable[..., Runtime],
) -> None:
    for workers, expected in (("1", [b'"alone"', b'"alone"']), ("2", [b'"met"', b'"met"'])):
        runtime = start_runtime(MODELS / "rendezvous", SAGEMAKER_MODEL_SERVER_WORKERS=workers)
        calls = [_invoke_in_background(runtime, b"{}") for _ in range(2)]
        answers = []
        for thread, replies in calls:
            thread.join(30)
            assert replies[0].status == 200
            answers.append(replies[0].body)
        assert answers == expected, workers


def test_adapters_are_registered_invoked_replaced_and_dropped(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    """SageMaker's LoRA container routes: ``model_fn(model_dir, adapter_dir)`` builds
    each adapter's model; a request names it in X-Amzn-SageMaker-Adapter-Identifier."""
    lora = start_runtime(MODELS / "lora", adapters_token="t0ken")
    token = {"X-Shipyard-Adapters-Token": "t0ken"}
    for name, scale in (("x2", 2), ("x3", 3)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter.json").write_text(json.dumps({"scale": scale}))

    def register(name: str, src: str) -> Reply:
        body = json.dumps({"name": name, "src": src}).encode()
        return lora.request(
            "POST", "/adapters", body, {"Content-Type": "application/json", **token}
        )

    def ask(adapter: str | None) -> Reply:
        headers = {"Content-Type": "application/json"}
        if adapter is not None:
            headers["X-Amzn-SageMaker-Adapter-Identifier"] = adapter
        return lora.request("POST", "/invocations", b"[1, 2]", headers)

    assert register("a", str(tmp_path / "x2")).status == 200
    assert ask("a").json() == {"sum": 6.0, "adapter": "a", "pid": lora.process.pid}
    assert ask(None).json()["sum"] == 3.0
    assert register("a", (tmp_path / "x3").as_uri()).status == 200  # replaced
    assert ask("a").json()["sum"] == 9.0

    unknown = ask("b")
    assert unknown.status == 404
    assert unknown.headers["x-shipyard-error"] == "AdapterNotFound"
    failed = register("b", str(tmp_path / "missing"))
    assert failed.status == 424 and failed.headers["x-shipyard-error"] == "AdapterLoadFailed"
    assert ask("b").status == 404  # a failed load registers nothing
    bad = lora.request("POST", "/adapters", b"[1]", token)
    assert bad.status == 400 and bad.headers["x-shipyard-error"] == "InvalidRequest"
    assert lora.request("GET", "/adapters", b"", token).status == 405
    # Only the holder of the copy's token registers or drops adapters.
    body = json.dumps({"name": "c", "src": str(tmp_path / "x2")}).encode()
    assert lora.request("POST", "/adapters", body).status == 403
    wrong = {"X-Shipyard-Adapters-Token": "guess"}
    assert lora.request("DELETE", "/adapters/a", b"", wrong).status == 403
    assert ask("a").status == 200

    assert lora.request("DELETE", "/adapters/a", b"", token).status == 200
    assert ask("a").status == 404
    assert lora.request("DELETE", "/adapters/a", b"", token).status == 404


def test_a_process_that_is_no_components_copy_has_no_adapters_route(echo: Runtime) -> None:
    body = json.dumps({"name": "a", "src": "/"}).encode()
    refused = echo.request("POST", "/adapters", body, {"X-Shipyard-Adapters-Token": ""})
    assert refused.status == 404


def test_a_token_in_the_environment_turns_on_no_adapters_route(
    start_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    """Issue 65: the token travels on a pipe the gateway hands a component's copy alone;
    the variable it once travelled in, set by whoever shares the environment, opens
    nothing."""
    plain = start_runtime(MODELS / "lora", SHIPYARD_ADAPTERS_TOKEN="chosen")
    (tmp_path / "x2").mkdir()
    (tmp_path / "x2" / "adapter.json").write_text(json.dumps({"scale": 2}))
    body = json.dumps({"name": "a", "src": str(tmp_path / "x2")}).encode()
    headers = {"Content-Type": "application/json", "X-Shipyard-Adapters-Token": "chosen"}
    assert plain.request("POST", "/adapters", body, headers).status == 404
    assert plain.invoke(b"[1, 2]", content_type="application/json").status == 200
