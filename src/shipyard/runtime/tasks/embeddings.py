"""``SHIPYARD_TASK=embeddings``: a sentence-transformers model in OpenAI's embeddings
schema.

The model folder is what sentence-transformers' ``save_pretrained`` writes: its
``modules.json`` says how token vectors become one sentence vector (pooling,
normalisation), and ``SentenceTransformer`` loads it offline and applies them. A body is
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
    """The loaded sentence-transformers model and what an answer needs of it."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.dimension = int(encoder.get_embedding_dimension())
        self.max_tokens = int(encoder.max_seq_length or self.tokenizer.model_max_length)
        """Tokens of a text the model embeds (the rest is cut, and not counted)."""
        self.normalizes = any(type(module).__name__ == "Normalize" for module in encoder)

    def __repr__(self) -> str:
        return f"Model({type(self.encoder).__name__}, dimension={self.dimension})"


def load(model_dir: Path) -> Model:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
    from sentence_transformers import SentenceTransformer

    return Model(SentenceTransformer(str(model_dir), device="cpu", local_files_only=True))


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
    vectors = model.encoder.encode(texts, batch_size=_FORWARD_BATCH, convert_to_numpy=True)
    counts = (
        model.tokenizer(texts, truncation=True, max_length=model.max_tokens)["input_ids"]
        if texts
        else []
    )
    at = 0
    for n, request in enumerate(requests):
        if answers[n] is not _PENDING:
            continue
        size = len(request.texts)
        rows = vectors[at : at + size]
        tokens = sum(len(c) for c in counts[at : at + size])
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
