"""A shadow variant's model: records every request it gets, one line each in the file
named by SHADOW_LOG, then sleeps SHADOW_SLEEP_S seconds and answers with the body, or
fails when SHADOW_FAIL is set.

With SHADOW_VIA set, it also writes to that file, per request, ``copies`` when the
runtime invoked it for a ``POST /copies`` (a shadow's copies sent together) and
``invocations`` otherwise, read from the call stack: what tests/e2e/test_shadow.py
checks the gateway chose."""

import os
import sys
import time


def model_fn(model_dir):
    return None


def _via():
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_copy" and code.co_filename.endswith("runtime/server.py"):
            return b"copies"
        frame = frame.f_back
    return b"invocations"


def transform_fn(model, body, content_type, accept):
    log = os.environ.get("SHADOW_LOG")
    if log:
        data = body if isinstance(body, bytes) else str(body).encode()
        with open(log, "ab") as out:
            out.write(data.replace(b"\n", b" ") + b"\n")
    via = os.environ.get("SHADOW_VIA")
    if via:
        with open(via, "ab") as out:
            out.write(_via() + b"\n")
    time.sleep(float(os.environ.get("SHADOW_SLEEP_S", "0")))
    if os.environ.get("SHADOW_FAIL"):
        raise RuntimeError("the shadow model fails on purpose")
    return body, accept or content_type or "application/json"
