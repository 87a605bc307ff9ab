"""A house-price model: a linear regression whose weights ``build.py`` fitted and wrote to
``model.json``, served with SageMaker's inference-toolkit handlers.

A request is rows of ``[area in square metres, rooms]``, as JSON
(``{"instances": [[70, 3]]}`` or ``[[70, 3]]``) or CSV (``70,3`` a line); the answer is
one price (in thousands) a row, as ``{"predictions": [...]}`` or CSV when ``Accept`` asks
for ``text/csv``. Plain Python: the model folder needs no package beyond shipyard.
"""

import json
from pathlib import Path


def model_fn(model_dir):
    # model_dir is the unpacked model.tar.gz: build.py put model.json at its root.
    return json.loads((Path(model_dir) / "model.json").read_text())


def input_fn(body, content_type):
    if content_type.startswith("text/csv"):
        rows = [line.split(",") for line in body.decode().splitlines() if line.strip()]
    elif content_type.startswith("application/json"):
        data = json.loads(body)
        rows = data["instances"] if isinstance(data, dict) else data
    else:
        raise ValueError(f"Send application/json or text/csv, not {content_type}.")
    return [[float(value) for value in row] for row in rows]


def predict_fn(rows, model):
    weights, bias = model["weights"], model["bias"]
    predictions = []
    for row in rows:
        if len(row) != len(weights):
            raise ValueError(f"Each row is {model['features']}; got {row}.")
        predictions.append(round(sum(w * x for w, x in zip(weights, row, strict=True)) + bias, 2))
    return predictions


def output_fn(predictions, accept):
    if accept.startswith("text/csv"):
        return "".join(f"{p}\n" for p in predictions), "text/csv"
    return json.dumps({"predictions": predictions}), "application/json"
