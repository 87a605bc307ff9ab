"""A base model that takes adapters as a LoRA-serving program does: ``model_fn`` gets an
adapter's folder as its second argument and returns the adapted model. An adapter's
folder holds ``adapter.json`` (``{"scale": k}``); the adapted model multiplies the base
model's answer (the sum of its input) by k."""

import json
import os
from pathlib import Path


def model_fn(model_dir, adapter_dir=None):
    if adapter_dir is None:
        return {"scale": 1.0}
    config = json.loads((Path(adapter_dir) / "adapter.json").read_text())
    return {"scale": float(config["scale"])}


def predict_fn(data, model, context):
    return {"sum": sum(data) * model["scale"], "adapter": context.adapter, "pid": os.getpid()}
