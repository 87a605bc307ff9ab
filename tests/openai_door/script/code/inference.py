"""A scripted stand-in for a language model behind the OpenAI-compatible door: answers
chat completion objects (whole or as JSON Lines chunks) whose content is the chunk
numbers, and fails, stalls or records its generator's end as the request asks."""

import json
import time


def model_fn(model_dir):
    return None


def _chunk(n, finish=None):
    delta = {} if finish else {"content": str(n)}
    return {
        "id": "chatcmpl-script",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "script",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def transform_fn(model, body, content_type, accept):
    request = json.loads(body)
    mode = request.get("mode")
    if mode == "fail":
        raise RuntimeError("the model broke before answering")
    count = int(request.get("count", 3))

    def chunks():
        try:
            for n in range(count):
                if mode == "fail-mid" and n == 2:
                    raise RuntimeError("the model broke mid-stream")
                yield json.dumps(_chunk(n)) + "\n"
                time.sleep(float(request.get("sleep", 0)))
            yield json.dumps(_chunk(count, finish="stop")) + "\n"
        finally:
            marker = request.get("marker")
            if marker:
                with open(marker, "w") as out:
                    out.write("closed")

    if request.get("stream") is True:
        return chunks(), "application/jsonlines"
    if mode == "lazy":  # the whole answer, made a piece at a time (as text generation does)
        return (piece.encode() for piece in chunks()), "application/json"
    content = "".join(str(n) for n in range(count))
    whole = {
        "id": "chatcmpl-script",
        "object": "chat.completion",
        "created": 1,
        "model": request.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1},
        "echo": {k: v for k, v in request.items() if k not in ("messages",)},
    }
    return json.dumps(whole), "application/json"
