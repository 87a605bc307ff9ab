"""A framework model's entry point, uploaded apart from the model (SAGEMAKER_SUBMIT_DIRECTORY)
as the sagemaker SDK does: it imports a sibling module and reads the model's own file."""

import json
import os

from scaling import scale


def model_fn(model_dir):
    with open(os.path.join(model_dir, "weights.json")) as f:
        return json.load(f)


def predict_fn(data, model):
    return [scale(sum(row), model["factor"]) for row in data]
