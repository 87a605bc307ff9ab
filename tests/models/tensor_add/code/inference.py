"""A model of the Open Inference Protocol: ``OUTPUT0 = INPUT0 + INPUT1`` and
``OUTPUT1 = INPUT0 - INPUT1``, for any numeric datatype and shape (both the same).

An input named ``FAIL`` makes it raise, to show a model's failure; a ``TEXT`` input
(BYTES) is answered upper-cased as ``UPPER``; a ``SLEEP`` input (seconds) makes it sleep
that long and answer ``SLEPT``, first writing its ``TAG`` (BYTES) to the file
``$TENSOR_STARTED_FILE`` names, if set, so a test knows which requests reached it.
"""

import os
import time
from typing import Any

import numpy as np


def predict_tensors_fn(inputs: dict[str, Any], model: Any) -> dict[str, Any]:
    if "FAIL" in inputs:
        raise RuntimeError("asked to fail")
    if "SLEEP" in inputs:
        started = os.environ.get("TENSOR_STARTED_FILE")
        if started and "TAG" in inputs:
            with open(started, "a") as marker:
                marker.write(inputs["TAG"].ravel()[0].decode() + "\n")
        time.sleep(float(inputs["SLEEP"].ravel()[0]))
        return {"SLEPT": inputs["SLEEP"]}
    if "TEXT" in inputs:
        return {"UPPER": np.vectorize(bytes.upper, otypes=[object])(inputs["TEXT"])}
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": a + b, "OUTPUT1": a - b}
