"""A script-mode job that counts to ``--steps``, one step per 0.2 s, checkpointing each
step and resuming from the last checkpoint when there is one.

Each checkpoint is written whole beside the checkpoint folder, then renamed into it: the
runner syncs that folder while the script runs, and must never catch a half-written file.
"""

import argparse
import json
import os
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

checkpoints = Path(os.environ["SM_CHECKPOINT_DIR"])
ckpt = checkpoints / "step.txt"
start = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"starting at step {start}", flush=True)
for step in range(start, args.steps):
    time.sleep(0.2)
    partial = checkpoints.parent / ".step.txt.partial"
    partial.write_text(str(step + 1))
    partial.rename(ckpt)
    print(f"step {step + 1}", flush=True)
Path(os.environ["SM_MODEL_DIR"], "result.json").write_text(json.dumps({"resumed_from": start}))
