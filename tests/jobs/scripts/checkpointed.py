"""Saves a checkpoint every step and resumes from the last one it finds."""

import argparse
import json
import os
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int)
parser.add_argument("--step-s", type=float)
args = parser.parse_args()

checkpoints = Path(os.environ["SM_CHECKPOINT_DIR"])
state = checkpoints / "state.json"
start = json.loads(state.read_text())["step"] + 1 if state.exists() else 0
print(f"resuming at step {start}", flush=True)
for step in range(start, args.steps):
    partial = checkpoints / "state.json.tmp"
    partial.write_text(json.dumps({"step": step}))
    partial.replace(state)  # a reader never sees half a checkpoint
    time.sleep(args.step_s)
result = {"resumed_at": start, "steps": args.steps}
(Path(os.environ["SM_MODEL_DIR"]) / "result.json").write_text(json.dumps(result))
