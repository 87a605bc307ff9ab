"""Works until its client goes: ``context.cancelled`` checked every 10 ms, for at most
"work_s" seconds (20 by default).

The request (JSON) names the files where the handler notes what it did, each written
with the path shipyard was imported from (so a test can tell which runtime serves it):
"started" when the work begins, "cancelled" once it sees ``context.cancelled``. With
"stream", predict_fn returns a generator instead: one chunk, then the same work, then a
second chunk; its ``finally`` notes "closed".
"""

import json
import time

import shipyard


def model_fn(model_dir):
    return None


def input_fn(body, content_type):
    return json.loads(body or b"{}")


def predict_fn(request, model, context):
    if request.get("stream"):
        return _chunks(request, context)
    return {"cancelled": _work(request, context)}


def _work(request, context):
    """Whether the client went before the work was done."""
    _note(request.get("started"))
    until = time.monotonic() + float(request.get("work_s", 20))
    while time.monotonic() < until:
        if context.cancelled:
            _note(request.get("cancelled"))
            return True
        time.sleep(0.01)
    return False


def _chunks(request, context):
    try:
        yield "first\n"
        _work(request, context)
        yield "second\n"
    finally:
        _note(request.get("closed"))


def _note(path):
    if path:
        with open(path, "a") as out:
            out.write(shipyard.__file__ + "\n")
