"""A model of the Open Inference Protocol: ``OUTPUT0 = INPUT0 + INPUT1`` and
``OUTPUT1 = INPUT0 - INPUT1``, for any numeric datatype and shape (both the same).

An input named ``FAIL`` makes it raise, to show a model's failure; a ``TEXT`` input
(BYTES) is answered upper-cased as ``UPPER``.
"""

from typing import Any

import numpy as np


def predict_tensors_fn(inputs: dict[str, Any], model: Any) -> dict[str, Any]:
    if "FAIL" in inputs:
        raise RuntimeError("asked to fail")
    if "TEXT" in inputs:
        return {"UPPER": np.vectorize(bytes.upper, otypes=[object])(inputs["TEXT"])}
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": a + b, "OUTPUT1": a - b}
