"""Streams both ways: stream_fn echoes each part as it comes.

A part "fail" raises (a ModelStreamError for the client); "notes:<path>" names a file
where the generator's end is written ("closed"), so a test sees what the model did;
"twice:<x>" answers <x> twice. With GREETING in the environment, the model says it
before reading any part. InvokeEndpoint answers its body back.
"""

import os


def model_fn(model_dir):
    return None


def predict_fn(data, model):
    return data


def stream_fn(parts, model):
    notes = None
    try:
        greeting = os.environ.get("GREETING")
        if greeting:
            yield greeting
        for part in parts:
            if part == "fail":
                raise RuntimeError("asked to fail")
            if isinstance(part, str) and part.startswith("notes:"):
                notes = part[len("notes:") :]
                yield "noted"
                continue
            if isinstance(part, str) and part.startswith("twice:"):
                yield part[len("twice:") :]
                yield part[len("twice:") :]
                continue
            yield part
    finally:
        if notes:
            with open(notes, "a") as out:
                out.write("closed\n")
