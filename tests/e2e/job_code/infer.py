"""A script-mode job for the tests; ``--mode`` picks what it does.

ok     sums the numbers in every file of the ``data`` channel into model/result.json
fail   writes SageMaker's failure file and exits 1
crash  raises, leaving a traceback on stderr
sleep  sleeps ``--seconds``; on SIGTERM saves model/stopped.json and exits 0
steps  counts to ``--steps`` one step per 0.2 s, checkpointing each step, resuming
       from the last checkpoint when there is one
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="ok")
parser.add_argument("--seconds", type=float, default=30)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

model_dir = Path(os.environ["SM_MODEL_DIR"])
output_dir = Path(os.environ["SM_OUTPUT_DATA_DIR"])
print(f"mode {args.mode} hps {os.environ.get('SM_HPS')}", flush=True)

if args.mode == "ok":
    data = Path(os.environ["SM_CHANNEL_DATA"])
    files = [f for f in sorted(data.rglob("*")) if f.is_file()]
    total = sum(float(x) for f in files for x in f.read_text().split())
    (model_dir / "result.json").write_text(json.dumps({"total": total}))
    (output_dir / "summary.txt").write_text(f"total {total}\n")
    print(f"total {total}", flush=True)
elif args.mode == "env":
    print("ENV " + json.dumps(dict(os.environ)), flush=True)
elif args.mode == "fail":
    Path(os.environ["SM_OUTPUT_DIR"], "failure").write_text("bad input: the data channel is empty")
    sys.exit(1)
elif args.mode == "crash":
    raise RuntimeError("the model exploded")
elif args.mode == "sleep":

    def _stop(signum, frame):
        (model_dir / "stopped.json").write_text(json.dumps({"stopped": True}))
        print("saved on SIGTERM", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    print("sleeping", flush=True)
    time.sleep(args.seconds)
    (model_dir / "slept.json").write_text("{}")
elif args.mode == "steps":
    ckpt = Path(os.environ["SM_CHECKPOINT_DIR"]) / "step.txt"
    start = int(ckpt.read_text()) if ckpt.exists() else 0
    print(f"starting at step {start}", flush=True)
    for step in range(start, args.steps):
        time.sleep(0.2)
        ckpt.write_text(str(step + 1))
        print(f"step {step + 1}", flush=True)
    (model_dir / "result.json").write_text(json.dumps({"resumed_from": start}))
