"""A processing script written for SageMaker: it hard-codes /opt/ml paths."""

import json
import os
import signal
import sys
import time
from pathlib import Path

inputs = Path("/opt/ml/processing/input/data")
out = Path("/opt/ml/processing/output/train")
args = sys.argv[1:]
if "--sleep" in args:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("sleeping", flush=True)
    time.sleep(float(args[args.index("--sleep") + 1]))
if "--fail" in args:
    Path("/opt/ml/output/message").write_text("gave up")
    print("something broke", file=sys.stderr, flush=True)
    sys.exit(3)
total = sum(int(x) for f in sorted(inputs.rglob("*.txt")) for x in f.read_text().split())
(out / "nested").mkdir(parents=True, exist_ok=True)
(out / "total.txt").write_text(str(total))
(out / "nested" / "env.json").write_text(json.dumps(dict(os.environ)))
config = json.loads(Path("/opt/ml/config/processingjobconfig.json").read_text())
(out / "name.txt").write_text(config["ProcessingJobName"])
Path("/opt/ml/output/message").write_text("done: " + str(total))
print("total", total, flush=True)
