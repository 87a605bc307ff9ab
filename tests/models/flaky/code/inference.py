"""A model that fails on demand: ``{"fail": true}`` fails with a 500, and with
``FAIL_PERCENT`` in its Environment that share of its requests fail (spread evenly over
its requests by their running number: deterministic, not random)."""

import itertools
import os
from typing import Any

_PERCENT = int(os.environ.get("FAIL_PERCENT", "0"))
_COUNT = itertools.count()


class Failed(Exception):
    status_code = 500


def model_fn(model_dir: str) -> str:
    refuse = os.environ.get("FAIL_LOAD_IF")  # a file that, once it exists, fails loads
    if refuse and os.path.exists(refuse):
        raise RuntimeError(f"{refuse} exists: this model refuses to load")
    return os.environ.get("MODEL_LABEL", "flaky")


def predict_fn(data: Any, model: str) -> Any:
    n = next(_COUNT)
    if (isinstance(data, dict) and data.get("fail")) or (n * _PERCENT) % 100 + _PERCENT > 99:
        raise Failed(f"{model} failed request {n}")
    return {"model": model, "n": n}
