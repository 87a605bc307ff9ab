"""Streams its answer: predict_fn returns a generator, one chunk per item.

The request (JSON) says how: "chunks" items ("chunk <n>\n", or "size" bytes each), a
"gap_s" sleep before each one after the first, "fail_after" to raise once that many are
out, "fail_first" to raise before any, "forever" to never end. "events" names a file
where each chunk and the generator's end are noted, so a test sees what the model did.
"""

import json
import time


def model_fn(model_dir):
    return None


def input_fn(body, content_type):
    return json.loads(body or b"{}")


def predict_fn(request, model, context):
    if request.get("fail_first"):
        raise ValueError("refused before the first chunk")
    context.response_custom_attributes = "streamed=yes"
    return _chunks(request)


def _chunks(request):
    count = int(request.get("chunks", 3))
    gap_s = float(request.get("gap_s", 0))
    fail_after = request.get("fail_after")
    size = request.get("size")
    block = b"x" * int(size) if size else None
    n = 0
    try:
        while request.get("forever") or n < count:
            if n and gap_s:
                time.sleep(gap_s)
            if fail_after is not None and n == fail_after:
                raise RuntimeError(f"the model broke after {n} chunks")
            yield block if block is not None else f"chunk {n}\n"
            n += 1
            _note(request, f"chunk {n}")
    finally:
        _note(request, "closed")


def _note(request, line):
    events = request.get("events")
    if events:
        with open(events, "a") as out:
            out.write(line + "\n")
