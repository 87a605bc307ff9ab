"""Its process dies under the first request that names a marker file not there yet (and
makes it), then answers every request with its body: an instance lost mid-request."""

import json
import os


def model_fn(model_dir):
    return None


def transform_fn(model, body, content_type, accept):
    marker = json.loads(body).get("marker")
    if marker and not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os._exit(1)
    return body, "application/json"
