"""A base model that takes adapters, as a LoRA-serving program does: each adapter's
folder holds ``adapter.json`` (``{"scale": k}``), and a request for an adapter multiplies
the base model's answer (the sum of its input) by that adapter's scale."""

import json
import os
from pathlib import Path


def model_fn(model_dir):
    return {"adapters": {}}


def load_adapter_fn(model, name, adapter_dir):
    config = json.loads((Path(adapter_dir) / "adapter.json").read_text())
    model["adapters"][name] = float(config["scale"])


def unload_adapter_fn(model, name):
    del model["adapters"][name]


def predict_fn(data, model, context):
    scale = 1.0 if context.adapter is None else model["adapters"][context.adapter]
    return {
        "sum": sum(data) * scale,
        "adapter": context.adapter,
        "loaded": sorted(model["adapters"]),
        "pid": os.getpid(),
    }
