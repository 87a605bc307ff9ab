"""A pure-Python model that shows, in each answer, the batch it was served in.

Each request is a JSON object. ``predict_batch_fn`` answers every item with
``{"echo": <the request>, "batch_size": <items in this call>, "position": <index>}``, and
appends the batch size to ``BATCH_LOG`` (when set), so a test sees the gathering from
inside the model. ``predict_fn`` answers ``{"echo": ..., "batch_size": null}``: what the
instance does when batching is off. An item may ask to fail:

- ``{"fail": "input"}``: ``input_fn`` raises for it;
- ``{"fail": "item"}``: ``predict_batch_fn`` answers a ValueError for it;
- ``{"fail": "output"}``: ``output_fn`` raises for it;
- ``{"fail": "batch"}``: ``predict_batch_fn`` raises, failing the whole batch.

``{"sleep": s}`` makes the batch (or the single prediction) take ``s`` seconds longer, so
requests pile up behind it.
"""

import json
import os
import time


def input_fn(body, content_type):
    data = json.loads(body)
    if data.get("fail") == "input":
        raise ValueError("input_fn refused this item")
    return data


def predict_fn(data, model):
    time.sleep(data.get("sleep", 0))
    return {"echo": data, "batch_size": None}


def predict_batch_fn(batch, model):
    log = os.environ.get("BATCH_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{len(batch)}\n")
    time.sleep(max((item.get("sleep", 0) for item in batch), default=0))
    if any(item.get("fail") == "batch" for item in batch):
        raise RuntimeError("predict_batch_fn failed the whole batch")
    return [
        ValueError("this item failed")
        if item.get("fail") == "item"
        else {"echo": item, "batch_size": len(batch), "position": n}
        for n, item in enumerate(batch)
    ]


def output_fn(prediction, accept):
    if prediction["echo"].get("fail") == "output":
        raise ValueError("output_fn refused this item")
    return json.dumps(prediction), "application/json"
