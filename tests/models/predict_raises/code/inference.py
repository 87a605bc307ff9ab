"""A model that fails every prediction.

``{"status_code": N}`` raises an exception carrying that ``status_code`` attribute (which
the runtime honours when it is an int in 400..599); any other input raises ValueError.
"""

from typing import Any


class ModelBusy(Exception):
    def __init__(self, message: str, status_code: Any) -> None:
        super().__init__(message)
        self.status_code = status_code


def model_fn(model_dir: str) -> str:
    return "a model"


def predict_fn(data: Any, model: str) -> Any:
    if isinstance(data, dict) and "status_code" in data:
        raise ModelBusy("model busy, try later", data["status_code"])
    raise ValueError("bad input for model")
