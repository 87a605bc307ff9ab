"""Answers one line per input line, so batch transform can be checked record by record.

CSV (text/csv): each line "a,b,..." -> the sum of its numbers. JSON Lines
(application/jsonlines): each {"x": [..]} or [..] -> {"sum": s}. A line holding "boom"
makes the whole request fail with a 500, as a model that cannot score a record does.
RecordIO and TFRecord bodies are answered with their length in bytes.
"""

import json
import os


def model_fn(model_dir):
    return os.getpid()


def _sum(line, content_type):
    if "json" in (content_type or ""):
        value = json.loads(line)
        numbers = value.get("x", []) if isinstance(value, dict) else value
        return json.dumps({"sum": sum(numbers)})
    return str(sum(float(cell) for cell in line.split(",") if cell.strip()))


def transform_fn(model, body, content_type, accept):
    if content_type in ("application/x-recordio", "application/x-tfrecord"):
        return str(len(body)), "text/plain"  # framed binary records: say how long
    text = body.decode() if isinstance(body, bytes) else body
    if "boom" in text:
        raise ValueError("cannot score a record holding boom")
    lines = [line for line in text.split("\n") if line.strip()]
    answer = "\n".join(_sum(line, content_type) for line in lines)
    return answer, accept or content_type or "text/csv"
