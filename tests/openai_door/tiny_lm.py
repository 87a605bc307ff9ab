"""The tiny causal LM of ``examples/tiny-lm/build.py``, built by that script's own
``build``: the tests and ``bench/openai_door.py`` serve the model a reader builds, so the
example cannot drift from what is tested."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tiny-lm" / "build.py"


def _load() -> Callable[..., Path]:
    spec = importlib.util.spec_from_file_location("examples_tiny_lm_build", SCRIPT)
    assert spec is not None and spec.loader is not None, SCRIPT
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built: Callable[..., Path] = module.build
    return built


build = _load()
