"""A model whose predict_fn yields chat chunk objects as dicts: the built-in runtime
encodes each item as JSON, one chunk an item, without a line's end: the door streams one
chunk object per item a generator yields."""

import json


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(request, model):
    words = ["one", " two", " three"]
    if request.get("stream") is not True:
        return {
            "id": "chatcmpl-items",
            "object": "chat.completion",
            "created": 1,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(words)},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
        }

    def chunks():
        for word in words:
            yield {
                "id": "chatcmpl-items",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": request["model"],
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }

    return chunks()
