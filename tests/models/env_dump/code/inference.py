"""Answers with the instance's whole environment, to see what it was given."""

import json
import os


def transform_fn(model, body, content_type, accept):
    return json.dumps(dict(os.environ)), "application/json"
