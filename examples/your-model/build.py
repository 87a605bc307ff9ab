"""Fit the example model and pack it as SageMaker does: ``model.tar.gz`` holding the
model's files at its root (``model.json``, the fitted weights) and ``code/inference.py``.

    python examples/your-model/build.py            # writes examples/your-model/model.tar.gz
    python examples/your-model/build.py out.tar.gz # or where you say

Point ``ModelDataUrl`` at the archive (a path, ``file://`` or ``s3://`` URI) with the
image ``shipyard/python``. To make it yours, change what ``fit`` learns and what
``code/inference.py`` does with it.
"""

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FEATURES = ["area_m2", "rooms"]
# Sold houses: (area in square metres, rooms) -> price in thousands. They follow 2.5 a
# square metre, 12 a room and 30 on top, so the fit finds those three numbers.
SALES = [
    ((50, 2), 179.0),
    ((65, 3), 228.5),
    ((80, 3), 266.0),
    ((95, 4), 315.5),
    ((120, 4), 378.0),
    ((150, 5), 465.0),
]


def fit() -> dict[str, object]:
    """Least squares: price = weights . features + bias."""
    x = np.array([features for features, _ in SALES], dtype=float)
    y = np.array([price for _, price in SALES])
    solution, *_ = np.linalg.lstsq(np.column_stack([x, np.ones(len(x))]), y, rcond=None)
    return {
        "features": FEATURES,
        "weights": [round(float(w), 6) for w in solution[:-1]],
        "bias": round(float(solution[-1]), 6),
    }


def _no_caches(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in member.name else member


def build(dest: Path) -> Path:
    """Write ``dest`` (a ``.tar.gz``) and return it."""
    model = json.dumps(fit(), indent=2).encode()
    with tarfile.open(dest, "w:gz") as tar:
        info = tarfile.TarInfo("model.json")
        info.size = len(model)
        tar.addfile(info, io.BytesIO(model))
        tar.add(HERE / "code", arcname="code", filter=_no_caches)
    return dest


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "model.tar.gz"
    print(build(target.absolute()))
