"""Turns a folder into a link while it answers: what a job that writes a folder under a
root can do between the gateway's check of an output location and its write there.

The request is ``{"link": path, "to": target}``; ``path``'s folder is made if missing
and ``path`` becomes a link to ``target``. Answers ``"linked"``.
"""

import json
import os


def transform_fn(model, body, content_type, accept):
    order = json.loads(body)
    os.makedirs(os.path.dirname(order["link"]), exist_ok=True)
    os.symlink(order["to"], order["link"], target_is_directory=True)
    return '"linked"', "application/json"
