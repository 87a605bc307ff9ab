"""A linear model, one per archive under a multi-model prefix (see tests/runtime/mme_models.py).

Each archive carries this program and its own ``linear.json``: ``name``, ``coef``,
``intercept``, and optionally ``ballast_mb`` (memory held by the model, to make it
measurable), ``load_sleep_s`` (a slow load) and ``fail`` (model_fn raises). Every load
appends the model's name as one line to the file named by ``MME_LOAD_COUNTER_FILE``, so
tests count the loads of each model.

``[[x1, x2, ...], ...]`` is answered with ``{"model": name, "predictions": [x . coef +
intercept, ...]}``.
"""

import json
import os
import time
from pathlib import Path

import numpy as np


class Linear:
    def __init__(self, spec, ballast):
        self.name = spec["name"]
        self.coef = np.asarray(spec["coef"], dtype=float)
        self.intercept = float(spec["intercept"])
        self.ballast = ballast

    def predict(self, data):
        rows = np.asarray(data, dtype=float)
        return {"model": self.name, "predictions": rows @ self.coef + self.intercept}


def model_fn(model_dir):
    spec = json.loads((Path(model_dir) / "linear.json").read_text())
    counter = os.environ.get("MME_LOAD_COUNTER_FILE")
    if counter:  # first, so a test sees a slow load under way
        with open(counter, "a") as out:
            out.write(spec["name"] + "\n")
    time.sleep(float(spec.get("load_sleep_s", 0)))
    if spec.get("fail"):
        raise RuntimeError(f"weights of {spec['name']} are missing")
    # np.ones writes every page, so the ballast is resident (np.zeros would not be).
    ballast = np.ones(int(spec.get("ballast_mb", 0)) << 20, dtype=np.uint8)
    return Linear(spec, ballast)
