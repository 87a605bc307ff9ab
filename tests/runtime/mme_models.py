"""Small numpy linear models under a multi-model prefix, written as SageMaker artifacts.

Each model is ``<prefix>/<name>``: a ``model.tar.gz``-style archive (or, on request, a
folder) holding tests/models/mme/code/inference.py and its own ``linear.json``, so every
model answers differently and counts its loads (see that program's docstring).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROGRAM = Path(__file__).parent.parent / "models" / "mme" / "code" / "inference.py"
COUNTER_ENV = "MME_LOAD_COUNTER_FILE"


@dataclass(frozen=True)
class LinearModel:
    """What a written model answers: ``rows . coef + intercept``."""

    name: str
    coef: tuple[float, ...]
    intercept: float

    def predict(self, rows: Sequence[Sequence[float]]) -> list[float]:
        return [
            self.intercept + sum(x * c for x, c in zip(row, self.coef, strict=True)) for row in rows
        ]


def linear_model(name: str, features: int = 2) -> LinearModel:
    """Coefficients derived from the name: distinct per model, the same every run."""
    seed = zlib.crc32(name.encode())
    coef = tuple(float((seed >> (4 * i)) % 13 - 6) for i in range(features))
    return LinearModel(name, coef, float(seed % 97))


@dataclass(frozen=True)
class Twist:
    """How a model departs from a plain one; written into its linear.json."""

    ballast_mb: int = 0
    """MiB the model holds while loaded, to make its memory measurable."""
    load_sleep_s: float = 0
    """How long its model_fn sleeps: a slow load."""
    fail: bool = False
    """Its model_fn raises."""


def archive_bytes(model: LinearModel, twist: Twist = Twist()) -> bytes:
    """A gzipped tar of the model: ``code/inference.py`` and ``linear.json`` at its root."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for arcname, data in _files(model, twist).items():
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_model(prefix: Path, name: str, *, folder: bool = False, **twist: Any) -> LinearModel:
    """Write the model ``name`` under ``prefix``, atomically, and return what it answers.

    An archive, or a folder if ``folder``; ``twist`` holds Twist's fields. Written beside
    its final name and renamed into place, so a runtime serving the prefix never reads
    half of it.
    """
    model = linear_model(name)
    dest = prefix / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    if folder:
        for arcname, data in _files(model, Twist(**twist)).items():
            (partial / arcname).parent.mkdir(parents=True, exist_ok=True)
            (partial / arcname).write_bytes(data)
    else:
        partial.write_bytes(archive_bytes(model, Twist(**twist)))
    os.replace(partial, dest)
    return model


def write_models(
    prefix: Path, count: int, *, stem: str = "model", **twist: Any
) -> list[LinearModel]:
    """``count`` archives named ``<stem>-<i>.tar.gz``, each with ``twist``."""
    return [write_model(prefix, f"{stem}-{i}.tar.gz", **twist) for i in range(count)]


def load_counts(counter_file: Path) -> Counter[str]:
    """How many times each model was loaded, from the counter file its model_fn appends to."""
    if not counter_file.exists():
        return Counter()
    return Counter(line for line in counter_file.read_text().splitlines() if line)


def _files(model: LinearModel, twist: Twist) -> dict[str, bytes]:
    spec = {"name": model.name, "coef": model.coef, "intercept": model.intercept, **asdict(twist)}
    return {
        "code/inference.py": PROGRAM.read_bytes(),
        "linear.json": json.dumps(spec).encode(),
    }
