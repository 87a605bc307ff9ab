"""The text generation handler in this process (runtime/tasks/generation.py): requests
arriving together decoded together, a closed stream cancelling its sequences, stop
sequences held back until they cannot begin one. The tiny LM of tiny_lm.py."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

MISSING = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed"),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from shipyard.runtime.tasks import generation
    from tests.openai_door.tiny_lm import build

    folder = build(tmp_path_factory.mktemp("tiny") / "model")
    yield generation.load(folder, max_batch_size=4, max_delay_s=0.2)


def ask(engine: Any, **request: Any) -> Any:
    from shipyard.runtime.tasks import generation

    body = json.dumps({"model": "tiny", **request}).encode()
    answer, kind = generation.transform_fn(engine, body, "application/json", "application/json")
    if request.get("stream") is True:
        return answer, kind
    return b"".join(answer), kind  # the whole answer comes as an iterator too


def text_of(engine: Any, prompt: str, max_tokens: int = 12) -> str:
    answer, _ = ask(engine, prompt=prompt, temperature=0, max_tokens=max_tokens)
    return str(json.loads(answer)["choices"][0]["text"])


def test_requests_arriving_together_are_decoded_together(engine: Any) -> None:
    prompts = ["The quick", "A cat sits on the", "Hello", "The ocean is deep and"]
    alone = [text_of(engine, p) for p in prompts]
    assert set(list(engine.waves)[-4:]) == {1}
    start = threading.Barrier(len(prompts))

    def together(prompt: str) -> str:
        start.wait()
        return text_of(engine, prompt)

    waves, joined = len(engine.waves), engine.joined
    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(together, prompts)) == alone
    # one batch: a wave for the first, the rest gathered into it or joining it
    assert len(engine.waves) == waves + 1
    assert engine.waves[-1] + engine.joined - joined == 4


def test_n_choices_stay_in_one_wave(engine: Any) -> None:
    answer, _ = ask(engine, prompt="The cat", temperature=0, max_tokens=5, n=6)
    choices = json.loads(answer)["choices"]
    assert len({c["text"] for c in choices}) == 1 and len(choices) == 6
    assert engine.waves[-1] == 6  # more than the batch size: a request is not split


def test_closing_a_stream_cancels_its_sequences(engine: Any) -> None:
    stream, kind = ask(engine, prompt="The cat", temperature=0, max_tokens=80, stream=True)
    assert kind == "application/jsonlines"
    assert json.loads(next(stream))["choices"][0]["finish_reason"] is None
    stream.close()
    # the engine drops the cancelled sequence and goes on with the next request
    assert text_of(engine, "Hello", 3)


def test_the_stop_sequence_is_never_sent(engine: Any) -> None:
    full = text_of(engine, "Hello", 30)
    stop = full[8:12]
    assert stop and full.find(stop) >= 4
    stream, _ = ask(engine, prompt="Hello", temperature=0, max_tokens=30, stop=stop, stream=True)
    chunks = [json.loads(line)["choices"][0] for line in stream]
    sent = "".join(c["text"] for c in chunks)
    assert sent == full[: full.find(stop)]
    assert chunks[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [
        ("hello wor", ("world",), 3),
        ("hello", ("world",), 0),
        ("abcab", ("abc", "bx"), 2),
        ("ab", ("abc",), 2),
    ],
)
def test_held_back_is_the_longest_start_of_a_stop(text: str, stops: Any, held: int) -> None:
    from shipyard.runtime.tasks.generation import _held

    assert _held(text, stops) == held


def test_refusals_name_the_parameter(engine: Any) -> None:
    from shipyard.runtime.tasks.schema import InvalidRequest

    cases = [
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ({"prompt": "x", "n": 0}, "n:"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x", "logit_bias": {"999999": 1}}, "logit_bias"),
        ({"prompt": [[1, 2], "x"]}, "prompt"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json"}},
         "response_format"),
        ({"input": "x"}, "messages"),
        ({"prompt": "x " * 200}, "context"),
        ({"prompt": ["x"] * 9, "n": 2}, "sequences"),
        ({"prompt": "x", "stop": "y" * 257}, "256 characters"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": {}}]}]},
         "must be a string"),
    ]  # fmt: skip
    for request, named in cases:
        with pytest.raises(InvalidRequest, match=named):
            ask(engine, **request)


def test_a_model_without_a_chat_template_still_completes(tmp_path: Path) -> None:
    from shipyard.runtime.tasks import generation
    from shipyard.runtime.tasks.schema import InvalidRequest
    from tests.openai_door.tiny_lm import build

    folder = build(tmp_path / "model")
    (folder / "chat_template.jinja").unlink()
    plain = generation.load(folder, max_batch_size=1, max_delay_s=0)
    with pytest.raises(InvalidRequest, match="no chat template"):
        ask(plain, messages=[{"role": "user", "content": "hi"}])
    answer = json.loads(ask(plain, prompt="Hello", temperature=0, max_tokens=2)[0])
    assert answer["object"] == "text_completion" and answer["usage"]["prompt_tokens"] > 0


def test_a_request_joins_a_batch_already_decoding(engine: Any) -> None:
    long_alone = text_of(engine, "The quick", 60)
    short_alone = text_of(engine, "A cat sits on the mat and", 8)
    joined = engine.joined
    steps = 0
    decoding = threading.Event()

    def hold(module: Any, args: Any) -> None:
        # The first request's third forward pass waits for the second to be submitted,
        # which the test does once the first is decoding: the second arrives
        # mid-decoding however fast or slow this machine is.
        nonlocal steps
        steps += 1
        if steps == 2:
            decoding.set()
        if steps == 3:
            deadline = time.monotonic() + 10
            while not engine._waiting and engine.joined == joined:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)

    handle = engine.model.register_forward_pre_hook(hold)
    try:
        stream, _ = ask(engine, prompt="The quick", temperature=0, max_tokens=60, stream=True)
        assert decoding.wait(10)
        # it joins at the next step, answers as it would alone, and the first goes on
        # undisturbed
        assert text_of(engine, "A cat sits on the mat and", 8) == short_alone
    finally:
        handle.remove()
    assert engine.joined == joined + 1
    sent = [json.loads(line)["choices"][0]["text"] for line in stream]
    assert "".join(sent) == long_alone


def test_a_vanishing_temperature_decodes_greedily(engine: Any) -> None:
    greedy = text_of(engine, "Hello", 10)
    answer, _ = ask(engine, prompt="Hello", temperature=1e-300, max_tokens=10)
    assert json.loads(answer)["choices"][0]["text"] == greedy
