"""A processing script that reports what it can see: /opt/ml, a file beside the roots,
the gateway's home."""

import json
import os
from pathlib import Path


def readable(path: str) -> bool:
    try:
        Path(path).read_bytes()
    except OSError:
        return False
    return True


report = {
    "data": Path("/opt/ml/processing/input/data/inside.txt").read_text(),
    "secret": readable(os.environ["SM_SECRET"]),
    "store": readable(os.environ["SM_STORE"]),
    "uid": os.getuid(),
}
out = Path("/opt/ml/processing/output/report")
out.mkdir(parents=True, exist_ok=True)
(out / "report.json").write_text(json.dumps(report))
