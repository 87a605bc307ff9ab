"""One step of an inference pipeline, configured by its container's Environment.

Answers the request body with ``|<STAGE_NAME>(<content type>;<accept>)`` appended, as
``STAGE_OUT_TYPE`` (default ``text/plain``), so a test reads which steps ran, in which
order, and what each was sent. A body containing ``fail:<STAGE_NAME>`` makes this step
fail; one containing ``exit:<STAGE_NAME>`` ends its process.
"""

import os


def model_fn(model_dir):
    return os.environ.get("STAGE_NAME", "stage")


def transform_fn(name, body, content_type, accept):
    if f"fail:{name}".encode() in body:
        raise ValueError(f"step {name} refuses this input")
    if f"exit:{name}".encode() in body:
        os._exit(3)
    out = body + f"|{name}({content_type};{accept})".encode()
    return out, os.environ.get("STAGE_OUT_TYPE", "text/plain")
