"""Succeeds: records what it was given in the model, writes output data, logs on both pipes."""

import argparse
import json
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.add_argument("--lr", type=float)
parser.add_argument("--name")
args = parser.parse_args()

for epoch in range(args.epochs):
    print(f"training epoch {epoch}", flush=True)
print("a warning on stderr", file=sys.stderr, flush=True)

model_dir = Path(os.environ["SM_MODEL_DIR"])
config_dir = Path(os.environ["SM_INPUT_CONFIG_DIR"])
channel = Path(os.environ["SM_CHANNEL_DATA"])
seen = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("SM_", "TRAINING_JOB_", "K"))},
    "channel_files": sorted(
        p.relative_to(channel).as_posix() for p in channel.rglob("*") if p.is_file()
    ),
    "config": {p.name: json.loads(p.read_text()) for p in config_dir.glob("*.json")},
}
(model_dir / "seen.json").write_text(json.dumps(seen))
(model_dir / "weights").mkdir()
(model_dir / "weights" / "w.bin").write_bytes(b"\x00\x01")
(Path(os.environ["SM_OUTPUT_DATA_DIR"]) / "result.txt").write_text(f"lr={args.lr}")
