"""``SHIPYARD_TASK=embeddings``: a sentence-transformers model in OpenAI's embeddings
schema.

The model folder is what sentence-transformers' ``save_pretrained`` writes: its
``modules.json`` says how token vectors become one sentence vector (pooling, a dense
layer, normalisation), and ``load`` runs that pipeline offline with ``transformers``. A body is
``{"input": text | [texts], "encoding_format": "float" |
"base64", "dimensions": k}``; the answer is an embeddings ``list`` object with usage.

With ``SHIPYARD_MAX_BATCH_SIZE`` the runtime's batcher (runtime/batching.py) gathers
concurrent requests, and ``predict_batch_fn`` embeds all their inputs together, 32 texts
a forward pass. A text longer than the model's ``max_seq_length`` is cut to it (as
sentence-transformers does), and ``usage`` counts the tokens embedded.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from shipyard.runtime.tasks import schema
from shipyard.runtime.tasks.schema import InvalidRequest

_MEAN = "mean pooling"
"""The pooling of a plain transformers folder (no modules.json), as sentence-transformers
pools one."""
_MEAN_CONFIG = {"pooling_mode_mean_tokens": True}
_MAX_INPUTS = 2048
_FORWARD_BATCH = 32
"""Texts per forward pass: a runtime batch of many requests (each up to 2,048 inputs) is
embedded 32 at a time, so its memory stays that of 32 texts."""


class Embedding(NamedTuple):
    """One request, read: its texts and how to answer them."""

    texts: list[str]
    model: str
    base64: bool
    dimensions: int | None


class Model:
    """A sentence-transformers folder run with ``transformers`` alone (see ``load``)."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        modules = _modules(folder)
        kinds = [kind for kind, _ in modules]
        if not kinds or kinds[0] != "Transformer":
            raise ValueError(
                f"{folder}/modules.json: the first module must be a Transformer, got {kinds[:1]}."
            )
        body = modules[0][1]
        self.tokenizer = AutoTokenizer.from_pretrained(str(body), local_files_only=True)
        self.encoder = AutoModel.from_pretrained(str(body), local_files_only=True).eval()
        settings = _json(body / "sentence_bert_config.json")
        self.max_tokens = int(
            settings.get("max_seq_length") or min(self.tokenizer.model_max_length, 512)
        )
        """Tokens of a text the model embeds (the rest is cut, and not counted)."""
        self.steps: list[Any] = []
        dimension = int(self.encoder.config.hidden_size)
        for kind, path in modules[1:]:
            if kind in ("Pooling", _MEAN):
                config = _json(path / "config.json") if kind == "Pooling" else _MEAN_CONFIG
                pooling = _Pooling(config)
                dimension *= len(pooling.modes)
                self.steps.append(pooling)
            elif kind == "Dense":
                dense = _Dense(path, torch)
                dimension = dense.out_features
                self.steps.append(dense)
            elif kind == "Normalize":
                self.steps.append(_normalize)
            else:
                raise ValueError(
                    f"{folder}/modules.json names a {kind} module, which shipyard's embeddings "
                    "handler does not run (Transformer, Pooling, Dense and Normalize)."
                )
        self.dimension = dimension
        self.normalizes = _normalize in self.steps

    def __repr__(self) -> str:
        return f"Model({type(self.encoder).__name__}, dimension={self.dimension})"

    def encode(self, texts: list[str]) -> tuple[Any, list[int]]:
        """The texts' embeddings (a numpy array, a row each) and their token counts,
        ``_FORWARD_BATCH`` texts a forward pass."""
        import numpy

        torch = self.torch
        rows: list[Any] = []
        counts: list[int] = []
        with torch.inference_mode():
            for start in range(0, len(texts), _FORWARD_BATCH):
                features = self.tokenizer(
                    texts[start : start + _FORWARD_BATCH],
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                )
                mask = features["attention_mask"]
                vectors = self.encoder(**features).last_hidden_state
                for step in self.steps:
                    vectors = step(vectors, mask)
                rows.append(vectors.float().numpy())
                counts += [int(n) for n in mask.sum(dim=1)]
        if not rows:
            return numpy.zeros((0, self.dimension), dtype="float32"), []
        return numpy.concatenate(rows), counts


_RENAMED = {"mean_sqrt_len_tokens": "mean_sqrt_len"}


class _Pooling:
    """sentence-transformers' Pooling module: token vectors to one, by the modes its
    ``config.json`` turns on, concatenated in sentence-transformers' order."""

    _ORDER = (
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
        ("pooling_mode_weightedmean_tokens", "weightedmean"),
        ("pooling_mode_lasttoken", "lasttoken"),
    )

    def __init__(self, config: dict[str, Any]) -> None:
        named = config.get("pooling_mode")  # newer folders name the modes; older set flags
        if named is not None:
            wanted = {named} if isinstance(named, str) else set(named)
            wanted = {_RENAMED.get(mode, mode) for mode in wanted}
            self.modes = [mode for _, mode in self._ORDER if mode in wanted]
            unknown = wanted - set(self.modes)
            if unknown:
                raise ValueError(f"the Pooling module's mode {sorted(unknown)} is not supported.")
        else:
            self.modes = [mode for key, mode in self._ORDER if config.get(key)]
        if not self.modes:
            raise ValueError("the Pooling module's config.json turns on no pooling mode.")

    def __call__(self, tokens: Any, mask: Any) -> Any:
        import torch

        weights = mask.unsqueeze(-1).to(tokens.dtype)
        count = weights.sum(dim=1).clamp(min=1e-9)
        out = []
        for mode in self.modes:
            if mode == "cls":
                out.append(tokens[:, 0])
            elif mode == "max":
                out.append(tokens.masked_fill(weights == 0, float("-inf")).max(dim=1).values)
            elif mode == "mean":
                out.append((tokens * weights).sum(dim=1) / count)
            elif mode == "mean_sqrt_len":
                out.append((tokens * weights).sum(dim=1) / count.sqrt())
            elif mode == "weightedmean":
                positions = torch.arange(1, tokens.shape[1] + 1, dtype=tokens.dtype)
                weighted = weights * positions.view(1, -1, 1)
                out.append((tokens * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
            else:  # lasttoken: the tokenizer pads on the right
                last = (mask.sum(dim=1) - 1).clamp(min=0)
                out.append(tokens[torch.arange(tokens.shape[0]), last])
        return torch.cat(out, dim=-1)


class _Dense:
    """sentence-transformers' Dense module: a linear layer and its activation."""

    def __init__(self, path: Path, torch: Any) -> None:
        config = _json(path / "config.json")
        self.out_features = int(config["out_features"])
        self.linear = torch.nn.Linear(
            int(config["in_features"]), self.out_features, bias=bool(config.get("bias", True))
        )
        weights = path / "model.safetensors"
        if weights.is_file():
            from safetensors.torch import load_file

            state = load_file(str(weights))
        else:
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        self.linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
        activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
        name = activation.rsplit(".", 1)[-1]
        if name not in ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid"):
            raise ValueError(f"{path}/config.json: activation {activation} is not supported.")
        self.activation = getattr(torch.nn, name)()

    def __call__(self, vectors: Any, mask: Any) -> Any:
        return self.activation(self.linear(vectors))


def _normalize(vectors: Any, mask: Any) -> Any:
    from torch.nn.functional import normalize

    return normalize(vectors, p=2, dim=1)


def _modules(folder: Path) -> list[tuple[str, Path]]:
    """The modules ``modules.json`` lists, by kind and folder; a folder without one is a
    plain ``transformers`` model, pooled by its mean as sentence-transformers does."""
    if not (folder / "modules.json").is_file():
        return [("Transformer", folder), (_MEAN, folder)]
    listed = _json(folder / "modules.json")
    return [(str(m["type"]).rsplit(".", 1)[-1], folder / str(m.get("path", ""))) for m in listed]


def _json(path: Path) -> Any:
    """A folder's JSON file; an empty object when the folder has none."""
    return json.loads(path.read_text()) if path.is_file() else {}


def load(model_dir: Path) -> Model:
    """The sentence-transformers folder in ``model_dir``, loaded offline.

    Run with ``transformers`` and ``torch`` alone rather than the sentence-transformers
    library: a ready handler needs only ``torch`` and ``transformers``. What runs is the
    pipeline ``modules.json`` lists (Transformer, Pooling, Dense, Normalize), as
    sentence-transformers runs it; the tests hold the vectors to that library's.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
    return Model(model_dir)


def input_fn(data: bytes, content_type: str) -> Embedding:
    request = schema.body(data)
    texts = _texts(request.get("input"))
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64", None):
        raise InvalidRequest('encoding_format: expected "float" or "base64".')
    dimensions = schema.integer(request, "dimensions", None, low=1, high=1 << 16)
    model = request.get("model")
    return Embedding(
        texts, model if isinstance(model, str) else "", encoding == "base64", dimensions
    )


def predict_fn(request: Embedding, model: Model) -> tuple[Embedding, Any, int]:
    answer = predict_batch_fn([request], model)[0]
    if isinstance(answer, Exception):
        raise answer
    return answer


def predict_batch_fn(
    requests: list[Embedding], model: Model
) -> list[tuple[Embedding, Any, int] | Exception]:
    """Every request's texts embedded in one ``encode``, split back per request."""
    answers: list[tuple[Embedding, Any, int] | Exception] = []
    texts: list[str] = []
    for request in requests:
        if request.dimensions is not None and request.dimensions > model.dimension:
            answers.append(
                InvalidRequest(
                    f"dimensions: this model's embeddings have {model.dimension}; "
                    f"{request.dimensions} is more."
                )
            )
            continue
        texts += request.texts
        answers.append(_PENDING)
    vectors, counts = model.encode(texts)
    at = 0
    for n, request in enumerate(requests):
        if answers[n] is not _PENDING:
            continue
        size = len(request.texts)
        rows = vectors[at : at + size]
        tokens = sum(counts[at : at + size])
        at += size
        if request.dimensions is not None and request.dimensions < model.dimension:
            rows = rows[:, : request.dimensions]
            if model.normalizes:  # a shortened unit vector is made one again
                norms = (rows**2).sum(axis=1, keepdims=True) ** 0.5
                rows = rows / norms.clip(min=1e-12)
        answers[n] = (request, rows, tokens)
    return answers


_PENDING: Any = object()


def output_fn(prediction: tuple[Embedding, Any, int], accept: str) -> tuple[bytes, str]:
    request, rows, tokens = prediction
    data = []
    for index, row in enumerate(rows):
        if request.base64:
            values = row.astype("<f4").tobytes()
            embedding: Any = base64.b64encode(values).decode()
        else:
            embedding = row.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    answer = {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json.dumps(answer).encode(), "application/json"


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("input: an empty string; send some text.")
        return [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("input: expected a string or a non-empty list of strings.")
    if len(value) > _MAX_INPUTS:
        raise InvalidRequest(f"input: at most {_MAX_INPUTS} inputs in one request.")
    if all(isinstance(v, str) and v for v in value):
        return list(value)
    raise InvalidRequest(
        "input: expected non-empty strings (token ids are not supported by shipyard's "
        "embeddings handler)."
    )
