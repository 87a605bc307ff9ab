"""A shadow variant's model: records every request it gets, one line each in the file
named by SHADOW_LOG, then sleeps SHADOW_SLEEP_S seconds and answers with the body, or
fails when SHADOW_FAIL is set."""

import os
import time


def model_fn(model_dir):
    return None


def transform_fn(model, body, content_type, accept):
    log = os.environ.get("SHADOW_LOG")
    if log:
        data = body if isinstance(body, bytes) else str(body).encode()
        with open(log, "ab") as out:
            out.write(data.replace(b"\n", b" ") + b"\n")
    time.sleep(float(os.environ.get("SHADOW_SLEEP_S", "0")))
    if os.environ.get("SHADOW_FAIL"):
        raise RuntimeError("the shadow model fails on purpose")
    return body, accept or content_type or "application/json"
